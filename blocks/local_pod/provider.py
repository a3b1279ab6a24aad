"""LocalPod: the embedded default pod provider (docs/architecture.md#pod-providers).

A local pod is a daemon process (``prefect_runpod.blocks.local_pod.daemon``) in its
own session, serving SSH on ``127.0.0.1`` over a scratch workspace, listed in an
on-disk registry (``prefect_runpod.blocks.local_pod.registry``). It behaves like a
RunPod pod seen through RunPod's SSH gateway (PTY only, no exec, no SFTP) or, in
``direct`` mode, like a pod's own sshd on an exposed 22/tcp port. A run can
rehearse end to end on it, with a configurable price to show what a GPU would cost.
A new pod's directory and daemon are made by :mod:`prefect_runpod.blocks.local_pod.spawn`.
"""

from __future__ import annotations

import builtins
import contextlib
import shutil
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, Literal

from prefect.blocks.core import Block
from pydantic import Field

from prefect_runpod.blocks.exceptions import (
    PodTimeoutError,
    ProviderError,
    SpecError,
    TerminateError,
)
from prefect_runpod.blocks.local_pod.capabilities import LocalPodCapabilities
from prefect_runpod.blocks.local_pod.images import (
    DEFAULT_PROFILE,
    get_profile,
    profile_names,
)
from prefect_runpod.blocks.local_pod.registry import (
    ENDING_FILE,
    LockBusyError,
    PodPaths,
    PodRecord,
    PodTombstone,
    daemon_alive,
    default_home,
    find_marked_pids,
    kill_marked,
    list_records,
    name_lock,
    new_pod_id,
    read_deadman_attempts,
    read_record,
    read_tombstone,
    remove_record,
    write_tombstone,
)
from prefect_runpod.blocks.local_pod.spawn import (
    base_python,
    check_request,
    lay_out_pod,
    reap,
    start_daemon,
    stop_daemon,
)
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.provider import (
    PodCause,
    PodRequest,
    PodStatus,
    TerminateResult,
    end_command,
    lost_error,
)

__all__ = ["LocalPod", "LocalPodProvider", "base_python", "default_home"]

_BANNER_PREFIX = b"SSH-2.0-"


