"""The upload half of the ``pty`` method: files from here to the pod's receiver
(docs/architecture.md#the-pty-framing).

Chunks are pipelined up to the session's window (``PathWindow``: at least twice the
bandwidth-delay product); a refused, damaged or out-of-order chunk sends the sender
back to the receiver's verified offset with a new epoch (go-back-N); each file is
verified whole (sha256) on the pod before it takes its name. With several streams a
large file travels as segments, one per session, joined and verified on the pod.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.exceptions import ChecksumMismatchError, TransferError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.pod_side.frame_codec import b64text, encode_frame, unb64text
from prefect_runpod.blocks.transfer.base import ProgressCallback, TransferHooks
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult
from prefect_runpod.blocks.transfer.pty.lanes import (
    MAX_REWINDS,
    Lane,
    Piece,
    Striped,
    Tally,
    choose_compression,
)
from prefect_runpod.blocks.transfer.pty.options import PtyOptions
from prefect_runpod.blocks.transfer.pty.run import Transfer
from prefect_runpod.blocks.transfer.pty.session import (
    ByteStream,
    Dropped,
    PathWindow,
    Session,
    receiver_command,
)
from prefect_runpod.blocks.transfer.verify import structure_entries, verify_resending_once

__all__ = ["pty_upload", "send_pieces"]


def _raise_pod_error(ev: list[str], by_fid: dict[str, Piece], pod: str) -> None:
    f = by_fid.get(ev[1])
    message = unb64text(ev[3]) if len(ev) > 3 else "error"
    name = f.rel if f else ev[1]
    raise TransferError(
        f"pod {pod}: {message} ({ev[2]}) — file {name}; free space in the pod's volume "
        "(or rent a bigger disk) and rerun",
        pod_id=pod,
        stage="upload",
    )


def _open_line(p: Piece) -> tuple[object, ...]:
    head = ("#OPEN", p.fid, p.size, p.sha256, b64text(p.rel))
    return (*head, p.start, p.end, p.index) if p.segment else head


def _bad_twice(p: Piece, actual: str, pod: str) -> ChecksumMismatchError:
    return ChecksumMismatchError(
        f"{p.rel} arrived on pod {pod} with sha256 {actual} instead of "
        f"{p.sha256}, twice; was it changed while uploading? Rerun",
        path=p.rel,
        expected=p.sha256,
        actual=actual,
        pod_id=pod,
        stage="upload",
    )


class _InFlight:
    """What one session has sent and not yet heard back about: the files still to send
    (``queue``), each chunk awaiting its answer (``chunks``: ``(fid, epoch, offset)`` ->
    ``(bytes, sent at)``) and their bytes (``bytes``)."""

    def __init__(self, todo: list[Piece]) -> None:
        self.queue = deque(p for p in todo if not p.done)
        self.chunks: dict[tuple[str, int, int], tuple[int, float]] = {}
        self.bytes = 0

    def forget(self, p: Piece) -> None:
        for key in [k for k in self.chunks if k[0] == p.fid]:
            self.bytes -= self.chunks.pop(key)[0]

    def rewind(self, p: Piece, offset: int) -> None:
        self.forget(p)
        p.epoch += 1
        p.next = p.acked = offset
        p.close_sent = False
        if p not in self.queue:
            self.queue.appendleft(p)


def _open_pieces(s: Session, todo: list[Piece], by_fid: dict[str, Piece], run: Transfer) -> None:
    """Announce every piece (``#OPEN``) and wait until the receiver said for each where
    it stands (``#O``: its verified offset, or done)."""
    opts, pod, tally, crew = s.opts, s.pod, run.tally, run.crew
    for p in todo:
        p.close_sent = False
        p.epoch += 1
        s.line(*_open_line(p))
    opened: set[str] = set()
    while len(opened) < len(todo):
        crew.check()
        events = s.poll(0.5)
        for kind, ev in events:
            if kind == "line" and ev[0] == "#O" and ev[1] in by_fid:
                p = by_fid[ev[1]]
                p.next = p.acked = int(ev[2])
                p.done = ev[3] == "done"
                tally.move(p, p.end - p.start if p.done else p.acked - p.start)
                opened.add(p.fid)
            elif kind == "line" and ev[0] == "#X":
                _raise_pod_error(ev, by_fid, pod)
        if not events and time.monotonic() - s.last_rx > opts.stall_seconds:
            raise Dropped("no answer to OPEN")


def _on_answer(
    s: Session,
    q: _InFlight,
    ev: list[str],
    by_fid: dict[str, Piece],
    window: PathWindow,
    run: Transfer,
) -> None:
    """Act on one answer of the receiver about piece ``ev[1]``: an acknowledged or
    refused chunk, a finished file or segment, a verified offset to resume from, a file
    that arrived wrong, or a write the pod refused."""
    pod, tally, stats = s.pod, run.tally, run.stats
    tag, p = ev[0], by_fid[ev[1]]
    if tag in ("#A", "#N"):
        key = (p.fid, int(ev[2]), int(ev[3]))
        sent = q.chunks.pop(key, None)
        if sent is not None:
            q.bytes -= sent[0]
        if key[1] != p.epoch or p.done:
            return
        if tag == "#A":
            p.acked = max(p.acked, int(ev[4]))
            p.rewinds = 0
            if sent is not None:
                window.on_rtt(time.monotonic() - sent[1])
            tally.move(p, p.acked - p.start)
            window.on_acked(tally.done)
        else:
            stats["retries"] += 1
            p.rewinds += 1
            if p.rewinds > MAX_REWINDS:
                raise TransferError(
                    f"pod {pod}: {p.rel} was refused {p.rewinds} times in a row at "
                    f"offset {ev[4]} (last: {' '.join(ev[5:]) or '?'}); the link "
                    "damages every chunk: rerun, or use another method",
                    pod_id=pod,
                    stage="upload",
                )
            q.rewind(p, int(ev[4]))
    elif tag in ("#C", "#K"):
        p.done = True
        p.close()
    elif tag in ("#I", "#S") and not p.done:
        stats["retries"] += 1
        q.rewind(p, int(ev[2]))
    elif tag == "#BAD":
        p.bad += 1
        if p.bad > 1:
            raise _bad_twice(p, ev[3], pod)
        stats["retries"] += 1
        s.line(*_open_line(p))
        q.rewind(p, p.start)
        tally.move(p, 0)
    elif tag == "#X":
        _raise_pod_error(ev, by_fid, pod)


def send_pieces(s: Session, todo: list[Piece], window: PathWindow, run: Transfer) -> None:
    """Send ``todo`` through one session until the receiver has every piece (whole
    files verified and named, segments complete).

    Raises:
        ChecksumMismatchError: a file arrived wrong twice (named).
        TransferError: the pod refused a write (disk full, size limit: file named), or
            refused one piece more than ``MAX_REWINDS`` times in a row.
        Dropped: the receiver stopped answering.
    """
    opts, pod, by_fid = s.opts, s.pod, {p.fid: p for p in todo}
    crew = run.crew
    _open_pieces(s, todo, by_fid, run)
    q = _InFlight(todo)
    stalls = 0
    while not all(p.done for p in todo):
        crew.check()
        budget = window.bytes - q.bytes
        while q.queue and budget > 0:
            p = q.queue[0]
            if p.next < p.end:
                if p.fh is None:
                    assert p.local is not None
                    p.fh = open(p.local, "rb")  # noqa: SIM115
                p.fh.seek(p.next)
                raw = p.fh.read(min(opts.chunk_bytes, p.end - p.next))
                if not raw:
                    raise TransferError(
                        f"{p.rel} shrank while uploading to pod {pod}; rerun", pod_id=pod
                    )
                frame = encode_frame(
                    p.fid, p.epoch, p.next, raw, p.compress, opts.line_chars, s.framing
                )
                s.write(s.hooks.frame_out(p.fid, p.next, frame))
                q.chunks[(p.fid, p.epoch, p.next)] = (len(raw), time.monotonic())
                q.bytes += len(raw)
                run.stats["sent"] += len(raw)
                p.next += len(raw)
                budget -= len(raw)
            else:
                if not p.close_sent:
                    s.line("#CLOSE", p.fid)
                    p.close_sent = True
                q.queue.popleft()
        waiting = not q.queue or budget <= 0
        events = s.poll(0.2 if waiting else 0.0)
        for kind, ev in events:
            if kind != "line" or len(ev) < 2 or ev[1] not in by_fid:
                continue
            _on_answer(s, q, ev, by_fid, window, run)
        if events:
            stalls = 0
        elif waiting and time.monotonic() - s.last_rx > opts.stall_seconds:
            stalls += 1
            if stalls > 2:
                raise Dropped("the receiver stopped answering")
            s.last_rx = time.monotonic()
            for p in todo:
                if not p.done:
                    s.line("#SYNC", p.fid)


def _join(s: Session, striped: list[Striped], stats: dict[str, int]) -> list[Piece]:
    """Have the receiver join each striped file; returns the files to send again
    whole (their joined sha256 differed)."""
    redo = []
    for st in striped:
        p = st.piece
        if p.done:
            continue
        s.line("#JOIN", p.fid, p.size, p.sha256, b64text(p.rel), ",".join(map(str, st.bounds[1:])))
        _, ev = s.wait_for(
            lambda k, e, f=p.fid: (
                k == "line" and e[0] in ("#C", "#BAD", "#I", "#X") and e[1:2] == [f]
            ),  # type: ignore[misc]
            600.0,
            f"the joined {p.rel}",
        )
        if ev[0] == "#C":
            p.done = True
        elif ev[0] == "#BAD":
            if p.bad:
                raise _bad_twice(p, ev[3], s.pod)
            stats["retries"] += 1
            whole = p.whole()
            whole.bad = p.bad = 1
            redo.append(whole)
        elif ev[0] == "#X":
            _raise_pod_error(ev, {p.fid: p}, s.pod)
        else:
            raise TransferError(
                f"pod {s.pod}: segment {ev[2]} of {p.rel} was not complete when it was "
                f"joined ({ev[3] if len(ev) > 3 else '?'} bytes kept); rerun, it resumes",
                pod_id=s.pod,
                stage="upload",
            )
    return redo


def _screen_on_pod(s: Session, striped: list[Striped], run: Transfer) -> None:
    """Files already on the pod, whole and verified, are not striped again."""
    for st in striped:
        p = st.piece
        s.line("#STAT", p.fid, p.size, p.sha256, b64text(p.rel))
    for st in striped:
        p = st.piece
        _, ev = s.wait_for(
            lambda k, e, f=p.fid: k == "line" and e[:2] == ["#O", f],  # type: ignore[misc]
            600.0,
            f"#STAT answer for {p.rel}",
        )
        p.done = ev[3:4] == ["done"]
        if p.done:
            run.tally.move(p, p.size)


def _verify_on_pod(
    s: Session, run: Transfer, source: Manifest, files: list[Piece], remote_root: str
) -> MethodResult:
    """The pod's manifest of ``remote_root`` against ``source`` (the receiver makes the
    empty directories and links, then hashes the tree), files that differ sent once
    more (``transfer.verify``)."""
    pod, opts = run.pod, run.opts
    expected = source.as_dict()
    paths = [e["path"] for e in expected["entries"]]
    request = {"paths": paths, "structure": structure_entries(expected)}

    def measure() -> dict[str, Any]:
        dest = s.blob(request, 600.0)
        if dest.get("problems"):
            listed = "; ".join(f"{path} ({why})" for path, why in dest["problems"][:20])
            raise TransferError(
                f"pod {pod}: could not make {listed} under {remote_root}", pod_id=pod
            )
        if "error" in dest:
            raise TransferError(
                f"pod {pod}: manifest of {remote_root} failed: {dest['error']}", pod_id=pod
            )
        return dest

    def resend(bad: set[str]) -> None:
        redo = [f.whole() for f in files if f.rel in bad]
        for f in redo:
            f.compress = choose_compression(f, opts.compress)
        run.resend(redo)

    dest = verify_resending_once(
        expected, measure, resend, method="pty", direction="upload", pod=pod, resent=run.resent
    )
    return run.result(source, dest)


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
    more_lanes: Callable[[], Lane] | None = None,
) -> MethodResult:
    """Upload the files of ``source`` (a manifest of ``local_root``) to ``remote_root``.

    Args:
        open_stream: runs a shell command in a raw tty and returns its stream.
        tools_dir: the pod folder holding ``receiver.py`` and its siblings.
        local_root: the local tree (or single file) the manifest was computed on.
        remote_root: destination folder on the pod (created when missing).
        source: ``Manifest.compute(local_root)``.
        reconnect: re-opens the SSH connection after a drop (``PodConsole.reconnect``).
        options: tuning; default ``PtyOptions()``.
        hooks: fault points; default none.
        on_progress: ``(done_bytes, total_bytes)`` after each acknowledged chunk.
        pod: the pod id, for messages.
        more_lanes: makes one more ``Lane`` (its own SSH session) per extra stream when
            ``options.streams`` > 1; None keeps to one stream.

    Returns:
        ``MethodResult``: ``dest_manifest`` was computed on the pod from the files on
        its disk and matches ``source``; ``retries`` counts re-sent chunks and files;
        ``link`` says how the bytes travelled (framing, probe verdict, streams, window).

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
        Piece(
            str(i),
            e["path"],
            e["size_bytes"],
            e["sha256"],
            local_root if single else local_root.joinpath(*e["path"].split("/")),
        )
        for i, e in enumerate(mf.file_entries(expected))
    ]
    window = opts.window_bytes or opts.min_window_bytes
    run = Transfer(
        Lane(open_stream, reconnect),
        more_lanes,
        receiver_command(tools_dir, remote_root, opts, window),
        opts,
        hooks,
        Tally(sum(f.size for f in files), hooks, on_progress),
        pod,
    )

    def prepare(s: Session) -> list[Piece]:
        for f in files:
            f.compress = choose_compression(f, opts.compress)
        return files

    return run.go(
        prepare,
        send_pieces,
        _join,
        lambda s: _verify_on_pod(s, run, source, files, remote_root),
        lambda s, striped: _screen_on_pod(s, striped, run),
    )
