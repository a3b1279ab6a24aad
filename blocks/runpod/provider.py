"""``RunPodProvider``: rent, find and terminate RunPod pods through ``RunPodApi``.

Fills in the ``PodProvider`` protocol (``blocks/provider.py``, docs/architecture.md#pod-providers)
over the one RunPod client interface (``runpod.api``): REST v2 or the GraphQL fallback,
per ``RunPodCredentials.api``; nothing here depends on which one answers.

- ``create`` (``runpod.placement``) validates everything first (``SpecError``, no request
  sent), adopts a live pod of the same name (a retried task never rents a second one),
  checks the GPU ids against RunPod's catalog and their prices, checks the account's SSH
  keys, then walks the spec's GPU types × clouds × data centres in order; a create whose
  answer was lost is resolved by reading, never by creating again. It returns as soon as
  the pod id exists. A stopped (EXITED) pod of the run's name is terminated and replaced,
  never adopted.
- ``wait_ready`` reads the pod by id until it is RUNNING with a runtime, then until the
  SSH endpoints answer a key exchange; on timeout it terminates the pod.
- ``status`` maps one read of the pod to a ``PodCause`` (``lifecycle.status_from_pod``).
- ``terminate`` is idempotent and returns only when RunPod reads the pod back as gone.

Every create attempt is recorded in ``attempts`` (``"<gpu>/<cloud>: capacity"``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar

from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from prefect_runpod.blocks.exceptions import (
    ConsoleConnectError,
    PodTimeoutError,
    RunPodAPIError,
    RunPodFlowError,
    SpecError,
    TerminateError,
)
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.provider import (
    LIFETIME_ENV,
    PodCause,
    PodStatus,
    TerminateResult,
    lost_error,
)
from prefect_runpod.blocks.runpod.account_keys import ensure_account_key
from prefect_runpod.blocks.runpod.api import PodRecord, RunPodApi
from prefect_runpod.blocks.runpod.blocks import (
    RunPodCredentials,
    RunPodPodSpec,
    validate_pod_id,
    validate_pod_name,
)
from prefect_runpod.blocks.runpod.capabilities import RunPodCapabilities
from prefect_runpod.blocks.runpod.errors import (
    FailoverAction,
    classify_exception,
    to_provider_error,
)
from prefect_runpod.blocks.runpod.lifecycle import (
    GONE_STATUSES,
    boot_diagnosis,
    direct_endpoint,
    probe_ssh_host_key,
    status_from_pod,
    terminate_until_gone,
)
from prefect_runpod.blocks.runpod.placement import PodPlacement, Retry
from prefect_runpod.blocks.runpod.poller import poller_for
from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey
from prefect_runpod.blocks.validation.parameters import DEFAULT_TERMINATE_TIMEOUT_SECONDS

__all__ = ["RunPodProvider"]

logger = logging.getLogger("prefect_runpod.runpod")
T = TypeVar("T")


def _decided(exc: BaseException) -> bool:
    """True for our own errors, already mapped (a ``RunPodAPIError`` is RunPod's answer
    as it came: still to be classified)."""
    return isinstance(exc, RunPodFlowError) and not isinstance(exc, RunPodAPIError)


def _worth_retrying(exc: BaseException) -> bool:
    if isinstance(exc, Retry):
        return True
    if _decided(exc):
        return False
    return classify_exception(exc).action in (FailoverAction.RETRY, FailoverAction.RESOLVE)


class RunPodProvider(RunPodCapabilities, PodPlacement):
    """Pods on RunPod through ``RunPodApi`` (REST v2 or GraphQL); see the module docstring.

    Args:
        credentials: the API key block (also says which API: ``api``).
        spec: the pod spec block (GPU types to fall back over, image, disks, …).
        ssh_key: the SSH key block (public key, gateway host/port, pinned host key).
        retry_initial_delay_seconds: first backoff after a transient error (doubles).
        retry_max_attempts: tries per call on transient errors (≥ 1).
        retry_deadline_seconds: the longest one call keeps retrying, s.
        poll_interval_seconds: how often waits read the pod back.
        create_resolve_seconds: how long a create whose answer was lost waits for its
            pod to appear in the list (RunPod lists a new pod with a delay), s.
        sleep: the sleep function (tests may pass a fast one).
        api: the RunPod client; ``credentials.get_api()`` by default.
    """

    def __init__(
        self,
        credentials: RunPodCredentials,
        spec: RunPodPodSpec,
        ssh_key: RunPodSSHKey,
        *,
        retry_initial_delay_seconds: float = 1.0,
        retry_max_attempts: int = 4,
        retry_deadline_seconds: float = 300.0,
        poll_interval_seconds: float = 5.0,
        create_resolve_seconds: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
        api: RunPodApi | None = None,
    ) -> None:
        if retry_max_attempts < 1 or retry_initial_delay_seconds < 0:
            raise SpecError("retry_max_attempts must be ≥ 1 and the delay ≥ 0")
        self.credentials = credentials
        self.spec = spec
        self.ssh_key = ssh_key
        self.retry_initial_delay_seconds = retry_initial_delay_seconds
        self.retry_max_attempts = retry_max_attempts
        self.retry_deadline_seconds = retry_deadline_seconds
        self.poll_interval_seconds = poll_interval_seconds
        self.create_resolve_seconds = create_resolve_seconds
        self._sleep = sleep
        self._api = api or credentials.get_api()
        self.attempts: list[str] = []
        self._ended: dict[str, TerminateResult] = {}

    @property
    def api_name(self) -> str:
        """Which RunPod API answers this provider's pod calls (``v2``, ``graphql``)."""
        return self._api.name

    @property
    def api(self) -> RunPodApi:
        """The RunPod client this provider holds (one connection pool for the run)."""
        return self._api

    # -- plumbing ---------------------------------------------------------------------

    def _retrying(self) -> Retrying:
        return Retrying(
            stop=stop_after_attempt(self.retry_max_attempts)
            | stop_after_delay(self.retry_deadline_seconds),
            wait=wait_exponential(multiplier=self.retry_initial_delay_seconds, max=30.0),
            retry=retry_if_exception(_worth_retrying),
            sleep=self._sleep,
            reraise=True,
        )

    def _call(self, what: str, fn: Callable[..., T], *args: Any, pod_id: str | None = None) -> T:
        """One API call, retried on transient errors, other errors mapped to ours."""
        try:
            return self._retrying()(fn, *args)
        except Exception as exc:
            if _decided(exc):
                raise
            raise to_provider_error(classify_exception(exc), what=what, pod_id=pod_id) from exc

    def ensure_account_key(self) -> bool:
        """Make sure the account's SSH keys hold ours (keys reach only pods created
        afterwards, so this runs before every create); adds it, keeping everyone else's,
        when the key block allows (``account_keys.ensure_account_key``).

        Returns:
            True: the account holds our key (already, or added now and read back).

        Raises:
            SpecError: the key is missing and ``add_to_account`` is False (next step in
                the message), or RunPod did not keep it.
            AccountKeysError: a write would have dropped someone's key (never sent).
            ProviderAuthError / ProviderTransientError: as for any call.
        """
        added = self._call(
            "check the account's SSH keys",
            lambda: ensure_account_key(
                self._api,
                self.ssh_key.get_public_key(),
                add=self.ssh_key.add_to_account,
                where=self.ssh_key.gateway_host,
            ),
        )
        if added:
            self.attempts.append("account SSH key added")
        return True

    # -- read -------------------------------------------------------------------------

    def _gateway(self, pod: PodRecord) -> SSHEndpoint | None:
        """The gateway endpoint of a pod: its ``ssh.proxy`` login used as given, at the
        host/port RunPod says (else the key block's), with the block's pinned key."""
        if pod.proxy is None:
            return None
        endpoint = self.ssh_key.gateway_endpoint(pod.proxy.username)
        endpoint.host = pod.proxy.host or endpoint.host
        endpoint.port = pod.proxy.port or endpoint.port
        return endpoint

    def _handle(
        self,
        pod: PodRecord,
        *,
        gpu_type: str | None = None,
        price: float | None = None,
        lifetime: float | None = None,
    ) -> PodHandle:
        if lifetime is None:
            try:
                lifetime = float(pod.env[LIFETIME_ENV])
            except (KeyError, ValueError):
                lifetime = None
        uptime = pod.uptime_seconds or 0.0
        return PodHandle(
            pod_id=pod.id,
            name=pod.name,
            provider="runpod",
            gpu_type=gpu_type or pod.gpu_display_name or pod.gpu_type_id or "unknown",
            gpu_count=pod.gpu_count or self.spec.gpu_count,
            cost_per_hr=price if price is not None else pod.cost_per_hr,
            created_at=pod.created_at or datetime.now(UTC) - timedelta(seconds=uptime),
            ssh=self._gateway(pod),
            direct_ssh=direct_endpoint(pod),
            pod_host_id=pod.proxy.username if pod.proxy else None,
            workdir=pod.workdir or self.spec.volume_mount_path,
            lifetime_seconds=lifetime,
        )

    def find(self, name: str) -> PodHandle | None:
        """The live pod named exactly ``name`` (with its gateway login), or None.

        Raises:
            SpecError: on an unsafe name. ProviderError subclasses from the API.
        """
        pod = self._find_record(name)
        return self._handle(pod) if pod is not None else None

    def _find_record(self, name: str) -> PodRecord | None:
        """The account's pod named exactly ``name`` that is not TERMINATED, or None."""
        validate_pod_name(name)
        pods = self._call("list pods", self._api.list_pods)
        live = [p for p in pods if p.name == name and p.status not in GONE_STATUSES]
        return live[0] if live else None

    def list(self, prefix: str) -> list[PodHandle]:
        """Live pods whose name starts with ``prefix`` (one list call)."""
        pods = self._call("list pods", self._api.list_pods)
        return [
            self._handle(p)
            for p in pods
            if p.name.startswith(prefix) and p.status not in GONE_STATUSES
        ]

    # -- wait -------------------------------------------------------------------------

    def wait_ready(self, handle: PodHandle, timeout_seconds: float = 1200.0) -> PodHandle:
        """Wait until the pod runs and its SSH endpoints answer.

        RunPod reports no runtime until the container is up (image pulls can take many
        minutes), so this reads the pod by id; then an SSH key exchange on the gateway
        (the pod's ``ssh.proxy`` login) and, when RunPod reports direct SSH (22/tcp on a
        public port), on that too. Host keys: the gateway's pinned key (else the one seen
        now, recorded on first use); the direct endpoint's recorded on first use.

        Returns:
            A copy of ``handle`` with ``ssh``/``direct_ssh``, ``cost_per_hr`` and
            ``workdir`` filled in.

        Raises:
            PodTimeoutError: not ready within ``timeout_seconds``; the pod was terminated.
                The message names what its ``system`` log says went wrong (an image that
                could not be pulled, SSH that never started: ``lifecycle.boot_diagnosis``).
            PodGoneError: the pod vanished, stopped or lost its host while starting; it
                was terminated (one sentence: what RunPod said).
            ConsoleConnectError: the gateway's host key differs from the pinned one.
            TerminateError: the pod could not be terminated after one of the above.
        """
        handle = handle.model_copy(deep=True)
        start = time.monotonic()
        deadline = start + timeout_seconds
        while True:
            pod = self._call("read pod", self._api.get_pod, handle.pod_id, pod_id=handle.pod_id)
            seen = status_from_pod(handle.pod_id, pod)
            if seen.gone:  # terminated outside, exited or lost while starting: one sentence
                why = boot_diagnosis(self._api, handle.pod_id)
                if why is not None:
                    seen = seen.model_copy(
                        update={"provider_status": f"{seen.provider_status}; {why}"}
                    )
                self._abort(handle, lost_error(seen))
            assert pod is not None
            last = pod.said()
            if pod.status == "RUNNING" and pod.runtime_up:
                if self._endpoints_answer(handle, pod, max(1.0, deadline - time.monotonic())):
                    return handle
                last += " ssh=not answering"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                why = boot_diagnosis(self._api, handle.pod_id)
                advice = why or "raise the ready timeout for large images, or pick another GPU type"
                self._abort(
                    handle,
                    PodTimeoutError(
                        f"pod {handle.pod_id} ({handle.name}) not ready after {timeout_seconds:.0f} s "
                        f"({last}); {advice}. It was terminated.",
                        pod_id=handle.pod_id,
                        last_status=last,
                        elapsed_seconds=time.monotonic() - start,
                    ),
                )
            self._sleep(min(self.poll_interval_seconds, remaining))

    def _abort(self, handle: PodHandle, exc: Exception) -> NoReturn:
        """Terminate the pod (confirmed), then raise ``exc``; a failed terminate wins."""
        try:
            self.terminate(handle.pod_id)
        except TerminateError as term_exc:
            raise term_exc from exc
        raise exc

    def _endpoints_answer(self, handle: PodHandle, pod: PodRecord, budget: float) -> bool:
        if pod.cost_per_hr:
            handle.cost_per_hr = pod.cost_per_hr
        handle.workdir = pod.workdir or handle.workdir
        gateway = self._gateway(pod)
        if gateway is not None:
            handle.pod_host_id = gateway.user
            if handle.ssh is None or handle.ssh.user != gateway.user:
                handle.ssh = gateway
        direct = direct_endpoint(pod)
        probe_seconds = min(10.0, budget)
        if direct is not None:
            key = probe_ssh_host_key(direct.host, direct.port, probe_seconds)
            if key is None:
                return False
            direct.host_key = (
                handle.direct_ssh.host_key
                if handle.direct_ssh and handle.direct_ssh.host_key
                else key
            )
            handle.direct_ssh = direct
        if handle.ssh is None:
            return False
        key = probe_ssh_host_key(handle.ssh.host, handle.ssh.port, probe_seconds)
        if key is None:
            return False
        pinned = self.ssh_key.gateway_host_key
        if pinned and pinned.split()[:2] != key.split()[:2]:
            raise ConsoleConnectError(
                f"pod {handle.pod_id}: the gateway {handle.ssh.host}:{handle.ssh.port} "
                f"offered host key {key.split()[0]} …{key.split()[1][-12:]}, not the pinned "
                "one; refusing. If RunPod rotated its key, update gateway_host_key on the "
                "RunPodSSHKey block.",
                pod_id=handle.pod_id,
            )
        # pinned key from the block, or the key seen now recorded on first use
        handle.ssh.host_key = pinned or key
        return True

    # -- status -----------------------------------------------------------------------

    def status(self, pod_id: str) -> PodStatus:
        """What RunPod says about ``pod_id`` now (one read by id, no retries), mapped by
        ``lifecycle.status_from_pod``: not known/TERMINATED → ``terminated_outside``,
        EXITED → ``exited``, ERROR → ``host_lost``. RunPod forgets a terminated pod, so
        ``ended_at`` stays None (its billing records hold the end).

        Returns:
            The ``PodStatus``; ``unknown`` when RunPod could not be asked.

        Raises:
            SpecError: on an unsafe pod id.
        """
        validate_pod_id(pod_id)
        try:
            pod = self._api.get_pod(pod_id)
        except Exception as exc:
            classified = classify_exception(exc)
            if classified.action is not FailoverAction.GONE:
                return PodStatus(
                    pod_id=pod_id,
                    cause=PodCause.UNKNOWN,
                    provider_status=f"RunPod did not answer: {classified.message}",
                )
            pod = None
        return status_from_pod(pod_id, pod)

    def shared_status(self, pod_id: str, max_age_seconds: float) -> PodStatus:
        """What the account's pod list, read at most once per ``max_age_seconds`` for every
        pod watched in this process (``poller.poller_for``), says about ``pod_id``: what
        ``PodWatch`` asks, so ten watched pods cost one ``GET /v2/pods`` per interval, not
        ten. Never raises (``unknown`` when RunPod cannot be asked)."""
        return poller_for(self._api).status(validate_pod_id(pod_id), max_age_seconds)

    # -- terminate --------------------------------------------------------------------

    def terminate(
        self, pod_id: str, timeout_seconds: float = DEFAULT_TERMINATE_TIMEOUT_SECONDS
    ) -> TerminateResult:
        """Terminate ``pod_id`` and return once RunPod reads it back as gone; see
        ``runpod.lifecycle.terminate_until_gone`` (idempotent, never gone on a timeout).

        A pod this provider has already ended (``wait_ready`` ends a pod that fails to
        boot before it raises) answers that first confirmed end again, so the run bills
        it until then and not until a later caller's "already gone".

        Raises:
            SpecError: on an unsafe pod id.
            TerminateError: not confirmed within ``timeout_seconds``.
        """
        pod_id = validate_pod_id(pod_id)
        if pod_id in self._ended:
            return self._ended[pod_id]
        result = terminate_until_gone(
            self._api,
            pod_id,
            timeout_seconds=timeout_seconds,
            initial_delay_seconds=self.retry_initial_delay_seconds,
            poll_interval_seconds=self.poll_interval_seconds,
            sleep=self._sleep,
        )
        if not result.already_gone:
            self._ended[pod_id] = result
        return result
