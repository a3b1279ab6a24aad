"""The local pod's on-disk registry and process bookkeeping (docs/architecture.md#pod-providers).

A local pod lives in ``<home>/pods/<pod_id>/`` and is listed by one JSON file,
``<home>/registry/<pod_id>.json``, written atomically by the pod's daemon once it
listens. Any process (the flow, a Prefect hook in another process, the reaper)
lists, finds and terminates pods through these files alone.

Every process a pod starts carries ``RUNPOD_POD_ID=<pod_id>`` in its environment
(RunPod sets the same variable inside real pods); terminate finds leftovers by
scanning ``/proc/*/environ`` for that marker, the way a container runtime finds a
container's processes by its cgroup.

Stdlib only: the pod daemon imports this module and must start in about a second.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import signal
import string
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

__all__ = [
    "ENDING_FILE",
    "INIT_PID_VAR",
    "MARKER_VAR",
    "LockBusyError",
    "PodPaths",
    "PodRecord",
    "PodTombstone",
    "default_home",
    "daemon_alive",
    "find_marked_pids",
    "kill_marked",
    "list_records",
    "name_lock",
    "new_pod_host_id",
    "new_pod_id",
    "pid_alive",
    "read_deadman_attempts",
    "read_record",
    "read_tombstone",
    "remove_record",
    "write_json",
    "write_record",
    "write_tombstone",
]

MARKER_VAR = "RUNPOD_POD_ID"
"""The environment variable that marks every process of a pod (as on RunPod)."""
INIT_PID_VAR = "PREFECT_RUNPOD_POD_INIT_PID"
"""The pod's own PID 1 (its daemon), which a dead-man's last resort leaves alone, as it
spares PID 1 in a container."""
ENDING_FILE = "ending.json"
"""Written in the pod directory by whoever asks the daemon to end the pod
(``{"by": …, "layer": …}``) and copied into the tombstone."""

_ID_ALPHABET = string.ascii_lowercase + string.digits
_ID_LENGTH = 14
"""RunPod's ids are 14 lowercase letters and digits (``50qynxzilsxoey``); local pods
take the same shape, so every check on a pod id holds for both providers."""


def default_home() -> Path:
    """Where local pods live: ``$PREFECT_RUNPOD_HOME``, else ``~/.prefect-runpod``."""
    env = os.environ.get("PREFECT_RUNPOD_HOME")
    return Path(env).expanduser() if env else Path.home() / ".prefect-runpod"


def new_pod_id() -> str:
    """A fresh local pod id shaped like RunPod's: 14 lowercase letters and digits
    (``k3v9x0m2qa7c1z``), no hyphen."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LENGTH))


def new_pod_host_id(pod_id: str) -> str:
    """The gateway login user ``<pod_id>-<8 hex>``, shaped like RunPod's ``podHostId``."""
    return f"{pod_id}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class PodPaths:
    """The files of one pod under ``<home>/pods/<pod_id>/``.

    Attributes:
        root: the pod directory.
        workspace: the working directory (``handle.workdir``; ``/workspace`` on RunPod).
        home: the shell's ``HOME``.
        bin: first on the pod's ``PATH``: ``python3``/``python`` links, ``runpodctl``.
        host_key: the pod's ed25519 SSH host key (OpenSSH private key format).
        authorized_keys: the client public key allowed to log in.
        config: ``pod.json``, what the provider asks of the daemon.
        pid_file: the daemon's pid, read by the ``runpodctl`` shim.
        log: the daemon's stdout/stderr.
    """

    root: Path

    @classmethod
    def of(cls, home: Path, pod_id: str) -> PodPaths:
        """The paths of pod ``pod_id`` under ``home``."""
        return cls(Path(home) / "pods" / pod_id)

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    @property
    def authorized_keys(self) -> Path:
        return self.root / "authorized_keys"

    @property
    def config(self) -> Path:
        return self.root / "pod.json"

    @property
    def pid_file(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def log(self) -> Path:
        return self.root / "daemon.log"


@dataclass
class PodRecord:
    """One registry entry, ``<home>/registry/<pod_id>.json``.

    Attributes:
        pod_id: 14 lowercase letters and digits, as RunPod shapes its ids.
        name: the pod's name (``<prefix>-<flow_run_id>``).
        pid: the daemon's process id.
        port: the loopback TCP port the daemon's SSH server listens on.
        mode: ``gateway`` or ``direct``.
        user: the SSH login user (``<pod_id>-<8 hex>`` for gateway, ``root`` for direct).
        pod_host_id: the gateway-style user id, kept in both modes.
        host_key: the host's public key, one OpenSSH line (``ssh-ed25519 AAAA…``).
        workdir: the workspace directory (absolute path).
        cost_per_hr: the rehearsal price in USD/h.
        gpu_type: ``cpu``.
        created_at: ISO-8601 UTC time the provider made the id.
        lifetime_seconds: the dead-man lifetime the pod was created with, or None.
    """

    pod_id: str
    name: str
    pid: int
    port: int
    mode: str
    user: str
    pod_host_id: str
    host_key: str
    workdir: str
    cost_per_hr: float
    gpu_type: str
    created_at: str
    lifetime_seconds: float | None = None


@dataclass
class PodTombstone:
    """What is left of an ended pod: ``<home>/ended/<pod_id>.json``, so whoever asks
    later (the run, the reaper, ``prefect-runpod cost``) learns when and how it ended.

    Attributes:
        pod_id / name / created_at: the pod.
        ended_at: ISO-8601 UTC time the pod ended (billing stops).
        by: ``deadman`` (its watchdog ran ``runpodctl``), ``pod`` (``runpodctl`` run in
            the pod by someone else) or ``terminate`` (a provider's terminate call);
            ``lease`` in tombstones an older release left (the daemon's former deadline).
        layer: how (``runpodctl pod delete``, ``terminate``).
        attempts: the dead-man's recorded attempts (``deadman.jsonl`` lines), if any.
    """

    pod_id: str
    name: str
    created_at: str
    ended_at: str
    by: str
    layer: str
    attempts: list[dict] = field(default_factory=list)


def _tombstone_dir(home: Path) -> Path:
    return Path(home) / "ended"


def write_tombstone(home: Path, tombstone: PodTombstone) -> None:
    """Record an ended pod (atomically); the first record of a pod wins."""
    directory = _tombstone_dir(home)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{tombstone.pod_id}.json"
    if not target.exists():
        write_json(target, asdict(tombstone))


def read_tombstone(home: Path, pod_id: str) -> PodTombstone | None:
    """The record of an ended pod, or None (never ended here, or unreadable)."""
    try:
        data = json.loads((_tombstone_dir(home) / f"{pod_id}.json").read_text())
        return PodTombstone(**data)
    except (OSError, ValueError, TypeError):
        return None


def read_deadman_attempts(workspace: Path) -> list[dict]:
    """Every attempt the pod's dead-man switches recorded (``deadman.jsonl`` in each run
    directory under ``workspace/prefect-runpod/``), oldest first."""
    out: list[dict] = []
    for path in sorted(Path(workspace).glob("prefect-runpod/*/deadman.jsonl")):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict):
                    out.append(item)
    return sorted(out, key=lambda a: str(a.get("at", "")))


