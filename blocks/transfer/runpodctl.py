"""The ``runpodctl`` transfer method: ``runpodctl send`` / ``receive`` (croc relay).

The sender runs in the background with its output in a log file, and the one-time
code is read from ``Code is: …`` in that log (colours and ``\\r`` progress stripped),
never matched on a live coloured TTY, where progress redraws break the line up.
Folders are zipped by runpodctl and arrive under their own name in the receiver's
working directory, so each side receives into a staging folder and moves the tree
into place. Both ends verify against the manifest: the pod's ``manifest.py`` for an
upload, the local one for a download. ``RunpodctlMethod`` is the ``TransferMethod``;
``auto`` never picks it (the relay is outside both machines), a caller asks for it by
name.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_runpod.blocks.console.terminal_text import strip_ansi
from prefect_runpod.blocks.exceptions import SpecError, TransferError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.base import (
    MethodConfig,
    MethodOptions,
    PodLink,
    ProgressCallback,
)
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult
from prefect_runpod.blocks.transfer.pod_tools import PodLanding, pod_manifest
from prefect_runpod.blocks.transfer.verify import (
    local_tree_manifest,
    verify_resending_once,
)

if TYPE_CHECKING:
    from prefect_runpod.blocks.pod_handle import PodHandle

__all__ = ["RunpodctlMethod", "RunpodctlOptions", "parse_code"]

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


def _reached_through_links(local_root: Path, source: Manifest) -> bool:
    """True when a file of ``source`` is reached through a link under ``local_root``
    (the manifest was made with ``follow_links``)."""
    if local_root.is_file():
        return local_root.is_symlink()
    for entry in source.files:
        path = local_root
        for part in entry.path.split("/"):
            path = path / part
            if path.is_symlink():
                return True
    return False


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


def _only_manifest_files(local_root: Path, source: Manifest, staging: Path) -> Path:
    """What to hand ``runpodctl send``: ``local_root`` itself when ``source`` lists every
    entry of its tree, else a staging copy (hard links where possible) holding exactly
    the entries of ``source`` (files; directories and links are made again on the pod
    anyway), so files the caller left out (ignored, secret) never travel."""
    if local_root.is_file():
        return local_root
    items, _problems = mf.scan_tree(str(local_root))
    if {e.path for e in source.entries} == {rel for rel, _kind, _target in items}:
        return local_root
    staged = staging / local_root.name
    staged.mkdir(parents=True, exist_ok=True)
    for entry in source.files:
        src = local_root.joinpath(*entry.path.split("/"))
        dst = staged.joinpath(*entry.path.split("/"))
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    return staged


@dataclass
class RunpodctlOptions(MethodOptions):
    """Tuning of the ``runpodctl`` method.

    Attributes:
        local_exe: the runpodctl executable on this machine.
        pod_exe: the runpodctl executable on the pod.
    """

    local_exe: str = "runpodctl"
    pod_exe: str = "runpodctl"


class RunpodctlMethod:
    """The ``runpodctl`` ``TransferMethod``: ``runpodctl send`` on one side, ``receive``
    on the other, through RunPod's croc relay. Used only when asked for by name.

    Args:
        options: the executables; default ``RunpodctlOptions()``.
    """

    auto_priority: int | None = None

    def __init__(self, options: RunpodctlOptions | None = None, *, follow_links: bool = False):
        self.options = options or RunpodctlOptions()
        self.follow_links = follow_links

    @classmethod
    def from_config(cls, config: MethodConfig) -> RunpodctlMethod:
        """The method with the caller's ``RunpodctlOptions`` (if any) and link choice."""
        return cls(config.options_for(RunpodctlOptions), follow_links=config.follow_links)

    def unavailable(self, handle: PodHandle) -> str | None:
        """A message when this machine has no runpodctl (``options.local_exe`` on the
        PATH), else None; the pod's end is ``pod_unavailable``'s question."""
        if shutil.which(self.options.local_exe) is None:
            return (
                f"runpodctl is not installed on this machine ({self.options.local_exe!r} is "
                "not on the PATH): install it (https://github.com/runpod/runpodctl) or use "
                "--transfer pty"
            )
        return None

    def pod_unavailable(self, pod: PodLink) -> str | None:
        """A message when the pod has no runpodctl on its PATH, else None."""
        exe = shlex.quote(self.options.pod_exe)
        found = pod.console.run(f"command -v {exe} >/dev/null", timeout_seconds=30, check=False)
        if found.exit_code != 0:
            return (
                f"pod {pod.pod_id} has no {self.options.pod_exe!r} on its PATH, so runpodctl "
                "cannot receive there: use an image that ships runpodctl, or --transfer pty"
            )
        return None

    def upload(
        self,
        pod: PodLink,
        local_root: Path,
        remote_root: str,
        source: Manifest,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """Send the files of ``local_root`` the pod does not already hold (verified)
        with runpodctl, receive them on the pod into ``remote_root`` (in a subshell:
        the console's shell keeps its directory), make
        the empty directories and in-tree links there (whatever runpodctl did with
        them), verify with the pod's ``manifest.py``; a mismatch is sent once more.
        ``on_progress`` is not called (runpodctl reports only to its terminal).

        Raises:
            SpecError: ``follow_links`` and the tree holds links (runpodctl sends a
                folder its own way and cannot be told to copy through them).
            TransferError: no code, or the receive failed (its output in the message).
            ChecksumMismatchError: a file differs on the pod after one resend (named).
        """
        console, handle, pod_id = pod.console, pod.handle, pod.pod_id
        if self.follow_links and _reached_through_links(local_root, source):
            raise SpecError(
                f"{local_root} holds links to copy through, which runpodctl cannot be told "
                "to do (it zips the folder its own way): upload with method 'pty', 'sftp' "
                "or 's3'",
                pod_id=pod_id,
            )
        landing = PodLanding(console, handle, remote_root, source)
        return landing.send_missing(
            lambda files, _again: self._send(pod, local_root, remote_root, files),
            method="runpodctl",
        )

    def _send(self, pod: PodLink, local_root: Path, remote: str, source: Manifest) -> None:
        """One ``runpodctl send`` here and ``receive`` on the pod, the tree then copied
        into ``remote`` (in a subshell: the console's shell keeps its directory and
        variables)."""
        local_exe, pod_exe, q = self.options.local_exe, self.options.pod_exe, shlex.quote
        with tempfile.TemporaryDirectory(prefix="runpodctl-") as tmp:
            sent = _only_manifest_files(local_root, source, Path(tmp) / "send")
            proc, code = _local_send(sent, local_exe, Path(tmp) / "send.log")
            stage = f"{remote.rstrip('/')}.rx-{uuid.uuid4().hex[:8]}"
            landed = f"{stage}/{sent.name}"
            move = (
                f"mkdir -p {q(remote)} && cp -a {q(landed)}/. {q(remote)}/"
                if local_root.is_dir()
                else f"mkdir -p {q(remote)} && cp -a {q(landed)} {q(remote)}/"
            )
            try:
                result = pod.console.run(
                    f"(mkdir -p {q(stage)} && cd {q(stage)} && {q(pod_exe)} receive {q(code)} "
                    f"&& {move}; rc=$?; cd / && rm -rf {q(stage)}; exit $rc)",
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
                f"pod {pod.pod_id}: runpodctl receive failed ({result.exit_code}): "
                f"{result.output[-500:]}; try method 'pty'",
                pod_id=pod.pod_id,
            )

    def download(
        self,
        pod: PodLink,
        remote_root: str,
        local_root: Path,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """Send ``remote_root`` from the pod (in the background, output to a log file),
        receive it here, take the manifest's files from what arrived, make its empty
        directories and in-tree links, and verify against the manifest the pod computed;
        a mismatch is sent once more. ``on_progress`` is not called.

        Raises:
            SpecError: links on the pod that leave the tree or dangle (each named; with
                ``follow_links`` too: runpodctl cannot be told to copy through them).
            TransferError: no code in the pod's log within 60 s, or the local receive
                failed.
            ChecksumMismatchError: a file differs after one resend (named).
        """
        console, handle, pod_id = pod.console, pod.handle, pod.pod_id
        remote, local_dir = remote_root, local_root
        try:
            source = pod_manifest(console, handle, remote)
        except SpecError as exc:
            if not self.follow_links:
                raise
            raise SpecError(
                f"{exc}. runpodctl sends a folder its own way and cannot be told to copy "
                "through links: download with method 'pty' or 'sftp'",
                pod_id=pod_id,
            ) from exc
        local_dir.mkdir(parents=True, exist_ok=True)
        resent: list[str] = []

        def resend(bad: set[str]) -> None:
            resent.extend(bad)
            self._receive(pod, remote, local_dir, source)

        self._receive(pod, remote, local_dir, source)
        dest = verify_resending_once(
            source,
            lambda: local_tree_manifest(local_dir, source, pod_id),
            resend,
            method="runpodctl",
            direction="download",
            pod=pod_id,
        )
        total = sum(e["size_bytes"] for e in source["entries"])
        return MethodResult(
            bytes=total,
            sent_bytes=total * (2 if resent else 1),
            retries=1 if resent else 0,
            source_manifest=Manifest.from_dict(source),
            dest_manifest=Manifest.from_dict(dest),
        )

    def _receive(self, pod: PodLink, remote: str, local_dir: Path, source: dict[str, Any]) -> None:
        """One ``runpodctl send`` on the pod (in the background, its output in a log
        file) and ``receive`` here into a staging folder, from which only the files of
        ``source`` are taken."""
        console, pod_id, q = pod.console, pod.pod_id, shlex.quote
        log = f"/tmp/prefect-runpod-send-{uuid.uuid4().hex[:8]}.log"
        # started from a subshell, so it is no job of the console's shell: bash's
        # "[1]+ Done ..." notice would otherwise land in a later command's output
        console.run(
            f"( nohup {q(self.options.pod_exe)} send {q(remote)} > {q(log)} 2>&1 < /dev/null & )",
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
                f"pod {pod_id}: runpodctl send printed no code (log {log})", pod_id=pod_id
            )
        with tempfile.TemporaryDirectory(prefix="runpodctl-rx-", dir=local_dir.parent) as stage:
            done = subprocess.run(
                [self.options.local_exe, "receive", code],
                cwd=stage,
                capture_output=True,
                timeout=TRANSFER_TIMEOUT_SECONDS,
                check=False,
            )
            if done.returncode != 0:
                raise TransferError(
                    f"runpodctl receive failed: {done.stdout[-500:]!r}", pod_id=pod_id
                )
            landed = Path(stage) / Path(remote.rstrip("/")).name
            # Only the manifest's files are taken: whatever else arrived (links
            # runpodctl followed or kept) stays in the staging folder.
            for entry in mf.file_entries(source):
                rel = entry["path"].split("/")
                target = local_dir.joinpath(*rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink():
                    target.unlink()
                shutil.copyfile(landed.joinpath(*rel), target)
        console.run(f"rm -f {q(log)}", timeout_seconds=30)