def _port_accepts(port: int, *, banner: bool, timeout_seconds: float = 1.0) -> bool:
    """True when 127.0.0.1:``port`` accepts a connection (and, with ``banner``, sends an
    SSH identification line)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_seconds) as sock:
            if not banner:
                return True
            data = b""
            while b"\n" not in data and len(data) < 256:
                chunk = sock.recv(256)
                if not chunk:
                    break
                data += chunk
            return data.startswith(_BANNER_PREFIX)
    except OSError:
        return False


_TOMBSTONE_WORDS = {
    "deadman": "by its dead-man switch",
    "lease": "by its lease (an older release's local deadline)",
    "terminate": "by a terminate call",
    "pod": "from inside the pod",
    "signal": "by a signal to its daemon",
}


class LocalPodProvider(LocalPodCapabilities):
    """The ``PodProvider`` for local pods (see ``prefect_runpod.blocks.provider``).

    Args:
        home: where pods live (``<home>/pods``, ``<home>/registry``); defaults to
            ``default_home()`` (``$PREFECT_RUNPOD_HOME`` or ``~/.prefect-runpod``).
        mode: ``gateway`` (PTY only, like ``ssh.runpod.io``) or ``direct`` (exec + SFTP).
        cost_per_hr: the price shown for a rehearsal, USD/h.
        gpu_type: the GPU type recorded on handles (``cpu``).
        start_timeout_seconds: how long ``create`` waits for the daemon to listen.
        image: the image profile whose login environment the pod reproduces
            (``plain``, ``runpod-pytorch``, ``conda``, ``fancy``, ``venv-python``;
            see ``prefect_runpod.blocks.local_pod.images``).

    Example:
        ```python
        from prefect_runpod.blocks.keys import generate_keypair
        from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
        from prefect_runpod.blocks.provider import PodRequest

        provider = LocalPodProvider()
        keys = generate_keypair()
        handle = provider.create(PodRequest(public_key=keys.public_key), "ft-demo")
        handle = provider.wait_ready(handle, timeout_seconds=30)
        print(handle.ssh_command("~/.ssh/id_ed25519"))
        provider.terminate(handle.pod_id)
        ```
    """

    def __init__(
        self,
        *,
        home: Path | None = None,
        mode: Literal["gateway", "direct"] = "gateway",
        cost_per_hr: float = 0.0,
        gpu_type: str = "cpu",
        start_timeout_seconds: float = 20.0,
        image: str = DEFAULT_PROFILE,
    ) -> None:
        if mode not in ("gateway", "direct"):
            raise SpecError(f"local pod mode must be 'gateway' or 'direct', not {mode!r}")
        if cost_per_hr < 0:
            raise SpecError(f"cost_per_hr must be >= 0 USD/h, not {cost_per_hr}")
        self.home = Path(home) if home is not None else default_home()
        self.mode = mode
        self.cost_per_hr = float(cost_per_hr)
        self.gpu_type = gpu_type
        self.start_timeout_seconds = start_timeout_seconds
        self.image = get_profile(image).name  # SpecError for an unknown name

    # --- PodProvider ------------------------------------------------------------------

    def create(self, request: PodRequest, name: str) -> PodHandle:
        """Start a pod daemon and return once its registry entry exists (port and host
        key known); about a second. A live pod named ``name`` is adopted instead; a
        registered pod of that name whose daemon died is terminated first.

        Returns:
            The handle (``provider`` its name, ``ssh`` set; ``direct_ssh`` too in direct mode).

        Raises:
            SpecError: the request's key or env is malformed (nothing was created).
            ProviderError: the daemon exited or did not listen within
                ``start_timeout_seconds``; its log tail is in the message.
        """
        public_key = check_request(request)
        self.home.mkdir(parents=True, exist_ok=True)
        try:
            with name_lock(self.home, name, timeout_seconds=self.start_timeout_seconds * 3):
                return self._create_locked(request, name, public_key)
        except LockBusyError:
            raise ProviderError(
                f"another process has been creating local pod {name!r} for too long; "
                "retry, or terminate that pod",
                stage="provision",
            ) from None

    def _create_locked(self, request: PodRequest, name: str, public_key: str) -> PodHandle:
        existing = self._find_record(name)
        if existing is not None:
            if daemon_alive(existing):
                return self._to_handle(existing)
            self.terminate(existing.pod_id)
        pod_id = new_pod_id()
        paths = PodPaths.of(self.home, pod_id)
        try:
            lay_out_pod(self, paths, pod_id, name, public_key, request)
            return self._to_handle(start_daemon(self, paths, pod_id))
        except BaseException:
            self._discard(pod_id, paths)
            raise

    def wait_ready(self, handle: PodHandle, timeout_seconds: float) -> PodHandle:
        """Wait until the pod's SSH port accepts connections and sends its banner.

        Returns:
            The handle, refreshed from the registry.

        Raises:
            PodGoneError: the pod ended meanwhile, or its daemon died (one sentence).
            ProviderError: the pod was never registered.
            PodTimeoutError: not ready within ``timeout_seconds``.
        """
        start = time.monotonic()
        last_status = "not registered"
        while True:
            record = read_record(self.home, handle.pod_id)
            if record is None or not daemon_alive(record):
                seen = self.status(handle.pod_id)  # ended (tombstone) or its daemon dead
                if seen.gone:
                    raise lost_error(seen)
                raise ProviderError(
                    f"local pod {handle.pod_id} is gone (no registry entry or its daemon "
                    f"is dead); create a new pod",
                    pod_id=handle.pod_id,
                    stage="provision",
                )
            if _port_accepts(record.port, banner=True):
                return self._to_handle(record)
            last_status = f"port {record.port} not answering SSH"
            elapsed = time.monotonic() - start
            if elapsed > timeout_seconds:
                raise PodTimeoutError(
                    f"local pod {handle.pod_id} not ready after {elapsed:.1f} s "
                    f"({last_status}); see {PodPaths.of(self.home, handle.pod_id).log}, "
                    f"then end it with `{end_command('local', handle.pod_id)}`",
                    pod_id=handle.pod_id,
                    stage="provision",
                    last_status=last_status,
                    elapsed_seconds=elapsed,
                )
            time.sleep(0.05)

    def find(self, name: str) -> PodHandle | None:
        """The registered pod named exactly ``name`` (the newest if several), or None."""
        record = self._find_record(name)
        return self._to_handle(record) if record else None

    def list(self, prefix: str) -> list[PodHandle]:
        """Registered pods whose name starts with ``prefix``, oldest first (a pod whose
        daemon died stays listed until terminated, so a reaper can end it)."""
        return [self._to_handle(r) for r in list_records(self.home) if r.name.startswith(prefix)]

    def get(self, pod_id: str) -> PodHandle | None:
        """The registered pod ``pod_id``, or None."""
        record = read_record(self.home, pod_id)
        return self._to_handle(record) if record else None

    def terminate(self, pod_id: str, timeout_seconds: float = 30.0) -> TerminateResult:
        """End pod ``pod_id``: SIGTERM its daemon (which ends the pod itself), SIGKILL
        after a grace period, SIGKILL every process still carrying
        ``RUNPOD_POD_ID=<pod_id>``, remove its directory and registry entry. Returns only
        once no marked process is left, the port is closed and the directory is gone.
        Works when the daemon was killed earlier. Idempotent.

        Returns:
            ``TerminateResult``; ``already_gone=True`` when nothing of the pod was left.

        Raises:
            TerminateError: not confirmed within ``timeout_seconds``.
        """
        start = time.monotonic()
        deadline = start + timeout_seconds
        paths = PodPaths.of(self.home, pod_id)
        record = read_record(self.home, pod_id)
        if record is None and not paths.root.exists() and not find_marked_pids(pod_id):
            reap(pod_id)
            tomb = read_tombstone(self.home, pod_id)
            ended = datetime.fromisoformat(tomb.ended_at) if tomb else datetime.now(UTC)
            return TerminateResult(pod_id=pod_id, confirmed_at=ended, already_gone=True)
        if paths.root.is_dir() and not (paths.root / ENDING_FILE).exists():
            with contextlib.suppress(OSError):
                (paths.root / ENDING_FILE).write_text('{"by": "terminate", "layer": "terminate"}\n')
        attempts = read_deadman_attempts(paths.workspace)
        if record is not None and daemon_alive(record):
            stop_daemon(record.pid, grace_seconds=min(10.0, timeout_seconds / 2))
        problem = ""
        while True:
            leftovers = kill_marked(pod_id, timeout_seconds=max(0.0, deadline - time.monotonic()))
            shutil.rmtree(paths.root, ignore_errors=True)
            remove_record(self.home, pod_id)
            reap(pod_id)
            port_open = record is not None and _port_accepts(record.port, banner=False)
            if not leftovers and not port_open and not paths.root.exists():
                confirmed = datetime.now(UTC)
                if record is not None:  # the daemon's own tombstone wins when it left one
                    self._bury(record, confirmed, attempts)
                return TerminateResult(pod_id=pod_id, confirmed_at=confirmed)
            problem = (
                f"processes {leftovers} still running"
                if leftovers
                else f"port {record.port if record else '?'} still open"
                if port_open
                else f"{paths.root} still exists"
            )
            if time.monotonic() > deadline:
                raise TerminateError(
                    f"local pod {pod_id} not confirmed gone after {timeout_seconds:.0f} s: "
                    f"{problem}; kill them by hand (grep RUNPOD_POD_ID={pod_id} in "
                    f"/proc/*/environ) and run `{end_command('local', pod_id)}` again",
                    pod_id=pod_id,
                    stage="terminate",
                )
            time.sleep(0.1)

    def status(self, pod_id: str) -> PodStatus:
        """What the registry and ``/proc`` say about ``pod_id`` now.

        A registered pod whose daemon runs is ``alive``; one whose daemon died is
        ``host_lost`` (its runtime is gone); a pod with a tombstone is
        ``terminated_outside``, with when, by whom and how it ended; a pod directory
        without a registry entry is ``starting``; nothing at all is ``terminated_outside``.
        A local pod never reports ``exited``.

        Returns:
            The ``PodStatus``.
        """
        record = read_record(self.home, pod_id)
        if record is not None:
            if daemon_alive(record):
                return PodStatus(
                    pod_id=pod_id, cause=PodCause.ALIVE, provider_status="daemon running"
                )
            return PodStatus(
                pod_id=pod_id,
                cause=PodCause.HOST_LOST,
                provider_status=f"registered, but its daemon (pid {record.pid}) is dead",
            )
        tomb = read_tombstone(self.home, pod_id)
        if tomb is not None:
            how = _TOMBSTONE_WORDS.get(tomb.by, tomb.by)
            at = datetime.fromisoformat(tomb.ended_at).strftime("%H:%M:%S UTC")
            return PodStatus(
                pod_id=pod_id,
                cause=PodCause.TERMINATED_OUTSIDE,
                provider_status=f"the local pod ended at {at} {how}"
                + (f" ({tomb.layer})" if tomb.layer and tomb.layer != tomb.by else ""),
                ended_at=datetime.fromisoformat(tomb.ended_at),
                ended_by=tomb.by,
                ended_layer=tomb.layer,
            )
        if PodPaths.of(self.home, pod_id).root.is_dir():
            return PodStatus(
                pod_id=pod_id, cause=PodCause.STARTING, provider_status="daemon starting"
            )
        return PodStatus(
            pod_id=pod_id, cause=PodCause.TERMINATED_OUTSIDE, provider_status="no such local pod"
        )

    def ended(self, pod_id: str) -> PodTombstone | None:
        """What is left of an ended pod: when, by whom and how it ended, and the
        dead-man's attempts (``registry.PodTombstone``); None when none is recorded."""
        return read_tombstone(self.home, pod_id)

    # --- internals ----------------------------------------------------------------

    def _bury(self, record: PodRecord, ended_at: datetime, attempts: builtins.list[dict]) -> None:
        """Leave a tombstone for a pod whose daemon could not (it was dead)."""
        with contextlib.suppress(OSError):
            write_tombstone(
                self.home,
                PodTombstone(
                    pod_id=record.pod_id,
                    name=record.name,
                    created_at=record.created_at,
                    ended_at=ended_at.isoformat(),
                    by="terminate",
                    layer="terminate",
                    attempts=attempts,
                ),
            )

    def _find_record(self, name: str) -> PodRecord | None:
        matches = [r for r in list_records(self.home) if r.name == name]
        return matches[-1] if matches else None

    def _to_handle(self, record: PodRecord) -> PodHandle:
        endpoint = SSHEndpoint(
            host="127.0.0.1",
            port=record.port,
            user=record.user,
            mode="direct" if record.mode == "direct" else "gateway",
            host_key=record.host_key,
        )
        return PodHandle(
            pod_id=record.pod_id,
            name=record.name,
            provider=self.provider_name,
            gpu_type=record.gpu_type,
            cost_per_hr=record.cost_per_hr,
            created_at=datetime.fromisoformat(record.created_at),
            ssh=endpoint,
            direct_ssh=endpoint if record.mode == "direct" else None,
            workdir=record.workdir,
            pod_host_id=record.pod_host_id,
            lifetime_seconds=record.lifetime_seconds,
        )

    def _discard(self, pod_id: str, paths: PodPaths) -> None:
        """Undo a failed create."""
        with contextlib.suppress(Exception):
            self.terminate(pod_id, timeout_seconds=10.0)
        shutil.rmtree(paths.root, ignore_errors=True)