class LockBusyError(TimeoutError):
    """Raised by ``name_lock`` when another process holds the name's lock too long."""


def _registry_dir(home: Path) -> Path:
    return Path(home) / "registry"


def write_json(path: Path, data: object) -> None:
    """Write ``data`` as JSON to ``path`` atomically (a temp file beside it, synced, then
    renamed over it), so a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_record(home: Path, record: PodRecord) -> Path:
    """Write ``record`` atomically (``write_json``), so readers never see half a file.

    Returns:
        The path of the entry.
    """
    directory = _registry_dir(home)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{record.pod_id}.json"
    write_json(target, asdict(record))
    return target


def read_record(home: Path, pod_id: str) -> PodRecord | None:
    """The registry entry of ``pod_id``, or None when there is none (or it is unreadable)."""
    path = _registry_dir(home) / f"{pod_id}.json"
    try:
        data = json.loads(path.read_text())
        known = {f.name for f in fields(PodRecord)}
        return PodRecord(**{k: v for k, v in data.items() if k in known})
    except (OSError, ValueError, TypeError):
        return None


def list_records(home: Path) -> list[PodRecord]:
    """Every registry entry, oldest first."""
    directory = _registry_dir(home)
    if not directory.is_dir():
        return []
    records = []
    for path in directory.glob("*.json"):  # temp files start with a dot: not matched
        record = read_record(home, path.stem)
        if record is not None:
            records.append(record)
    return sorted(records, key=lambda r: (r.created_at, r.pod_id))


def remove_record(home: Path, pod_id: str) -> None:
    """Delete the entry of ``pod_id``; a missing entry is fine."""
    with contextlib.suppress(FileNotFoundError):
        (_registry_dir(home) / f"{pod_id}.json").unlink()


@contextlib.contextmanager
def name_lock(home: Path, name: str, timeout_seconds: float = 60.0) -> Iterator[None]:
    """Hold an exclusive lock for pod name ``name`` (``flock`` on a per-name file), so
    two processes creating the same name adopt one pod instead of making two.

    Raises:
        LockBusyError: when the lock is not obtained within ``timeout_seconds``.
    """
    directory = _registry_dir(home) / "locks"
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(name.encode()).hexdigest()[:32]
    fd = os.open(directory / f"{digest}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise LockBusyError(f"lock for pod name {name!r} busy") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    # The state letter follows the command name, which is wrapped in parentheses.
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X", b"")


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return marker in fh.read().split(b"\0")
    except OSError:
        return False


def daemon_alive(record: PodRecord) -> bool:
    """True when the pod's daemon runs: ``record.pid`` is alive and carries the pod's
    marker (so a recycled pid of some other process never counts)."""
    marker = f"{MARKER_VAR}={record.pod_id}".encode()
    return pid_alive(record.pid) and _environ_has(record.pid, marker)


def find_marked_pids(pod_id: str, *, exclude: set[int] | None = None) -> list[int]:
    """Processes of this user whose environment holds ``RUNPOD_POD_ID=<pod_id>``.

    Reads ``/proc/<pid>/environ`` (the environment at exec time, inherited by every
    child, also by ``setsid``/``nohup``'d ones). Zombies have an empty environment and
    are not listed.
    """
    marker = f"{MARKER_VAR}={pod_id}".encode()
    skip = {os.getpid()} | (exclude or set())
    uid = os.getuid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid in skip:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        if _environ_has(pid, marker):
            found.append(pid)
    return found


def kill_marked(
    pod_id: str, *, timeout_seconds: float = 10.0, exclude: set[int] | None = None
) -> list[int]:
    """SIGKILL every process marked with ``pod_id`` until a scan finds none (processes
    may fork while we scan), or ``timeout_seconds`` pass.

    Returns:
        The pids still marked at the end: empty on success.
    """
    deadline = time.monotonic() + timeout_seconds
    while True:
        pids = find_marked_pids(pod_id, exclude=exclude)
        if not pids or time.monotonic() > deadline:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
