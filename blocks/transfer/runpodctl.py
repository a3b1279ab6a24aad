"""The ``runpodctl`` transfer method: ``runpodctl send`` / ``receive`` (croc relay).

As the field guide learned the hard way, the sender runs in the background with its
output in a log file, and the one-time code is read from ``Code is: …`` in that log
(colours and ``\\r`` progress stripped), never matched on a live coloured TTY.
Folders are zipped by runpodctl and arrive under their own name in the receiver's
working directory, so each side receives into a staging folder and moves the tree
into place. Both ends verify against the manifest: the pod's ``manifest.py`` for an
upload, the local one for a download.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_runpod.blocks.console.terminal_text import strip_ansi
from prefect_runpod.blocks.exceptions import ChecksumMismatchError, TransferError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.pod_tools import pod_manifest

if TYPE_CHECKING:
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.pod_handle import PodHandle

__all__ = ["parse_code", "runpodctl_download", "runpodctl_upload"]

_CODE = re.compile(r"Code is:\s*([A-Za-z0-9-]+)")
CODE_TIMEOUT_SECONDS = 60.0
TRANSFER_TIMEOUT_SECONDS = 3600.0


def parse_code(log_text: str) -> str | None:
    """The code from runpodctl send's output (``Code is: 8338-galileo-collect-fidel``),
    ignoring colours and progress redraws; None while it has not appeared.

    Escapes go through the console's one ANSI grammar (``terminal_text.strip_ansi``);
    each ``\\r`` redraw is read as its own line, so a code followed by a progress bar on
    the same line is still found.
    """
    clean = strip_ansi(log_text).replace("\r", "\n")
    match = _CODE.search(clean)
    return match.group(1) if match else None


def _local_send(path: Path, exe: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [exe, "send", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + CODE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        code = parse_code(log.read_text(errors="replace"))
        if code:
            return proc, code
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    proc.wait(10)
    raise TransferError(
        f"runpodctl send printed no code; its log: {log.read_text(errors='replace')[-500:]}"
    )


def runpodctl_upload(
    console: PodConsole,
    handle: PodHandle,
    local_dir: Path,
    remote: str,
    source: dict[str, Any],
    *,
    local_exe: str = "runpodctl",
    pod_exe: str = "runpodctl",
) -> dict[str, Any]:
    """Send ``local_dir`` with runpodctl, receive it on the pod into ``remote``, verify.

    Raises:
        TransferError: no code, or the receive failed (its output in the message).
        ChecksumMismatchError: a file differs on the pod after one resend (named).
    """
    pod = handle.pod_id
    for attempt in range(2):
        with tempfile.TemporaryDirectory(prefix="runpodctl-") as tmp:
            proc, code = _local_send(local_dir, local_exe, Path(tmp) / "send.log")
            stage = f"{remote.rstrip('/')}.rx-{uuid.uuid4().hex[:8]}"
            name = local_dir.name
            q = shlex.quote
            landed = f"{stage}/{name}"
            move = (
                f"mkdir -p {q(remote)} && cp -a {q(landed)}/. {q(remote)}/"
                if local_dir.is_dir()
                else f"mkdir -p {q(remote)} && cp -a {q(landed)} {q(remote)}/"
            )
            try:
                result = console.run(
                    f"mkdir -p {q(stage)} && cd {q(stage)} && {q(pod_exe)} receive {q(code)} "
                    f"&& {move}; __rc=$?; cd / && rm -rf {q(stage)}; (exit $__rc)",
                    timeout_seconds=TRANSFER_TIMEOUT_SECONDS,
                )
            finally:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            if result.exit_code != 0:
                raise TransferError(
                    f"pod {pod}: runpodctl receive failed ({result.exit_code}): "
                    f"{result.output[-500:]}; try method 'pty'",
                    pod_id=pod,
                )
        dest = pod_manifest(console, handle, remote, [e["path"] for e in source["entries"]])
        problems = mf.compare_manifests(source, dest)
        if not problems:
            return {
                "bytes": sum(e["size_bytes"] for e in source["entries"]),
                "retries": attempt,
                "dest_manifest": dest,
            }
        if attempt == 1:
            path, why = problems[0]
            raise ChecksumMismatchError(
                f"{path} differs on pod {pod} after a resend ({why})",
                path=path,
                pod_id=pod,
                stage="upload",
            )
    raise AssertionError("unreachable")


def runpodctl_download(
    console: PodConsole,
    handle: PodHandle,
    remote: str,
    local_dir: Path,
    *,
    local_exe: str = "runpodctl",
    pod_exe: str = "runpodctl",
) -> dict[str, Any]:
    """Send ``remote`` from the pod (background, log file), receive it here, verify
    against the manifest the pod computed.

    Raises:
        TransferError: no code in the pod's log, or the local receive failed.
        ChecksumMismatchError: a file differs after one resend (named).
    """
    pod, q = handle.pod_id, shlex.quote
    source = pod_manifest(console, handle, remote)
    paths = [e["path"] for e in source["entries"]]
    local_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(2):
        log = f"/tmp/prefect-runpod-send-{uuid.uuid4().hex[:8]}.log"
        console.run(
            f"nohup {q(pod_exe)} send {q(remote)} > {q(log)} 2>&1 < /dev/null &",
            timeout_seconds=30,
            check=True,
        )
        code = None
        deadline = time.monotonic() + CODE_TIMEOUT_SECONDS
        while code is None and time.monotonic() < deadline:
            code = parse_code(console.run(f"cat {q(log)}", timeout_seconds=30).output)
            if code is None:
                time.sleep(0.5)
        if code is None:
            raise TransferError(
                f"pod {pod}: runpodctl send printed no code (log {log})", pod_id=pod
            )
        with tempfile.TemporaryDirectory(prefix="runpodctl-rx-", dir=local_dir.parent) as stage:
            done = subprocess.run(
                [local_exe, "receive", code],
                cwd=stage,
                capture_output=True,
                timeout=TRANSFER_TIMEOUT_SECONDS,
                check=False,
            )
            if done.returncode != 0:
                raise TransferError(f"runpodctl receive failed: {done.stdout[-500:]!r}", pod_id=pod)
            landed = Path(stage) / Path(remote.rstrip("/")).name
            shutil.copytree(landed, local_dir, dirs_exist_ok=True)
        console.run(f"rm -f {q(log)}", timeout_seconds=30)
        dest = mf.compute_manifest(str(local_dir), paths)
        problems = mf.compare_manifests(source, dest)
        if not problems:
            return {
                "bytes": sum(e["size_bytes"] for e in source["entries"]),
                "retries": attempt,
                "source_manifest": source,
                "dest_manifest": dest,
            }
        if attempt == 1:
            path, why = problems[0]
            raise ChecksumMismatchError(
                f"{path} from pod {pod} differs after a resend ({why})",
                path=path,
                pod_id=pod,
                stage="download",
            )
    raise AssertionError("unreachable")
