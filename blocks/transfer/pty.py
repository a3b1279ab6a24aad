"""The ``pty`` transfer method: files through a PodConsole tty, framed and acknowledged.

Works wherever a shell works, including RunPod's PTY-only gateway (no exec, no SFTP).
The flow side of the protocol in :mod:`prefect_runpod.blocks.pod_side.receiver`
(which also holds the shared frame codec):

* chunks (default 256 KiB) are base64 in lines under 4000 characters, each with a
  CRC-32 bound to its file and offset, optionally zlib-compressed;
* chunks are pipelined: up to ``window_bytes`` are in flight before the first
  acknowledgement comes back, never stop-and-wait (a gateway is 50–150 ms away);
* a bad or missing chunk is answered with the receiver's verified offset and the
  sender goes back to it (go-back-N, with an epoch so stale answers are ignored);
* every file is verified whole (sha256) before it replaces its name; a mismatch
  retries the file once, then raises :class:`ChecksumMismatchError` naming it;
* a dropped connection reconnects and resumes from the verified offset, which the
  receiver keeps on disk as ``<name>.part`` (+ ``.part.json`` sidecar).

``pty_upload`` / ``pty_download`` run the protocol over anything with
``write(bytes)``, ``read(max_bytes, timeout_seconds)`` and ``finish(timeout_seconds)``;
``PtyMethod`` is the ``TransferMethod`` that runs them over ``PodConsole.open_stream``
(a ``PtyStream``). Both answer with a ``MethodResult``.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prefect_runpod.blocks.exceptions import (
    ChecksumMismatchError,
    ConsoleError,
    SpecError,
    TransferError,
)
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.pod_side.receiver import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_LINE_CHARS,
    PROTOCOL_VERSION,
    FrameParser,
    b64text,
    encode_frame,
    unb64text,
)
from prefect_runpod.blocks.transfer.base import (
    MethodConfig,
    MethodOptions,
    PodLink,
    ProgressCallback,
    TransferHooks,
)
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult, tree_refusal

if TYPE_CHECKING:
    from prefect_runpod.blocks.pod_handle import PodHandle

__all__ = ["ByteStream", "PtyMethod", "PtyOptions", "pty_download", "pty_upload"]


class ByteStream(Protocol):
    """The byte pipe the protocol runs over (``PtyStream`` satisfies it)."""

    def write(self, data: bytes) -> None: ...

    def read(self, max_bytes: int = 65536, timeout_seconds: float = 1.0) -> bytes: ...

    def finish(self, timeout_seconds: float = 30.0) -> int: ...


@dataclass
class PtyOptions(MethodOptions):
    """Tuning of the ``pty`` method.

    Attributes:
        chunk_bytes: payload bytes per frame.
        window_bytes: payload bytes in flight before waiting for acknowledgements.
        line_chars: base64 characters per line (under the tty's 4096-byte limit).
        compress: zlib each chunk when it shrinks (text bundles).
        stall_seconds: seconds of silence while waiting before asking the receiver
            where it is.
        ready_timeout_seconds: seconds the receiver may take to start.
        max_reconnects: dropped connections survived before giving up.
        python: the pod's interpreter.
        shell_prefix: shell text run before the receiver in the same subshell
            (e.g. ``ulimit -f 64;``); never secrets.
    """

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    window_bytes: int = 8 * 1024 * 1024
    line_chars: int = DEFAULT_LINE_CHARS
    compress: bool = False
    stall_seconds: float = 15.0
    ready_timeout_seconds: float = 60.0
    max_reconnects: int = 5
    python: str = "python3"
    shell_prefix: str = ""


_MAX_REWINDS = 20  # a file refused this often in a row without progress fails


class _Dropped(Exception):
    """The stream died or went silent; reconnect and resume."""


_DROP_ERRORS: tuple[type[BaseException], ...] = (ConsoleError, OSError, EOFError)
try:  # paramiko's errors when a channel dies under us
    import paramiko

    _DROP_ERRORS = (*_DROP_ERRORS, paramiko.SSHException)
except ImportError:  # pragma: no cover
    pass


class _Session:
    """One receiver process behind one stream."""

    def __init__(self, stream: ByteStream, hooks: TransferHooks, opts: PtyOptions):
        self.stream, self.hooks, self.opts = stream, hooks, opts
        self.parser = FrameParser()
        self.last_rx = time.monotonic()

    def write(self, data: bytes) -> None:
        try:
            self.stream.write(data)
        except _DROP_ERRORS as exc:
            raise _Dropped(str(exc)) from exc

    def line(self, *fields: object) -> None:
        self.write((" ".join(str(f) for f in fields) + "\n").encode("ascii"))

    def poll(self, timeout_seconds: float) -> list[tuple[str, Any]]:
        try:
            data = self.stream.read(1 << 20, timeout_seconds)
        except _DROP_ERRORS as exc:
            raise _Dropped(str(exc)) from exc
        if not data:
            if getattr(self.stream, "ended", False):
                raise _Dropped(
                    "the receiver exited (code {})".format(getattr(self.stream, "exit_code", "?"))
                )
            return []
        self.last_rx = time.monotonic()
        return self.parser.feed(self.hooks.data_in(data))

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.opts.ready_timeout_seconds
        while time.monotonic() < deadline:
            try:
                events = self.poll(0.5)
            except _Dropped as exc:
                if getattr(self.stream, "ended", False):
                    raise TransferError(
                        f"the pod's receiver did not start ({exc}); check that "
                        f"`{self.opts.python}` runs on the pod and the tools are installed"
                    ) from exc
                raise
            for kind, ev in events:
                if kind == "line" and ev[0] == "#READY":
                    if ev[1:2] != [PROTOCOL_VERSION]:
                        raise TransferError(
                            f"the pod's receiver speaks protocol {ev[1:2]}, this side "
                            f"{PROTOCOL_VERSION}; rerun so the pod's tools are copied again"
                        )
                    return
        raise _Dropped(
            f"the pod's receiver did not start within {self.opts.ready_timeout_seconds:.0f} s"
        )

    def blob(self, request: dict[str, Any], timeout_seconds: float) -> dict[str, Any]:
        self.write(
            encode_frame("M", 0, 0, json.dumps(request).encode(), True, self.opts.line_chars)
        )
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            for kind, ev in self.poll(0.5):
                if kind == "frame" and ev.fid == "M":
                    if ev.raw is None:
                        raise _Dropped(f"manifest answer garbled ({ev.error})")
                    result: dict[str, Any] = json.loads(ev.raw)
                    return result
        raise _Dropped(f"no manifest answer within {timeout_seconds:.0f} s")

    def close(self) -> None:
        try:
            self.line("#BYE")
            self.stream.finish(30.0)
        except _DROP_ERRORS:
            pass


def receiver_command(tools_dir: str, remote_root: str, opts: PtyOptions) -> str:
    """The shell command that starts the receiver (in a subshell, so a prefix such as
    ``ulimit`` does not stick to the console's shell)."""
    cmd = (
        f"{shlex.quote(opts.python)} -u {shlex.quote(tools_dir + '/receiver.py')} "
        f"--root {shlex.quote(remote_root)} --chunk-bytes {opts.chunk_bytes} "
        f"--window-bytes {opts.window_bytes} --line-chars {opts.line_chars}"
    )
    return f"({opts.shell_prefix} exec {cmd})" if opts.shell_prefix else cmd


@dataclass
class _File:
    fid: str
    rel: str
    size: int
    sha256: str
    md5: str = ""
    local: Path | None = None
    next: int = 0
    acked: int = 0
    epoch: int = 0
    close_sent: bool = False
    done: bool = False
    bad: int = 0
    rewinds: int = 0  # go-backs since the last acknowledged chunk
    fh: Any = None
    hashers: Any = None


def _resilient(
    run_session: Callable[[_Session], MethodResult],
    open_stream: Callable[[str], ByteStream],
    command: str,
    reconnect: Callable[[], None] | None,
    hooks: TransferHooks,
    opts: PtyOptions,
    pod: str,
) -> MethodResult:
    reconnects = 0
    while True:
        session = None
        try:
            session = _Session(open_stream(command), hooks, opts)
            session.wait_ready()
            result = run_session(session)
            session.close()
            return result.model_copy(update={"reconnects": reconnects})
        except (TransferError, SpecError, KeyboardInterrupt):
            if session is not None:
                session.close()  # end the receiver so the console is usable again
            raise
        except (_Dropped, *_DROP_ERRORS) as exc:  # type: ignore[misc]
            reconnects += 1
            if reconnects > opts.max_reconnects or reconnect is None:
                raise TransferError(
                    f"pty transfer to pod {pod} lost its connection {reconnects} times "
                    f"(last: {exc}); check the pod is running, then rerun — finished "
                    "files are kept and partial ones resume",
                    pod_id=pod,
                ) from exc
            reconnect()


def pty_upload(
    open_stream: Callable[[str], ByteStream],
    tools_dir: str,
    local_root: Path,
    remote_root: str,
    source: Manifest,
    *,
    reconnect: Callable[[], None] | None = None,
    options: PtyOptions | None = None,
    hooks: TransferHooks | None = None,
    on_progress: ProgressCallback | None = None,
    pod: str = "?",
) -> MethodResult:
    """Upload the files of ``source`` (a manifest of ``local_root``) to ``remote_root``.

    Args:
        open_stream: runs a shell command in a raw tty and returns its stream.
        tools_dir: the pod folder holding ``receiver.py`` and ``manifest.py``.
        local_root: the local tree (or single file) the manifest was computed on.
        remote_root: destination folder on the pod (created when missing).
        source: ``Manifest.compute(local_root)``.
        reconnect: re-opens the SSH connection after a drop (``PodConsole.reconnect``).
        options: tuning; default ``PtyOptions()``.
        hooks: fault points; default none.
        on_progress: ``(done_bytes, total_bytes)`` after each acknowledged chunk.
        pod: the pod id, for messages.

    Returns:
        ``MethodResult``: ``dest_manifest`` was computed on the pod from the files on
        its disk and matches ``source``; ``retries`` counts re-sent chunks and files.

    Raises:
        ChecksumMismatchError: a file still differs after one retry (named).
        TransferError: the pod refused a write (disk full, size limit: file named) or
            the connection kept dropping.
    """
    opts = options or PtyOptions()
    hooks = hooks or TransferHooks()
    expected = source.as_dict()
    single = local_root.is_file()
    files = [
        _File(
            str(i),
            e["path"],
            e["size_bytes"],
            e["sha256"],
            e["md5"],
            local_root if single else local_root.joinpath(*e["path"].split("/")),
        )
        for i, e in enumerate(mf.file_entries(expected))
    ]
    structure = [e for e in expected["entries"] if e.get("kind", "file") != "file"]
    every_path = [e["path"] for e in expected["entries"]]
    total = sum(f.size for f in files)
    stats = {"retries": 0}

    def session_run(s: _Session) -> MethodResult:
        _upload_files(s, [f for f in files if not f.done], stats, total, files, on_progress, pod)
        for attempt in range(2):
            # The receiver makes the empty directories and links, then hashes the tree.
            dest = s.blob({"paths": every_path, "structure": structure}, 600.0)
            if dest.get("problems"):
                listed = "; ".join(f"{path} ({why})" for path, why in dest["problems"][:20])
                raise TransferError(
                    f"pod {pod}: could not make {listed} under {remote_root}", pod_id=pod
                )
            if "error" in dest:
                raise TransferError(
                    f"pod {pod}: manifest of {remote_root} failed: {dest['error']}", pod_id=pod
                )
            problems = mf.compare_manifests(expected, dest)
            if not problems:
                return MethodResult(
                    bytes=total,
                    retries=stats["retries"],
                    source_manifest=source,
                    dest_manifest=Manifest.from_dict(dest),
                )
            bad = {p for p, _ in problems}
            if attempt == 1:
                path, why = problems[0]
                raise ChecksumMismatchError(
                    f"{path} on pod {pod} differs from the local file after a retry ({why}); "
                    "the pod's disk may be failing: rerun on a new pod",
                    path=path,
                    pod_id=pod,
                    stage="upload",
                )
            redo = [f for f in files if f.rel in bad]
            for f in redo:
                f.done, f.next, f.acked, f.epoch = False, 0, 0, f.epoch + 1
                stats["retries"] += 1
            _upload_files(s, redo, stats, total, files, on_progress, pod)
        raise AssertionError("unreachable")

    try:
        return _resilient(
            session_run,
            open_stream,
            receiver_command(tools_dir, remote_root, opts),
            reconnect,
            hooks,
            opts,
            pod,
        )
    finally:
        for f in files:
            if f.fh is not None:
                f.fh.close()


def _upload_files(
    s: _Session,
    todo: list[_File],
    stats: dict[str, int],
    total: int,
    every: list[_File],
    on_progress: ProgressCallback | None,
    pod: str,
) -> None:
    opts, by_fid = s.opts, {f.fid: f for f in todo}
    for f in todo:
        f.close_sent = False
        f.epoch += 1
        s.line("#OPEN", f.fid, f.size, f.sha256, b64text(f.rel))
    opened: set[str] = set()
    while len(opened) < len(todo):
        events = s.poll(0.5)
        for kind, ev in events:
            if kind == "line" and ev[0] == "#O" and ev[1] in by_fid:
                f = by_fid[ev[1]]
                f.next = f.acked = int(ev[2])
                f.done = ev[3] == "done"
                opened.add(f.fid)
            elif kind == "line" and ev[0] == "#X":
                _raise_pod_error(ev, by_fid, pod)
        if not events and time.monotonic() - s.last_rx > opts.stall_seconds:
            raise _Dropped("no answer to OPEN")
    sendq = deque(f for f in todo if not f.done)
    inflight: dict[tuple[str, int, int], int] = {}
    stalls = 0

    def rewind(f: _File, offset: int) -> None:
        for key in [k for k in inflight if k[0] == f.fid]:
            del inflight[key]
        f.epoch += 1
        f.next = f.acked = offset
        f.close_sent = False
        if f not in sendq:
            sendq.appendleft(f)

    while not all(f.done for f in todo):
        budget = opts.window_bytes - sum(inflight.values())
        while sendq and budget > 0:
            f = sendq[0]
            if f.next < f.size:
                if f.fh is None:
                    f.fh = open(f.local, "rb")  # type: ignore[arg-type]  # noqa: SIM115
                f.fh.seek(f.next)
                raw = f.fh.read(min(opts.chunk_bytes, f.size - f.next))
                if not raw:
                    raise TransferError(
                        f"{f.rel} shrank while uploading to pod {pod}; rerun", pod_id=pod
                    )
                frame = encode_frame(f.fid, f.epoch, f.next, raw, opts.compress, opts.line_chars)
                s.write(s.hooks.frame_out(f.fid, f.next, frame))
                inflight[(f.fid, f.epoch, f.next)] = len(raw)
                f.next += len(raw)
                budget -= len(raw)
            else:
                if not f.close_sent:
                    s.line("#CLOSE", f.fid)
                    f.close_sent = True
                sendq.popleft()
        waiting = not sendq or budget <= 0
        events = s.poll(0.2 if waiting else 0.0)
        for kind, ev in events:
            if kind != "line" or len(ev) < 2 or ev[1] not in by_fid:
                continue
            tag, f = ev[0], by_fid[ev[1]]
            if tag in ("#A", "#N"):
                key = (f.fid, int(ev[2]), int(ev[3]))
                inflight.pop(key, None)
                if key[1] != f.epoch or f.done:
                    continue
                if tag == "#A":
                    f.acked = max(f.acked, int(ev[4]))
                    f.rewinds = 0
                    done = sum(x.acked if not x.done else x.size for x in every)
                    s.hooks.progress(done)
                    if on_progress:
                        on_progress(done, total)
                else:
                    stats["retries"] += 1
                    f.rewinds += 1
                    if f.rewinds > _MAX_REWINDS:
                        raise TransferError(
                            f"pod {pod}: {f.rel} was refused {f.rewinds} times in a row at "
                            f"offset {ev[4]} (last: {' '.join(ev[5:]) or '?'}); the link "
                            "damages every chunk: rerun, or use another method",
                            pod_id=pod,
                            stage="upload",
                        )
                    rewind(f, int(ev[4]))
            elif tag == "#C":
                f.done, f.md5 = True, ev[3]
                if f.fh is not None:
                    f.fh.close()
                    f.fh = None
            elif tag in ("#I", "#S") and not f.done:
                stats["retries"] += 1
                rewind(f, int(ev[2]))
            elif tag == "#BAD":
                f.bad += 1
                if f.bad > 1:
                    raise ChecksumMismatchError(
                        f"{f.rel} arrived on pod {pod} with sha256 {ev[3]} instead of "
                        f"{f.sha256}, twice; was it changed while uploading? Rerun",
                        path=f.rel,
                        expected=f.sha256,
                        actual=ev[3],
                        pod_id=pod,
                        stage="upload",
                    )
                stats["retries"] += 1
                s.line("#OPEN", f.fid, f.size, f.sha256, b64text(f.rel))
                rewind(f, 0)
            elif tag == "#X":
                _raise_pod_error(ev, by_fid, pod)
        if events:
            stalls = 0
        elif waiting and time.monotonic() - s.last_rx > opts.stall_seconds:
            stalls += 1
            if stalls > 2:
                raise _Dropped("the receiver stopped answering")
            s.last_rx = time.monotonic()
            for f in todo:
                if not f.done:
                    s.line("#SYNC", f.fid)


def _raise_pod_error(ev: list[str], by_fid: dict[str, _File], pod: str) -> None:
    f = by_fid.get(ev[1])
    message = unb64text(ev[3]) if len(ev) > 3 else "error"
    name = f.rel if f else ev[1]
    raise TransferError(
        f"pod {pod}: {message} ({ev[2]}) — file {name}; free space in the pod's volume "
        "(or rent a bigger disk) and rerun",
        pod_id=pod,
        stage="upload",
    )


def pty_download(
    open_stream: Callable[[str], ByteStream],
    tools_dir: str,
    remote_root: str,
    local_root: Path,
    *,
    reconnect: Callable[[], None] | None = None,
    options: PtyOptions | None = None,
    hooks: TransferHooks | None = None,
    on_progress: ProgressCallback | None = None,
    pod: str = "?",
    follow_links: bool = False,
) -> MethodResult:
    """Download the tree ``remote_root`` from the pod into ``local_root``.

    The pod computes the source manifest first (links that leave the tree or dangle
    are refused there, unless ``follow_links``); each file lands as ``<name>.part``
    (+ sidecar), is verified whole, and only then takes its name; empty directories
    and in-tree links are made last. Arguments as ``pty_upload``.

    Returns:
        ``MethodResult``: ``source_manifest`` computed on the pod, ``dest_manifest``
        re-read from the local disk and matching it.

    Raises:
        SpecError: links on the pod that leave the tree or dangle (each named; nothing
            moved).
        ChecksumMismatchError: a file still differs after one retry (named).
        TransferError: the folder is missing on the pod, or the connection kept dropping.
    """
    opts = options or PtyOptions()
    hooks = hooks or TransferHooks()
    local_root.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"source": None, "retries": 0}
    files: list[_File] = []

    def session_run(s: _Session) -> MethodResult:
        if state["source"] is None:
            src = s.blob({"paths": None, "follow_links": follow_links}, 600.0)
            if src.get("problems"):
                raise SpecError(tree_refusal(f"pod {pod}: {remote_root}", src["problems"]))
            if "error" in src:
                raise TransferError(
                    f"pod {pod}: cannot read {remote_root}: {src['error']}; check the path",
                    pod_id=pod,
                    stage="download",
                )
            state["source"] = src
            files.extend(
                _File(
                    str(i),
                    e["path"],
                    e["size_bytes"],
                    e["sha256"],
                    e["md5"],
                    local_root.joinpath(*e["path"].split("/")),
                )
                for i, e in enumerate(mf.file_entries(src))
            )
        src = state["source"]
        total = sum(f.size for f in files)
        for attempt in range(2):
            _download_files(
                s, [f for f in files if not f.done], state, total, files, on_progress, pod
            )
            made = mf.apply_structure(str(local_root), src["entries"])
            if made:
                listed = "; ".join(f"{path} ({why})" for path, why in made[:20])
                raise TransferError(f"could not make {listed} under {local_root}", pod_id=pod)
            dest = mf.compute_manifest(str(local_root), [e["path"] for e in src["entries"]])
            problems = mf.compare_manifests(src, dest)
            if not problems:
                return MethodResult(
                    bytes=total,
                    retries=state["retries"],
                    source_manifest=Manifest.from_dict(src),
                    dest_manifest=Manifest.from_dict(dest),
                )
            bad = {p for p, _ in problems}
            if attempt == 1:
                path, why = problems[0]
                raise ChecksumMismatchError(
                    f"{path} from pod {pod} differs from the pod's copy after a retry ({why}); "
                    "check the local disk and rerun the download",
                    path=path,
                    pod_id=pod,
                    stage="download",
                )
            for f in files:
                if f.rel in bad:
                    f.done = False
                    state["retries"] += 1
                    assert f.local is not None
                    f.local.unlink(missing_ok=True)
        raise AssertionError("unreachable")

    try:
        return _resilient(
            session_run,
            open_stream,
            receiver_command(tools_dir, remote_root, opts),
            reconnect,
            hooks,
            opts,
            pod,
        )
    finally:
        for f in files:
            if f.fh is not None:
                f.fh.close()
                f.fh = None


def _local_part_open(f: _File) -> None:
    """Open ``f.local``'s ``.part`` for appending, keeping a verified prefix when its
    sidecar names the same target, and seed the running hashes with that prefix."""
    import hashlib

    assert f.local is not None
    f.local.parent.mkdir(parents=True, exist_ok=True)
    part = Path(str(f.local) + mf.PART_SUFFIX)
    side = Path(str(f.local) + mf.SIDECAR_SUFFIX)
    keep = 0
    if part.is_file() and side.is_file():
        try:
            meta = json.loads(side.read_text())
            if meta.get("size") == f.size and meta.get("sha256") == f.sha256:
                keep = min(part.stat().st_size, f.size)
        except ValueError:
            keep = 0
    if keep == 0:
        side.write_text(json.dumps({"size": f.size, "sha256": f.sha256}))
    if f.fh is not None:
        f.fh.close()
    f.fh = open(part, "r+b" if keep else "wb", buffering=0)  # noqa: SIM115
    f.fh.truncate(keep)
    md5, sha = hashlib.md5(), hashlib.sha256()
    f.fh.seek(0)
    left = keep
    while left:
        buf = f.fh.read(min(left, 4 << 20))
        md5.update(buf)
        sha.update(buf)
        left -= len(buf)
    f.hashers = (md5, sha)
    f.next = keep


def _download_files(
    s: _Session,
    todo: list[_File],
    state: dict[str, Any],
    total: int,
    every: list[_File],
    on_progress: ProgressCallback | None,
    pod: str,
) -> None:
    opts, by_fid = s.opts, {f.fid: f for f in todo}
    pending = []
    for f in todo:
        assert f.local is not None
        if (
            f.local.is_file()
            and f.local.stat().st_size == f.size
            and mf.hash_file(str(f.local))[2] == f.sha256
        ):
            f.done = True
            continue
        _local_part_open(f)
        f.epoch += 1
        s.line("#GET", f.fid, f.epoch, f.next, b64text(f.rel))
        pending.append(f)
    stalls = 0
    while not all(f.done for f in pending):
        events = s.poll(0.5)
        for kind, ev in events:
            if kind == "frame":
                s.line("#A", ev.fid, ev.epoch, ev.offset)
                got = by_fid.get(ev.fid)
                if got is None or got.done or ev.epoch != got.epoch:
                    continue
                f = got
                if ev.raw is None or ev.offset != f.next:
                    state["retries"] += 1
                    f.rewinds += 1
                    if f.rewinds > _MAX_REWINDS:
                        raise TransferError(
                            f"pod {pod}: {f.rel} arrived damaged {f.rewinds} times in a row "
                            f"at offset {f.next} ({ev.error or 'out of order'}); rerun, or "
                            "use another method",
                            pod_id=pod,
                            stage="download",
                        )
                    f.epoch += 1
                    s.line("#GET", f.fid, f.epoch, f.next, b64text(f.rel))
                    continue
                f.rewinds = 0
                f.fh.write(ev.raw)
                f.hashers[0].update(ev.raw)
                f.hashers[1].update(ev.raw)
                f.next += len(ev.raw)
                done = sum(x.next if not x.done else x.size for x in every)
                s.hooks.progress(done)
                if on_progress:
                    on_progress(done, total)
            elif ev[0] == "#E" and ev[1] in by_fid:
                f = by_fid[ev[1]]
                if f.done or int(ev[2]) != f.epoch:
                    continue
                _finish_download(s, f, state, pod)
            elif ev[0] == "#X":
                missing = by_fid.get(ev[1])
                raise TransferError(
                    f"pod {pod}: cannot read {missing.rel if missing else ev[1]}: {unb64text(ev[3])}",
                    pod_id=pod,
                    stage="download",
                )
        if events:
            stalls = 0
        elif time.monotonic() - s.last_rx > opts.stall_seconds:
            stalls += 1
            if stalls > 2:
                raise _Dropped("the pod's sender stopped")
            s.last_rx = time.monotonic()
            for f in pending:
                if not f.done:
                    f.epoch += 1
                    s.line("#GET", f.fid, f.epoch, f.next, b64text(f.rel))


def _finish_download(s: _Session, f: _File, state: dict[str, Any], pod: str) -> None:
    assert f.local is not None
    sha = f.hashers[1].hexdigest()
    if f.next == f.size and sha == f.sha256:
        f.fh.close()
        f.fh = None
        os.replace(str(f.local) + mf.PART_SUFFIX, f.local)
        Path(str(f.local) + mf.SIDECAR_SUFFIX).unlink(missing_ok=True)
        f.done = True
        return
    f.bad += 1
    if f.bad > 1:
        raise ChecksumMismatchError(
            f"{f.rel} from pod {pod}: got {f.next} bytes with sha256 {sha}, expected "
            f"{f.size} bytes with {f.sha256}, twice; did it change on the pod? Rerun",
            path=f.rel,
            expected=f.sha256,
            actual=sha,
            pod_id=pod,
            stage="download",
        )
    state["retries"] += 1
    Path(str(f.local) + mf.PART_SUFFIX).unlink(missing_ok=True)
    _local_part_open(f)
    f.epoch += 1
    s.line("#GET", f.fid, f.epoch, 0, b64text(f.rel))


class PtyMethod:
    """The ``pty`` ``TransferMethod``: the framed protocol through the console's tty.

    Works wherever a shell works, so it is always available and the last choice of
    ``auto``.

    Args:
        options: tuning; default ``PtyOptions()``.
        hooks: fault points; default none.
    """

    auto_priority: int | None = 10

    def __init__(
        self,
        options: PtyOptions | None = None,
        hooks: TransferHooks | None = None,
        *,
        follow_links: bool = False,
    ):
        self.options = options or PtyOptions()
        self.hooks = hooks
        self.follow_links = follow_links

    @classmethod
    def from_config(cls, config: MethodConfig) -> PtyMethod:
        """The method with the caller's ``PtyOptions`` (if any), hooks and link choice."""
        return cls(config.options_for(PtyOptions), config.hooks, follow_links=config.follow_links)

    def unavailable(self, handle: PodHandle) -> str | None:
        """Always None: a console is all it needs."""
        return None

    def pod_unavailable(self, pod: PodLink) -> str | None:
        """Always None: the receiver is one of the pod tools, already installed."""
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
        """``pty_upload`` over ``pod.console``, reconnecting it after a drop."""
        return pty_upload(
            pod.console.open_stream,
            pod.tools_dir,
            local_root,
            remote_root,
            source,
            reconnect=pod.console.reconnect,
            options=self.options,
            hooks=self.hooks,
            on_progress=on_progress,
            pod=pod.pod_id,
        )

    def download(
        self,
        pod: PodLink,
        remote_root: str,
        local_root: Path,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """``pty_download`` over ``pod.console``, reconnecting it after a drop."""
        return pty_download(
            pod.console.open_stream,
            pod.tools_dir,
            remote_root,
            local_root,
            reconnect=pod.console.reconnect,
            options=self.options,
            hooks=self.hooks,
            on_progress=on_progress,
            pod=pod.pod_id,
            follow_links=self.follow_links,
        )