class LocalPod(Block):
    """A pod on this machine: a loopback SSH server over a scratch workspace that
    behaves like a RunPod pod, so a fine-tune can be rehearsed end to end for free.

    Attributes:
        mode: ``gateway`` (PTY only, like RunPod's SSH gateway) or ``direct`` (exec, SFTP).
        cost_per_hr: the price a rehearsal reports, USD/h.
        home: where pods live; empty for ``$PREFECT_RUNPOD_HOME`` or ``~/.prefect-runpod``.
        image: the image profile whose login environment the pod reproduces.
    """

    _block_type_name = "Local Pod"
    _description: ClassVar[str] = (
        "A pod on this machine that behaves like a RunPod pod (PTY-only gateway or direct "
        "SSH with SFTP) for rehearsing a fine-tune end to end."
    )
    _documentation_url = "https://docs.runpod.io/pods/configuration/use-ssh"  # type: ignore[assignment]
    _code_example = """
```python
from prefect_runpod.blocks.local_pod.provider import LocalPod

local_pod = LocalPod.load("BLOCK_NAME")
provider = local_pod.get_provider()
```
"""

    mode: Literal["gateway", "direct"] = Field(
        default="gateway",
        description=(
            "How the pod's SSH behaves: 'gateway' like RunPod's proxy (PTY only, no exec, "
            "no SFTP), 'direct' like a pod's own sshd on an exposed port."
        ),
    )
    cost_per_hr: float = Field(
        default=0.0,
        ge=0.0,
        title="Cost per hour (USD)",
        description="The price per hour in USD a rehearsal reports, to show what a GPU would cost.",
    )
    home: str | None = Field(
        default=None,
        description=(
            "The directory local pods live in; empty means $PREFECT_RUNPOD_HOME or "
            "~/.prefect-runpod."
        ),
    )

    image: str = Field(
        default=DEFAULT_PROFILE,
        description=(
            "The image profile whose login environment the pod reproduces: "
            + ", ".join(profile_names())
            + " (docs/local-pod-images.md)."
        ),
    )

    def get_provider(self) -> LocalPodProvider:
        """The ``LocalPodProvider`` these settings describe.

        Raises:
            SpecError: ``image`` names no registered profile.
        """
        return LocalPodProvider(
            home=Path(self.home).expanduser() if self.home else None,
            mode=self.mode,
            cost_per_hr=self.cost_per_hr,
            image=self.image,
        )
