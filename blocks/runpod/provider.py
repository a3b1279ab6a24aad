"""``RunPodProvider``: rent, find and terminate RunPod pods through the ``runpod`` SDK.

Fills in the ``PodProvider`` protocol (``blocks/provider.py``, docs/architecture.md#pod-providers):

- ``create`` validates everything first (``SpecError``, no request sent), adopts a live
  pod of the same name (a retried task never rents a second one), checks the GPU ids
  and prices, checks the account's SSH keys, then walks the spec's GPU types × data
  centers in order, keyed on RunPod's exact answers (``runpod.errors``): capacity → next
  option, ``Something went wrong``/5xx/network → backoff (tenacity) after re-checking
  for a pod of that name, 401 → stop. It returns as soon as the pod id exists.
- Each create carries RunPod's ``terminateAfter`` (create + the dead-man lifetime), a
  lease on RunPod's side that ends the pod even when the flow and its watchdog both
  die; only when RunPod answers that the field is not defined on
  ``PodFindAndDeployOnDemandInput`` is the create sent again without it (the layer is
  then recorded absent). A stopped (EXITED) pod of the run's name is terminated and
  replaced, never adopted.
- ``wait_ready`` polls until ``desiredStatus == RUNNING`` with a ``runtime``, then until
  the SSH endpoint answers a key exchange; on timeout it terminates the pod.
- ``status`` maps one read of the pod to a ``PodCause`` (``lifecycle.status_from_pod``).
- ``terminate`` is idempotent and returns only when RunPod reads the pod back as gone
  (``pod: null``, TERMINATED, or ``pod not found``), never on a timeout.

Every create attempt is recorded in ``attempts`` (``"<gpu>/<cloud>: capacity"``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from prefect_runpod.blocks.exceptions import (
    CapacityError,
    ConsoleConnectError,
    PodTimeoutError,
    SpecError,
    TerminateError,
)
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import (
    LIFETIME_ENV,
    PodCause,
    PodRequest,
    PodStatus,
    TerminateResult,
    lost_error,
)
from prefect_runpod.blocks.runpod.blocks import (
    RunPodCredentials,
    RunPodPodSpec,
    merge_cuda_versions,
    validate_env,
    validate_gpu_type_id,
    validate_pod_id,
    validate_pod_name,
)
from prefect_runpod.blocks.runpod.client import graphql_escape
from prefect_runpod.blocks.runpod.errors import (
    ErrorKind,
    FailoverAction,
    classify_exception,
    to_provider_error,
    undefined_input_field,
)
from prefect_runpod.blocks.runpod.lifecycle import (
    GONE_STATUSES,
    direct_endpoint,
    probe_ssh_host_key,
    status_from_pod,
    terminate_until_gone,
)
from prefect_runpod.blocks.runpod.ssh_key import (
    RunPodSSHKey,
    key_in_authorized,
    normalise_public_key,
)
from prefect_runpod.blocks.validation import utc_timestamp

__all__ = ["RunPodProvider"]

logger = logging.getLogger("prefect_runpod.runpod")
T = TypeVar("T")

_LEASE_FIELD = ("terminateAfter", "PodFindAndDeployOnDemandInput")
"""RunPod's answer naming this field and type is the one that drops the lease."""


class _Retry(Exception):
    """Internal: a create attempt failed in a way worth repeating after a backoff."""

    def __init__(self, classified: Any) -> None:
        super().__init__(classified.message)
        self.classified = classified


