"""The download half of the ``pty`` method: files from the pod's receiver to here
(docs/architecture.md#the-pty-framing).

The pod computes the source manifest first; then each file (or, over several
streams, each segment) is asked for with ``#GET``, arrives in frames the receiver
sends as fast as the window allows, and is acknowledged frame by frame. Locally each
file grows as ``<name>.part`` (``part_files``: verified bytes only, resumable) and
takes its name only when its sha256 matches the manifest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.exceptions import ChecksumMismatchError, TransferError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.pod_side import part_files
from prefect_runpod.blocks.pod_side.frame_codec import b64text, unb64text
from prefect_runpod.blocks.transfer.base import ProgressCallback, TransferHooks
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult, refuse_links
from prefect_runpod.blocks.transfer.pty.lanes import MAX_REWINDS, Lane, Piece, Striped, Tally
from prefect_runpod.blocks.transfer.pty.options import PtyOptions
from prefect_runpod.blocks.transfer.pty.run import Transfer
from prefect_runpod.blocks.transfer.pty.session import (
    ByteStream,
    Dropped,
    PathWindow,
    Session,
    receiver_command,
)
from prefect_runpod.blocks.transfer.verify import local_tree_manifest, verify_resending_once

__all__ = ["fetch_pieces", "pty_download"]

_WINDOW_CHANGE = 0.2  # tell the receiver a new window when it moved by this much


def _bad_twice(p: Piece, got: int, sha: str, pod: str) -> ChecksumMismatchError:
    return ChecksumMismatchError(
        f"{p.rel} from pod {pod}: got {got} bytes with sha256 {sha}, expected "
        f"{p.size} bytes with {p.sha256}, twice; did it change on the pod? Rerun",
        path=p.rel,
        expected=p.sha256,
        actual=sha,
        pod_id=pod,
        stage="download",
    )


def _ask(s: Session, p: Piece) -> None:
    """(Re)request ``p`` from its verified offset, with a new epoch."""
    p.epoch += 1
    fields: tuple[object, ...] = ("#GET", p.fid, p.epoch, p.next, b64text(p.rel))
    s.line(*fields, *((p.end,) if p.segment else ()))


def _start(p: Piece, known: dict[str, Any]) -> bool:
    """Open ``p``'s local part (keeping its verified bytes); False when the whole file
    is already here."""
    assert p.local is not None
    if not p.segment and part_files.already_there(str(p.local), p.size, p.sha256, known):
        p.done = True
        return False
    if p.part is None:
        p.part = part_files.PartFile(str(p.local), p.size, p.sha256, p.start, p.end, p.index)
    p.part.open()
    p.next = p.acked = p.part.offset
    return True


def fetch_pieces(s: Session, todo: list[Piece], window: PathWindow, run: Transfer) -> None:
    """Fetch ``todo`` through one session until each is here (whole files verified
    and named, segments complete).

    Raises:
        ChecksumMismatchError: a file arrived wrong twice (named).
        TransferError: the pod cannot read a file, or one arrived damaged more than
            ``MAX_REWINDS`` times in a row.
        Dropped: the receiver stopped sending.
    """
    opts, pod, by_fid = s.opts, s.pod, {p.fid: p for p in todo}
    tally, stats, crew = run.tally, run.stats, run.crew
    told = 0
    if s.modern:
        told = window.bytes
        s.line("#W", told)
    pending = []
    for p in todo:
        if _start(p, run.known):
            _ask(s, p)
            pending.append(p)
        tally.move(p, p.next - p.start if not p.done else p.end - p.start)
    stalls = 0
    while not all(p.done for p in pending):
        crew.check()
        events = s.poll(0.5)
        acks = []
        for kind, ev in events:
            if kind == "frame":
                acks.append(f"#A {ev.fid} {ev.epoch} {ev.offset}\n")
                got = by_fid.get(ev.fid)
                if got is None or got.done or ev.epoch != got.epoch:
                    continue
                p = got
                if ev.raw is None or ev.offset != p.next or p.next + len(ev.raw) > p.end:
                    stats["retries"] += 1
                    p.rewinds += 1
                    if p.rewinds > MAX_REWINDS:
                        raise TransferError(
                            f"pod {pod}: {p.rel} arrived damaged {p.rewinds} times in a row "
                            f"at offset {p.next} ({ev.error or 'out of order'}); rerun, or "
                            "use another method",
                            pod_id=pod,
                            stage="download",
                        )
                    _ask(s, p)
                    continue
                p.rewinds = 0
                assert p.part is not None
                p.part.write(ev.raw)
                stats["sent"] += len(ev.raw)
                p.next = p.part.offset
                tally.move(p, p.next - p.start)
                window.on_acked(tally.done)
            elif kind == "line" and ev[0] == "#E" and ev[1] in by_fid:
                p = by_fid[ev[1]]
                if p.done or int(ev[2]) != p.epoch:
                    continue
                _finish(s, p, stats, pod, run.known)
            elif kind == "line" and ev[0] == "#X":
                missing = by_fid.get(ev[1])
                raise TransferError(
                    f"pod {pod}: cannot read {missing.rel if missing else ev[1]}: {unb64text(ev[3])}",
                    pod_id=pod,
                    stage="download",
                )
        if acks:
            s.write("".join(acks).encode("ascii"))
        if s.modern and abs(window.bytes - told) > _WINDOW_CHANGE * told:
            told = window.bytes
            s.line("#W", told)
        if events:
            stalls = 0
        elif time.monotonic() - s.last_rx > opts.stall_seconds:
            stalls += 1
            if stalls > 2:
                raise Dropped("the pod's sender stopped")
            s.last_rx = time.monotonic()
            for p in pending:
                if not p.done:
                    _ask(s, p)


def _finish(s: Session, p: Piece, stats: dict[str, int], pod: str, known: dict[str, Any]) -> None:
    """The pod says it sent all of ``p``: name it (verified) or ask again."""
    part = p.part
    assert part is not None
    if p.segment:
        if part.complete:
            p.done = True
            part.close()
        else:
            _ask(s, p)
        return
    ok, entry = part.finish(known)
    if ok:
        p.done = True
        return
    p.bad += 1
    if p.bad > 1:
        raise _bad_twice(p, p.next, entry["sha256"], pod)
    stats["retries"] += 1
    part.open()  # finish() removed the wrong bytes: start again from zero
    p.next = p.acked = part.offset
    _ask(s, p)


def _join_local(
    striped: list[Striped], stats: dict[str, int], pod: str, known: dict[str, Any]
) -> list[Piece]:
    """Join each striped file here; returns those to fetch again whole."""
    redo = []
    for st in striped:
        p = st.piece
        if p.done:
            continue
        assert p.local is not None
        verdict, found = part_files.join_segments(str(p.local), p.size, p.sha256, st.bounds, known)
        if verdict == "ok":
            p.done = True
        elif verdict == "bad":
            if p.bad:
                raise _bad_twice(p, p.size, found["sha256"], pod)
            stats["retries"] += 1
            whole = p.whole()
            whole.bad = p.bad = 1
            redo.append(whole)
        else:
            raise TransferError(
                f"segment {found[0]} of {p.rel} from pod {pod} was not complete when it "
                "was joined; rerun the download, it resumes",
                pod_id=pod,
                stage="download",
            )
    return redo


def _screen_here(s: Session, striped: list[Striped], run: Transfer) -> None:
    """Files already here, whole and verified, are not fetched again."""
    tally = run.tally
    for st in striped:
        p = st.piece
        assert p.local is not None
        p.done = part_files.already_there(str(p.local), p.size, p.sha256, run.known)
        if p.done:
            tally.move(p, p.size)


def _verify_here(run: Transfer, source: dict[str, Any], local_root: Path) -> MethodResult:
    """Make the empty directories and links, then compare the local manifest with the
    pod's; files that differ are fetched once more (``transfer.verify``)."""

    def resend(bad: set[str]) -> None:
        redo = []
        for f in run.files or []:
            if f.rel in bad:
                assert f.local is not None
                f.local.unlink(missing_ok=True)
                redo.append(f.whole())
        run.resend(redo)

    dest = verify_resending_once(
        source,
        lambda: local_tree_manifest(local_root, source, run.pod, known=run.known),
        resend,
        method="pty",
        direction="download",
        pod=run.pod,
        resent=run.resent,
    )
    return run.result(Manifest.from_dict(source), dest)


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
    more_lanes: Callable[[], Lane] | None = None,
) -> MethodResult:
    """Download the tree ``remote_root`` from the pod into ``local_root``.

    The pod computes the source manifest first (links that leave the tree or dangle
    are refused there, unless ``follow_links``); each file lands as ``<name>.part``
    (+ sidecar), is verified whole, and only then takes its name; empty directories
    and in-tree links are made last. Arguments as ``pty_upload``.

    Returns:
        ``MethodResult``: ``source_manifest`` computed on the pod, ``dest_manifest``
        re-read from the local disk and matching it, ``link`` as for an upload.

    Raises:
        SpecError: links on the pod that leave the tree or dangle (each named; nothing
            moved).
        ChecksumMismatchError: a file still differs after one retry (named).
        TransferError: the folder is missing on the pod, or the connection kept dropping.
    """
    opts = options or PtyOptions()
    hooks = hooks or TransferHooks()
    local_root.mkdir(parents=True, exist_ok=True)
    tally = Tally(0, hooks, on_progress)
    window = opts.window_bytes or opts.min_window_bytes
    run = Transfer(
        Lane(open_stream, reconnect),
        more_lanes,
        receiver_command(tools_dir, remote_root, opts, window),
        opts,
        hooks,
        tally,
        pod,
    )
    source: dict[str, Any] = {}

    def prepare(s: Session) -> list[Piece]:
        src = s.blob({"paths": None, "follow_links": follow_links}, 600.0)
        if src.get("problems"):
            raise refuse_links(f"pod {pod}: {remote_root}", src["problems"], pod_id=pod)
        if "error" in src:
            raise TransferError(
                f"pod {pod}: cannot read {remote_root}: {src['error']}; check the path",
                pod_id=pod,
                stage="download",
            )
        source.update(src)
        files = [
            Piece(
                str(i),
                e["path"],
                e["size_bytes"],
                e["sha256"],
                local_root.joinpath(*e["path"].split("/")),
            )
            for i, e in enumerate(mf.file_entries(src))
        ]
        tally.total = sum(f.size for f in files)
        return files

    return run.go(
        prepare,
        fetch_pieces,
        lambda s, striped, stats: _join_local(striped, stats, pod, run.known),
        lambda s: _verify_here(run, source, local_root),
        lambda s, striped: _screen_here(s, striped, run),
    )
