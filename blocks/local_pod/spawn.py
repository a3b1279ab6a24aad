"""A new local pod on this machine: the request checked, the pod directory laid out
(workspace, home, bin, host key, authorised key, image profile, ``runpodctl``
stand-in, ``pod.json``) and its daemon started in a session of its own; and the
daemon stopped and reaped again (docs/architecture.md#the-local-pod-blockslocal_pod).

``LocalPodProvider`` (:mod:`prefect_runpod.blocks.local_pod.provider`) calls these
with itself as ``provider``, for its home, mode, price, image and start deadline.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from prefect_runpod.blocks.exceptions import ProviderError, SpecError
from prefect_runpod.blocks.faults import FAULT_DIR_ENV, FAULTS_ENV
from prefect_runpod.blocks.local_pod.images import get_profile, prepare_image
from prefect_runpod.blocks.local_pod.pod_files import runpodctl_script
from prefect_runpod.blocks.local_pod.registry import (
    ENDING_FILE,
    PodPaths,
    PodRecord,
    new_pod_host_id,
    pid_alive,
    read_record,
)
from prefect_runpod.blocks.provider import PodRequest
from prefect_runpod.blocks.validation import is_env_name

if TYPE_CHECKING:
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

__all__ = ["base_python", "check_request", "lay_out_pod", "reap", "start_daemon", "stop_daemon"]

_POLL_SECONDS = 0.02
_KEY_TYPES = ("ssh-", "ecdsa-sha2-", "sk-")

# Daemons this process started: kept so their exit is reaped (no zombies).
_SPAWNED: dict[str, subprocess.Popen[bytes]] = {}


def base_python() -> Path:
    """The interpreter a pod's ``python3`` points at: the base installation behind any
    virtualenv (``sys._base_executable``), so the pod never sees the host venv's packages."""
    candidate = Path(getattr(sys, "_base_executable", "") or sys.executable).resolve()
    venv = Path(sys.prefix).resolve()
    if sys.prefix != sys.base_prefix and venv in candidate.parents:
        major, minor = sys.version_info[:2]
        candidate = (Path(sys.base_prefix) / "bin" / f"python{major}.{minor}").resolve()
    return candidate


def check_request(request: PodRequest) -> str:
    """Validate the request before anything is created; return the key line."""
    line = request.public_key.strip()
    parts = line.split()
    try:
        ok = len(parts) >= 2 and parts[0].startswith(_KEY_TYPES)
        ok = ok and bool(base64.b64decode(parts[1], validate=True))
    except (binascii.Error, ValueError):
        ok = False
    if not ok or "\n" in line:
        raise SpecError(
            "the pod request's public_key is not one OpenSSH public-key line "
            "(`ssh-ed25519 AAAA… comment`); pass KeyPair.public_key from generate_keypair()"
        )
    for key, value in request.env.items():
        if not is_env_name(key) or "\0" in value:
            raise SpecError(
                f"pod env variable {key!r} is not a valid name=value pair; use letters, "
                "digits and underscores for names and no NUL bytes in values"
            )
    return line


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)


def _log_tail(path: Path, max_bytes: int = 2000) -> str:
    try:
        data = path.read_bytes()[-max_bytes:]
    except OSError:
        return "(no daemon log)"
    return data.decode(errors="replace").strip() or "(daemon log empty)"


def lay_out_pod(
    provider: LocalPodProvider,
    paths: PodPaths,
    pod_id: str,
    name: str,
    public_key: str,
    request: PodRequest,
) -> None:
    """Lay out the pod directory: workspace, home, bin, host key, authorized_keys,
    ``pod.json``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    paths.root.parent.mkdir(parents=True, exist_ok=True)
    paths.root.mkdir(mode=0o700)
    for directory in (paths.workspace, paths.home, paths.bin):
        directory.mkdir(mode=0o755)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    host_key = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    _write(paths.host_key, private, 0o600)
    _write(paths.authorized_keys, (public_key + "\n").encode(), 0o600)
    python = base_python()
    for link in ("python3", "python"):
        (paths.bin / link).symlink_to(python)
    image = prepare_image(
        provider.home,
        get_profile(provider.image),
        python=python,
        pod_id=pod_id,
        workspace=paths.workspace,
        pod_home=paths.home,
    )
    _write(
        paths.bin / "runpodctl",
        runpodctl_script(pod_id, paths.pid_file, paths.bin, paths.root / ENDING_FILE).encode(),
        0o755,
    )
    _write(paths.home / ".bashrc", image.bashrc.encode(), 0o644)
    pod_host_id = new_pod_host_id(pod_id)
    created = datetime.now(UTC)
    lifetime = request.deadman.lifetime_seconds if request.deadman is not None else None
    config = {
        "pod_id": pod_id,
        "name": name,
        "mode": provider.mode,
        "user": pod_host_id if provider.mode == "gateway" else "root",
        "pod_host_id": pod_host_id,
        "host_key": host_key,
        "public_key": public_key,
        "cost_per_hr": provider.cost_per_hr,
        "gpu_type": provider.gpu_type,
        "created_at": created.isoformat(),
        "env": {**image.env, **request.env},
        "image": image.profile,
        "path_first": image.path_first,
        "lifetime_seconds": lifetime,
    }
    _write(paths.config, json.dumps(config, indent=1).encode(), 0o600)


def start_daemon(provider: LocalPodProvider, paths: PodPaths, pod_id: str) -> PodRecord:
    """Spawn the daemon in its own session and wait for its registry entry."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(paths.home),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "RUNPOD_POD_ID": pod_id,  # the daemon is a process of the pod too
    }
    # The daemon's own fault points (the gateway_relay fault), never the pod's env.
    for name in (FAULTS_ENV, FAULT_DIR_ENV):
        if name in os.environ:
            env[name] = os.environ[name]
    with open(paths.log, "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prefect_runpod.blocks.local_pod.daemon",
                "--home",
                str(provider.home),
                "--pod-id",
                pod_id,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=paths.root,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    _SPAWNED[pod_id] = proc
    deadline = time.monotonic() + provider.start_timeout_seconds
    while True:
        record = read_record(provider.home, pod_id)
        if record is not None:
            return record
        if proc.poll() is not None:
            raise ProviderError(
                f"local pod {pod_id}'s daemon exited with status {proc.returncode} before "
                f"listening: {_log_tail(paths.log)}",
                pod_id=pod_id,
                stage="provision",
            )
        if time.monotonic() > deadline:
            raise ProviderError(
                f"local pod {pod_id}'s daemon did not listen within "
                f"{provider.start_timeout_seconds:.0f} s (raise start_timeout_seconds on a "
                f"busy machine): {_log_tail(paths.log)}",
                pod_id=pod_id,
                stage="provision",
            )
        time.sleep(_POLL_SECONDS)


def stop_daemon(pid: int, grace_seconds: float) -> None:
    """SIGTERM the daemon, wait up to ``grace_seconds``, then SIGKILL. A stopped daemon
    (a frozen pod: SIGSTOP) is continued right after the SIGTERM, so it ends at once
    instead of after the grace, as a shell's ``kill`` does for a stopped job."""
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + grace_seconds
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def reap(pod_id: str) -> None:
    proc = _SPAWNED.get(pod_id)
    if proc is not None and proc.poll() is not None:
        del _SPAWNED[pod_id]
