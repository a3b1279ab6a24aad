"""The pod tools folder: where the pod-side scripts live on a pod, and how they get there
(docs/architecture.md#transfers-and-integrity).

Every stage that runs a pod-side script (the receiver, ``manifest.py``, the launcher,
the watchdog, the probes) finds it through :func:`tools_dir`; this module is the one
place that names the folder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_runpod.blocks.exceptions import TransferError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult, refuse_links
from prefect_runpod.blocks.transfer.verify import structure_entries, verify_resending_once

if TYPE_CHECKING:
    from prefect_runpod.blocks.console.protocol import ConsoleLike
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.pod_handle import PodHandle

__all__ = [
    "POD_TOOLS_DIR",
    "PodLanding",
    "bootstrap_pod_tools",
    "manifest_command",
    "pod_manifest",
    "raise_for_tree_answer",
    "remote_path",
    "tools_dir",
]

POD_TOOLS_DIR = ".prefect-runpod/bin"
"""Where the pod-side scripts live, relative to ``handle.workdir``."""
_LINE_B64_CHARS = 3000  # base64 per console line: well under the tty's 4096-byte limit
_POD_SIDE = Path(mf.__file__).parent
_MANIFEST_TIMEOUT_SECONDS = 900


def remote_path(handle: PodHandle, path: str) -> str:
    """``path`` on the pod: absolute as given, else under ``handle.workdir``."""
    return path if path.startswith("/") else f"{handle.workdir.rstrip('/')}/{path}"


def tools_dir(handle: PodHandle) -> str:
    """The pod folder holding the pod-side scripts (``<workdir>/`` + ``POD_TOOLS_DIR``)."""
    return remote_path(handle, POD_TOOLS_DIR)


def bootstrap_pod_tools(console: ConsoleLike, handle: PodHandle) -> str:
    """Copy every ``blocks/pod_side/*.py`` into :func:`tools_dir` on the pod.

    Each file travels as base64 in console lines under 3000 characters (the tty cuts
    longer input lines at 4096 bytes), is decoded on the pod, checked against its
    sha256 and only then renamed into place. Files already there with the right
    sha256 are left alone, so a second call costs one command.

    Returns:
        The remote tools directory.

    Raises:
        TransferError: a file's sha256 differs after decoding (named).
        ConsoleError: as ``PodConsole.run``.
    """
    remote = tools_dir(handle)
    q = shlex.quote(remote)
    local = {
        p.name: p.read_bytes() for p in sorted(_POD_SIDE.glob("*.py")) if p.name != "__init__.py"
    }
    # A subshell: the caller's shell keeps its working directory.
    listing = console.run(
        f"mkdir -p {q} && (cd {q} && sha256sum -- *.py 2>/dev/null); true", timeout_seconds=60
    )
    have = {}
    for line in listing.output.splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64:
            have[parts[1].lstrip("*")] = parts[0]
    for name, data in local.items():
        digest = hashlib.sha256(data).hexdigest()
        if have.get(name) == digest:
            continue
        tmp = shlex.quote(f"{remote}/.{name}.b64")
        enc = base64.b64encode(data).decode("ascii")
        console.run(f": > {tmp}", timeout_seconds=60, check=True)
        for i in range(0, len(enc), _LINE_B64_CHARS):
            console.run(
                f"printf %s {enc[i : i + _LINE_B64_CHARS]} >> {tmp}", timeout_seconds=60, check=True
            )
        target = shlex.quote(f"{remote}/{name}")
        done = console.run(
            f"base64 -d {tmp} > {target}.tmp && echo '{digest}  '{target}.tmp | sha256sum -c --status"
            f" && chmod +x {target}.tmp && mv -f {target}.tmp {target} && rm -f {tmp}",
            timeout_seconds=60,
        )
        if done.exit_code != 0:
            raise TransferError(
                f"pod {handle.pod_id}: {name} did not arrive intact in {remote} "
                f"(sha256 check failed); rerun, the copy is idempotent",
                pod_id=handle.pod_id,
            )
    return remote


def manifest_command(
    tools: str,
    root: str,
    paths: list[str] | None = None,
    *,
    python: str = "python3",
    prefix_bytes: int | None = None,
    follow_links: bool = False,
    structure: list[dict[str, Any]] | None = None,
    missing_ok: bool = False,
    save_known: str | None = None,
    use_known: str | None = None,
) -> str:
    """The shell command that runs ``manifest.py`` (in the pod tools folder ``tools``)
    on ``root`` with the options of its command line: ``--files`` when ``paths`` is
    given (an empty list describes nothing), ``--prefix-bytes``, ``--follow-links``,
    ``--apply-b64`` for ``structure``, ``--missing-ok``, ``--save-known`` /
    ``--use-known`` (a pod file recording what one run hashed, for the next run of the
    same transfer: :class:`PodLanding`). With ``missing_ok`` a ``root`` that does not
    exist is answered by the shell (an empty manifest) without starting Python. Every
    method that asks the pod for a manifest builds the command here."""
    q = shlex.quote
    cmd = f"{q(python)} {q(tools + '/manifest.py')} {q(root)}"
    if prefix_bytes is not None:
        cmd += f" --prefix-bytes {prefix_bytes}"
    if follow_links:
        cmd += " --follow-links"
    if structure:
        blob = base64.b64encode(json.dumps(structure).encode()).decode("ascii")
        cmd += f" --apply-b64 {blob}"
    if missing_ok:
        cmd += " --missing-ok"
    if save_known:
        cmd += f" --save-known {q(save_known)}"
    if use_known:
        cmd += f" --use-known {q(use_known)}"
    if paths is not None:
        cmd += " --files" + "".join(f" {q(p)}" for p in paths)
    if missing_ok and not structure:
        # Nothing there yet (a first upload): the empty manifest, without starting Python.
        empty = json.dumps({"root": root, "entries": []})
        cmd = f"if [ -e {q(root)} ]; then {cmd}; else printf '%s\\n' {q(empty)}; fi"
    return cmd


def pod_manifest(
    console: PodConsole,
    handle: PodHandle,
    root: str,
    paths: list[str] | None = None,
    python: str = "python3",
    *,
    follow_links: bool = False,
    structure: list[dict[str, Any]] | None = None,
    missing_ok: bool = False,
    save_known: str | None = None,
    use_known: str | None = None,
) -> dict[str, Any]:
    """The manifest of ``root`` computed on the pod (``manifest.py`` in the tools folder)
    through a raw stream of the console (no output mangling, no line limits).

    Args:
        console: an open console to the pod; the tools must be installed
            (:func:`bootstrap_pod_tools`).
        handle: the pod.
        root: the pod folder (or file) to describe.
        paths: only these relative paths; None for the whole tree.
        python: the pod's interpreter.
        follow_links: read links that leave the tree through (whole tree only).
        structure: directory and link entries to make under ``root`` first
            (``manifest.apply_structure``); the manifest then covers them (or ``paths``).
        missing_ok: leave out the ``paths`` that do not exist (a missing ``root`` is
            an empty tree).
        save_known / use_known: as for :func:`manifest_command`.

    Returns:
        The plain form of ``pod_side.manifest`` (``{"root", "entries": [...]}``).

    Raises:
        SpecError: the tree holds links that leave it or dangle (each named; nothing
            was moved).
        TransferError: the script failed, printed no JSON within 900 s, or could not
            make the ``structure`` entries (each named).
    """
    cmd = manifest_command(
        tools_dir(handle),
        root,
        paths,
        python=python,
        follow_links=follow_links,
        structure=structure,
        missing_ok=missing_ok,
        save_known=save_known,
        use_known=use_known,
    )
    stream = console.open_stream(cmd + " 2>&1")
    chunks = []
    deadline = time.monotonic() + _MANIFEST_TIMEOUT_SECONDS
    while not stream.ended and time.monotonic() < deadline:
        chunks.append(stream.read(1 << 20, 1.0))
    chunks.append(stream.read(1 << 24, 0.1))
    code = stream.finish(30.0)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    for line in text.splitlines():
        if line.startswith('{"root"'):
            result: dict[str, Any] = json.loads(line)
            raise_for_tree_answer(result, handle, root, making=bool(structure))
            return result
    raise TransferError(
        f"pod {handle.pod_id}: manifest of {root} failed (exit {code}): {text[-500:]}",
        pod_id=handle.pod_id,
    )


class PodLanding:
    """The pod end of one upload to ``root`` by a method that moves files outside the
    console (``rsync``, ``s3``, ``runpodctl``; ``sftp`` does the same over exec): which
    files of ``source`` are there already, then the manifest of what landed.

    Each file is hashed on the pod once per upload: :meth:`in_place` records what it
    hashed (path, size, inode, device, mtime, ctime and digests) in a file of the pod
    tools folder, and the first :meth:`landed` reuses the entries of files unchanged
    since, and removes that file. A file the method wrote has a new inode or ctime and
    is hashed again, so the destination's bytes are always what is checked against
    ``source``.

    Args:
        console: an open console to the pod (tools installed).
        handle: the pod.
        root: the absolute pod folder the upload lands in.
        source: the manifest of the local tree being uploaded.
    """

    def __init__(self, console: PodConsole, handle: PodHandle, root: str, source: Manifest) -> None:
        self.console, self.handle, self.root, self.source = console, handle, root, source
        self.memo = f"{tools_dir(handle)}/known-{secrets.token_hex(8)}.json"

    def in_place(self) -> set[str]:
        """The files of ``source`` already under ``root`` with the same size and
        digests (absent ones are left out): the upload need not send them again."""
        source = self.source
        if not source.files:
            return set()
        paths = [e.path for e in source.files]
        found = pod_manifest(
            self.console, self.handle, self.root, paths, missing_ok=True, save_known=self.memo
        )["entries"]
        have = {e["path"]: (e.get("kind", "file"), e["size_bytes"], e["sha256"]) for e in found}
        return {
            e.path for e in source.files if have.get(e.path) == ("file", e.size_bytes, e.sha256)
        }

    def landed(self) -> dict[str, Any]:
        """After the upload: ``source``'s empty directories and links made under
        ``root``, then the pod's manifest of every entry of ``source``."""
        expected = self.source.as_dict()
        paths = [e["path"] for e in expected["entries"]]
        structure = structure_entries(expected)
        return pod_manifest(
            self.console, self.handle, self.root, paths, structure=structure, use_known=self.memo
        )

    def send_missing(
        self, send: Callable[[Manifest, bool], None], *, method: str, next_step: str | None = None
    ) -> MethodResult:
        """An upload by batches (``s3``, ``runpodctl``): ``send(files, again=False)``
        with the files not :meth:`in_place` (if any), the verify step over
        :meth:`landed`, ``send(files, again=True)`` with those that differ. Returns the
        ``MethodResult`` (``retries``: 1 after a resend); raises
        ``ChecksumMismatchError`` naming ``method`` and ``next_step``."""
        source = self.source
        todo = source.subset({e.path for e in source.files} - self.in_place())
        sent = [todo.total_bytes]
        if todo.entries:
            send(todo, False)

        def resend(bad: set[str]) -> None:
            again = source.subset(bad)
            sent.append(again.total_bytes)
            send(again, True)

        dest = verify_resending_once(
            source.as_dict(),
            self.landed,
            resend,
            method=method,
            direction="upload",
            pod=self.handle.pod_id,
            next_step=next_step,
        )
        return MethodResult(
            bytes=source.total_bytes,
            sent_bytes=sum(sent),
            retries=len(sent) - 1,
            source_manifest=source,
            dest_manifest=Manifest.from_dict(dest),
        )


def raise_for_tree_answer(
    answer: dict[str, Any], handle: PodHandle, root: str, *, making: bool
) -> None:
    """Raise when a pod-side manifest answer names links it could not carry or make.

    Args:
        answer: what ``manifest.py`` or the receiver answered.
        handle: the pod.
        root: the pod folder the answer is about.
        making: the answer is about making directories and links (a destination).

    Raises:
        SpecError: the source tree holds links that leave it or dangle (nothing moved).
        TransferError: directories or links could not be made at the destination.
    """
    problems = answer.get("problems")
    if not problems:
        return
    where = f"pod {handle.pod_id}: {root}"
    if making:
        listed = "; ".join(f"{path} ({why})" for path, why in problems[:20])
        raise TransferError(
            f"{where}: could not make {listed}; check the pod's disk and rerun",
            pod_id=handle.pod_id,
        )
    raise refuse_links(where, problems, pod_id=handle.pod_id)