class RunPodProvider:
    """Pods on RunPod through the ``runpod`` SDK (GraphQL); see the module docstring.

    Args:
        credentials: the API key block.
        spec: the pod spec block (GPU types to fall back over, image, disks, …).
        ssh_key: the SSH key block (public key, gateway host/port, pinned host key).
        retry_initial_delay_seconds: first backoff after a transient error (doubles).
        retry_max_attempts: tries per call on transient errors (≥ 1).
        poll_interval_seconds: how often waits read the pod back.
        sleep: the sleep function (tests may pass a fast one).
    """

    provider_name = "runpod"

    def __init__(
        self,
        credentials: RunPodCredentials,
        spec: RunPodPodSpec,
        ssh_key: RunPodSSHKey,
        *,
        retry_initial_delay_seconds: float = 1.0,
        retry_max_attempts: int = 4,
        poll_interval_seconds: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if retry_max_attempts < 1 or retry_initial_delay_seconds < 0:
            raise SpecError("retry_max_attempts must be ≥ 1 and the delay ≥ 0")
        self.credentials = credentials
        self.spec = spec
        self.ssh_key = ssh_key
        self.retry_initial_delay_seconds = retry_initial_delay_seconds
        self.retry_max_attempts = retry_max_attempts
        self.poll_interval_seconds = poll_interval_seconds
        self._sleep = sleep
        self._client = credentials.get_client()
        self.attempts: list[str] = []
        self.lease_supported = True
        """False once RunPod answered that ``terminateAfter`` is not defined: later
        creates go without it, and the handles record the layer as absent."""

    # -- plumbing ---------------------------------------------------------------------

    def _retrying(self) -> Retrying:
        return Retrying(
            stop=stop_after_attempt(self.retry_max_attempts),
            wait=wait_exponential(multiplier=self.retry_initial_delay_seconds, max=30.0),
            retry=retry_if_exception(
                lambda e: (
                    isinstance(e, _Retry) or classify_exception(e).action is FailoverAction.RETRY
                )
            ),
            sleep=self._sleep,
            reraise=True,
        )

    def _call(self, what: str, fn: Callable[..., T], *args: Any, pod_id: str | None = None) -> T:
        """One SDK call, retried on transient errors, other errors mapped to ours."""
        try:
            return self._retrying()(fn, *args)
        except Exception as exc:
            raise to_provider_error(classify_exception(exc), what=what, pod_id=pod_id) from exc

    # -- create -----------------------------------------------------------------------

    def _deploy_fields(self, request: PodRequest, name: str) -> dict[str, Any]:
        """The validated, escaped keyword arguments of the SDK's deploy mutation."""
        spec = self.spec
        validate_pod_name(name)
        public_key = normalise_public_key(request.public_key or self.ssh_key.get_public_key())
        env = {**spec.env, **request.env, "PUBLIC_KEY": public_key}
        if request.deadman is not None:
            env[LIFETIME_ENV] = f"{request.deadman.lifetime_seconds:g}"
        validate_env(env)
        cuda = merge_cuda_versions(spec.allowed_cuda_versions, request.allowed_cuda_versions)
        for gpu in spec.gpu_type_ids:
            validate_gpu_type_id(gpu)
        return {
            "name": name,
            "image_name": spec.image_name,
            "cloud_type": spec.cloud_type,
            "support_public_ip": spec.support_public_ip,
            "start_ssh": True,
            "gpu_count": spec.gpu_count,
            "volume_in_gb": spec.volume_gb,
            "container_disk_in_gb": spec.container_disk_gb,
            "min_vcpu_count": 1,
            "min_memory_in_gb": 1,
            "docker_args": "",
            "ports": spec.ports,
            "volume_mount_path": spec.volume_mount_path,
            "env": {k: graphql_escape(v) for k, v in env.items()},
            "allowed_cuda_versions": cuda or None,
        }

    def _price(self, gpu: dict[str, Any]) -> float | None:
        cloud = self.spec.cloud_type
        if cloud == "SECURE":
            price = gpu.get("securePrice")
        elif cloud == "COMMUNITY":
            price = gpu.get("communityPrice")
        else:
            price = (gpu.get("lowestPrice") or {}).get("uninterruptablePrice")
        return None if price is None else float(price) * self.spec.gpu_count

    def gpu_prices(self) -> dict[str, float | None]:
        """The spec's GPU types in failover order, each with its price in USD/h for the
        spec's cloud type and GPU count (the SDK's ``get_gpu``: ``securePrice``,
        ``communityPrice``, else ``lowestPrice { uninterruptablePrice }``; never a bid
        price), None when RunPod gives none.

        Raises:
            SpecError: an unknown GPU type id.
            ProviderAuthError / ProviderTransientError: as for any call.
        """
        return self._gpu_prices()

    def _gpu_prices(self) -> dict[str, float | None]:
        """Price per GPU type (USD/h) via the SDK's ``get_gpu``; unknown id → SpecError."""
        prices: dict[str, float | None] = {}
        for gpu_id in self.spec.gpu_type_ids:
            try:
                gpu = self._retrying()(self._client.get_gpu, gpu_id, self.spec.gpu_count)
            except Exception as exc:
                classified = classify_exception(exc)
                if classified.kind is ErrorKind.UNKNOWN_GPU:
                    raise SpecError(
                        f"unknown GPU type id {gpu_id!r} (RunPod: {classified.message}); "
                        "fix the pod spec's gpu_type_ids — nothing was created"
                    ) from exc
                raise to_provider_error(classified, what=f"look up GPU {gpu_id}") from exc
            prices[gpu_id] = self._price(gpu)
        return prices

    def create(self, request: PodRequest, name: str) -> PodHandle:
        """Rent a pod named ``name`` (or adopt the live one of that name).

        Args:
            request: the run's public key, extra env and CUDA floor.
            name: ``<prefix>-<flow_run_id>``.

        Returns:
            The handle as soon as the pod id exists (not yet ready).

        Raises:
            SpecError: bad name/env/GPU id/CUDA list (before any request), or an unknown
                GPU id, or the account lacks our SSH key and may not add it.
            ProviderAuthError: the API key was refused (HTTP 401); nothing created.
            CapacityError: no GPU type/data center had capacity within the price cap.
            ProviderTransientError: RunPod kept failing after the retries.
        """
        fields = self._deploy_fields(request, name)
        lifetime = request.deadman.lifetime_seconds if request.deadman is not None else None
        adopted = self._adopt_or_replace(name)
        if adopted is not None:
            return adopted
        prices = self._gpu_prices()
        self.ensure_account_key()
        cloud = self.spec.cloud_type
        for gpu_id in self.spec.gpu_type_ids:
            price = prices.get(gpu_id)
            cap = self.spec.max_usd_per_hour
            if cap is not None and price is not None and price > cap:
                self.attempts.append(f"{gpu_id}/{cloud}: over price {price:.3f} > {cap:.3f} USD/h")
                continue
            data_centers: list[str | None] = list(self.spec.data_center_ids) or [None]
            for dc in data_centers:
                label = f"{gpu_id}/{cloud}" + (f"/{dc}" if dc else "")
                handle = self._deploy_option(fields, gpu_id, dc, label, price, lifetime)
                if handle is not None:
                    return handle
        raise CapacityError(
            f"create pod {name}: no capacity on any option ({'; '.join(self.attempts)}). "
            "Add GPU types, data centers or cloud ALL to the pod spec, raise max_usd_per_hour, "
            "or try again later. Nothing is billing.",
            attempts=self.attempts,
        )

    def _adopt_or_replace(self, name: str) -> PodHandle | None:
        """The live pod named ``name`` to adopt (a retried task never rents twice), or
        None. A pod of that name that stopped (EXITED) or lost its host is terminated
        (confirmed) and None returned, so the same attempt creates a fresh pod."""
        pod = self._find_pod(name)
        if pod is None:
            return None
        status = status_from_pod(pod["id"], pod)
        if status.cause in (PodCause.EXITED, PodCause.HOST_LOST):
            self.terminate(pod["id"])
            self.attempts.append(f"replaced {pod['id']} ({status.provider_status}): terminated")
            logger.info(
                "%s: %s; terminated, creating a fresh pod", pod["id"], status.provider_status
            )
            return None
        adopted = self._with_host_id(self._handle_from_pod(pod))
        self.attempts.append(f"adopted {adopted.pod_id} ({name})")
        logger.info("%s: adopted existing pod %s", adopted.pod_id, name)
        return adopted

    def _deploy_option(
        self,
        fields: dict[str, Any],
        gpu_id: str,
        dc: str | None,
        label: str,
        price: float | None,
        lifetime_seconds: float | None = None,
    ) -> PodHandle | None:
        """Deploy on one GPU type/data center; None means "no capacity, next option"."""
        name = fields["name"]
        state = {"tries": 0, "recreate": False}

        def once() -> PodHandle | None:
            state["tries"] += 1
            if state["tries"] > 1:
                existing = self.find(name)  # the failed call may have created it anyway
                if existing is not None and not state["recreate"]:
                    self.attempts.append(f"{label}: adopted {existing.pod_id} after retry")
                    return existing
                if existing is not None:
                    self.terminate(existing.pod_id)
            lease = None
            if lifetime_seconds is not None and self.lease_supported:
                lease = datetime.now(UTC) + timedelta(seconds=lifetime_seconds)
            try:
                created = self._client.deploy_on_demand(
                    **fields,
                    gpu_type_id=gpu_id,
                    data_center_id=dc,
                    terminate_after=utc_timestamp(lease) if lease else None,
                )
            except Exception as exc:
                classified = classify_exception(exc)
                if lease is not None and undefined_input_field(classified.message) == _LEASE_FIELD:
                    # Only this answer drops the lease: RunPod does not know the field.
                    self.lease_supported = False
                    self.attempts.append(
                        f"{label}: terminateAfter not accepted by RunPod ({classified.message}); "
                        "creating without it: the server-side lease layer is absent"
                    )
                    logger.warning("create %s: %s", name, self.attempts[-1])
                    return once()
                self.attempts.append(f"{label}: {classified.kind.value}")
                logger.info("create %s on %s: %s", name, label, classified.message)
                if classified.action is FailoverAction.NEXT_OPTION:
                    return None
                if classified.action in (FailoverAction.RETRY, FailoverAction.RECREATE):
                    state["recreate"] = classified.action is FailoverAction.RECREATE
                    raise _Retry(classified) from exc
                raise to_provider_error(
                    classified, what=f"create pod {name}", attempts=self.attempts
                ) from exc
            pod_id = created["id"]
            host_id = (created.get("machine") or {}).get("podHostId")
            lease_note = f", terminateAfter {utc_timestamp(lease)}" if lease else ""
            if lease is None and lifetime_seconds is not None:
                lease_note = ", no server-side lease (terminateAfter not accepted)"
            self.attempts.append(f"{label}: created {pod_id}{lease_note}")
            logger.info("%s: created %s on %s%s", pod_id, name, label, lease_note)
            return PodHandle(
                pod_id=pod_id,
                name=name,
                provider="runpod",
                gpu_type=gpu_id,
                cost_per_hr=price or 0.0,
                ssh=self.ssh_key.gateway_endpoint(host_id) if host_id else None,
                pod_host_id=host_id,
                workdir=self.spec.volume_mount_path,
                lifetime_seconds=lifetime_seconds,
                terminate_after=lease,
            )

        try:
            return self._retrying()(once)
        except _Retry as exc:
            if exc.classified.action is FailoverAction.RECREATE:
                return None
            raise to_provider_error(
                exc.classified, what=f"create pod {name}", attempts=self.attempts
            ) from exc

    def ensure_account_key(self) -> bool:
        """Make sure the account's SSH keys (``myself { pubKey }``) hold ours, which the
        gateway needs. Adds it (keeping the others) when the key block allows.

        Returns:
            True: the account holds our key (already, or added now and read back).

        Raises:
            SpecError: the key is missing and ``add_to_account`` is False (next step in
                the message), or RunPod did not keep it.
            ProviderAuthError / ProviderTransientError: as for any call.
        """
        ours = self.ssh_key.get_public_key()
        user = self._call("read account SSH keys", self._client.get_user)
        if key_in_authorized(ours, user.get("pubKey")):
            return True
        if not self.ssh_key.add_to_account:
            raise SpecError(
                "the RunPod account's SSH keys do not hold this run's public key, so the "
                f"gateway {self.ssh_key.gateway_host} would refuse it. Add it in the RunPod "
                "console → Settings → SSH Public Keys, or set add_to_account=True on the "
                "RunPodSSHKey block. Nothing was created."
            )
        try:
            self.ssh_key.register_with_account(self.credentials)
        except SpecError:
            raise
        except Exception as exc:
            raise to_provider_error(classify_exception(exc), what="add account SSH key") from exc
        self.attempts.append("account SSH key added")
        return True

    # -- read -------------------------------------------------------------------------

    def _handle_from_pod(self, pod: dict[str, Any]) -> PodHandle:
        uptime = pod.get("uptimeSeconds") or 0
        env = dict(str(e).partition("=")[::2] for e in pod.get("env") or [] if "=" in str(e))
        try:
            lifetime: float | None = float(env[LIFETIME_ENV])
        except (KeyError, ValueError):
            lifetime = None
        return PodHandle(
            lifetime_seconds=lifetime,
            pod_id=pod["id"],
            name=pod.get("name") or "",
            provider="runpod",
            gpu_type=((pod.get("machine") or {}).get("gpuDisplayName")) or "unknown",
            cost_per_hr=float(pod.get("costPerHr") or 0.0),
            created_at=datetime.now(UTC) - timedelta(seconds=float(uptime)),
            direct_ssh=direct_endpoint(pod),
            workdir=pod.get("volumeMountPath") or "/workspace",
        )

    def find(self, name: str) -> PodHandle | None:
        """The live pod named exactly ``name`` (with its ``podHostId``), or None.

        Raises:
            SpecError: on an unsafe name. ProviderError subclasses from the API.
        """
        pod = self._find_pod(name)
        return self._with_host_id(self._handle_from_pod(pod)) if pod is not None else None

    def _find_pod(self, name: str) -> dict[str, Any] | None:
        """The account's pod named exactly ``name`` that is not TERMINATED, as RunPod
        answers it, or None."""
        validate_pod_name(name)
        pods = self._call("list pods", self._client.get_pods)
        live = [
            p for p in pods if p.get("name") == name and p.get("desiredStatus") not in GONE_STATUSES
        ]
        return live[0] if live else None

    def _with_host_id(self, handle: PodHandle) -> PodHandle:
        """``handle`` with its ``podHostId`` and gateway endpoint (one more query: the
        SDK's pod fields do not include it)."""
        host_id = self._call(
            "read podHostId", self._client.get_pod_host_id, handle.pod_id, pod_id=handle.pod_id
        )
        if host_id:
            handle.pod_host_id = host_id
            handle.ssh = self.ssh_key.gateway_endpoint(host_id)
        return handle

    def list(self, prefix: str) -> list[PodHandle]:
        """Live pods whose name starts with ``prefix`` (no ``podHostId``: one call)."""
        pods = self._call("list pods", self._client.get_pods)
        return [
            self._handle_from_pod(p)
            for p in pods
            if (p.get("name") or "").startswith(prefix)
            and p.get("desiredStatus") not in GONE_STATUSES
        ]

    # -- wait -------------------------------------------------------------------------

    def wait_ready(self, handle: PodHandle, timeout_seconds: float = 1200.0) -> PodHandle:
        """Wait until the pod runs and its SSH endpoint answers.

        RunPod answers ``runtime: null`` until the container is up (image pulls can take
        many minutes), so this polls ``get_pod``; then an SSH key exchange on the gateway
        (user ``podHostId``) and, when ``runtime.ports`` has 22/tcp on a public IP, on the
        direct endpoint. Host keys: the gateway's pinned key (else the one seen now,
        recorded on first use); the direct endpoint's recorded on first use.

        Returns:
            A copy of ``handle`` with ``ssh``/``direct_ssh``, ``cost_per_hr`` and
            ``workdir`` (the pod's ``volumeMountPath``) filled in.

        Raises:
            PodTimeoutError: not ready within ``timeout_seconds``; the pod was terminated.
            PodGoneError: the pod vanished, stopped or lost its host while starting; it
                was terminated (one sentence: what RunPod said).
            ConsoleConnectError: the gateway's host key differs from the pinned one.
            TerminateError: the pod could not be terminated after one of the above.
        """
        handle = handle.model_copy(deep=True)
        start = time.monotonic()
        deadline = start + timeout_seconds
        last = "not read yet"
        while True:
            pod = self._call("read pod", self._client.get_pod, handle.pod_id, pod_id=handle.pod_id)
            seen = status_from_pod(handle.pod_id, pod)
            if seen.gone:  # terminated outside, exited or lost while starting: one sentence
                self._abort(handle, lost_error(seen))
            assert pod is not None
            status, runtime = pod.get("desiredStatus"), pod.get("runtime")
            last = f"desiredStatus={status} runtime={'up' if runtime else 'null'}"
            if status == "RUNNING" and runtime:
                if self._endpoints_answer(handle, pod, max(1.0, deadline - time.monotonic())):
                    return handle
                last += " ssh=not answering"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._abort(
                    handle,
                    PodTimeoutError(
                        f"pod {handle.pod_id} ({handle.name}) not ready after {timeout_seconds:.0f} s "
                        f"({last}); it was terminated. Raise the ready timeout for large images, "
                        "or pick another GPU type.",
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

    def _endpoints_answer(self, handle: PodHandle, pod: dict[str, Any], budget: float) -> bool:
        handle.cost_per_hr = float(pod.get("costPerHr") or handle.cost_per_hr)
        handle.workdir = pod.get("volumeMountPath") or handle.workdir
        if handle.pod_host_id is None:
            handle.pod_host_id = self._call(
                "read podHostId",
                self._client.get_pod_host_id,
                handle.pod_id,
                pod_id=handle.pod_id,
            )
        if handle.pod_host_id and handle.ssh is None:
            handle.ssh = self.ssh_key.gateway_endpoint(handle.pod_host_id)
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
        """What RunPod says about ``pod_id`` now (one ``get_pod``), mapped by
        ``lifecycle.status_from_pod``: ``pod: null``/TERMINATED → ``terminated_outside``,
        EXITED → ``exited``, ERROR/DEAD → ``host_lost``. RunPod forgets a terminated pod,
        so ``ended_at`` stays None (its billing records hold the end).

        Returns:
            The ``PodStatus``; ``unknown`` when RunPod could not be asked.

        Raises:
            SpecError: on an unsafe pod id.
        """
        validate_pod_id(pod_id)
        try:
            pod = self._client.get_pod(pod_id)
        except Exception as exc:
            classified = classify_exception(exc)
            if classified.action is FailoverAction.GONE:
                pod = None
            else:
                return PodStatus(
                    pod_id=pod_id,
                    cause=PodCause.UNKNOWN,
                    provider_status=f"RunPod did not answer: {classified.message}",
                )
        return status_from_pod(pod_id, pod)

    # -- terminate --------------------------------------------------------------------

    def terminate(self, pod_id: str, timeout_seconds: float = 120.0) -> TerminateResult:
        """Terminate ``pod_id`` and return once RunPod reads it back as gone; see
        ``runpod.lifecycle.terminate_until_gone`` (idempotent, never gone on a timeout).

        Raises:
            SpecError: on an unsafe pod id.
            TerminateError: not confirmed within ``timeout_seconds``.
        """
        return terminate_until_gone(
            self._client,
            validate_pod_id(pod_id),
            timeout_seconds=timeout_seconds,
            initial_delay_seconds=self.retry_initial_delay_seconds,
            poll_interval_seconds=self.poll_interval_seconds,
            sleep=self._sleep,
        )
