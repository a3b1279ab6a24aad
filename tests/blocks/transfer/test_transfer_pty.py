"""The pty transfer protocol against a real receiver process (pipes and a real pty).

Every fault test runs with raw frames and with base64 frames (the ``framing`` fixture)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import ChecksumMismatchError, TransferError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.pod_side import part_files
from prefect_runpod.blocks.pod_side.frame_codec import FrameParser, encode_frame
from prefect_runpod.blocks.pod_side.receiver import read_frame
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult
from prefect_runpod.blocks.transfer.pty import PtyOptions, pty_download, pty_upload
from tests.fixtures.transfer import POD_SIDE_DIR, FaultHooks, make_tree

_FAST = dict(chunk_bytes=64 * 1024, window_bytes=512 * 1024, stall_seconds=1.0)


@pytest.fixture(params=["raw", "base64"])
def framing(request: pytest.FixtureRequest) -> str:
    """The framing a test's transfers are made to use."""
    return str(request.param)


def fast(framing: str, **kw: object) -> PtyOptions:
    """Small chunks and window, quick stall detection, the given framing."""
    return PtyOptions(**{**_FAST, "framing": framing, **kw})  # type: ignore[arg-type]


def _framed(result: MethodResult, framing: str) -> None:
    assert result.link is not None and result.link.framing == framing


def _same_tree(a: Path, b: Path) -> None:
    ma, mb = mf.compute_manifest(str(a)), mf.compute_manifest(str(b))
    assert ma["entries"] == mb["entries"]
    assert not [p for p in mf.list_files(str(b)) if mf.is_transfer_scratch(p)]


def test_codec_roundtrip_and_detects_damage() -> None:
    raw = os.urandom(10000)
    frame = encode_frame("3", 1, 4096, raw, line_chars=1000)
    assert max(len(line) for line in frame.split(b"\n")) < 4096
    ((kind, fr),) = FrameParser().feed(b"noise\r\n" + frame)
    assert kind == "frame" and fr.raw == raw and fr.offset == 4096
    flipped = bytearray(frame)
    flipped[len(frame) // 2] ^= 0x01
    ((_, bad),) = FrameParser().feed(bytes(flipped))
    assert bad.raw is None
    cut = frame[: len(frame) // 2] + b"\n#A 3 1 0 1\n"
    events = FrameParser().feed(cut)
    assert events[0][1].raw is None and events[0][1].error == "truncated payload"
    assert events[1] == ("line", ["#A", "3", "1", "0", "1"])
    # the same bytes claimed at another offset fail their hash
    moved = frame.replace(b" 4096 ", b" 8192 ", 1)
    ((_, bad),) = FrameParser().feed(moved)
    assert bad.raw is None


class _TtyPieces:
    """A stand-in for a tty: each ``readinto`` hands over at most 4 KiB, as a tty does."""

    def __init__(self, data: bytes) -> None:
        self.data, self.reads = data, 0

    def readinto(self, view: memoryview) -> int:
        n = min(len(view), 4096, len(self.data))
        view[:n], self.data = self.data[:n], self.data[n:]
        self.reads += 1
        return n


def test_the_receiver_reads_a_frame_whole_before_parsing_it() -> None:
    """The parser knows how many bytes a frame still needs; the receiver reads that
    many (a tty gives 4 KiB a read) before it parses, so it parses once per frame, not
    once per read, and never reads past what the sender has committed to. A base64
    frame's count is a lower bound on a path that may lose bytes: its reads go on only
    while more input is ready."""
    raw = os.urandom(200_000)
    view = memoryview(bytearray(1 << 20))
    for framing in ("raw", "base64"):
        frame = encode_frame("1", 1, 0, raw, framing=framing)
        parser = FrameParser()
        tty = _TtyPieces(frame + b"#CLOSE 1\n")
        n = read_frame(tty, view, parser.pending())  # nothing under way: one read
        assert n == 4096 and parser.pending() == (0, True)
        assert parser.feed(view[:n]) == []
        count, exact = parser.pending()
        assert exact == (framing == "raw") and 0 < count <= len(frame) - 4096
        n = read_frame(tty, view, (count, exact), lambda: True)
        assert n == count and tty.reads == 2 + (count - 1) // 4096
        events = parser.feed(view[:n])
        if exact:
            assert tty.data == b"#CLOSE 1\n"  # not one byte past the frame
        else:  # the line breaks were not counted: the rest comes with the next read
            events += parser.feed(view[: read_frame(tty, view, parser.pending())])
        kind, fr = events[0]
        assert kind == "frame" and fr.raw == raw
    # a base64 frame whose rest does not come: the reads stop when input pauses
    tty = _TtyPieces(frame[:10_000])
    parser = FrameParser()
    parser.feed(view[: read_frame(tty, view, parser.pending())])
    assert read_frame(tty, view, parser.pending(), lambda: False) == 4096


def test_a_part_file_is_hashed_as_it_grows_not_read_again_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each chunk is read back from the .part once written and hashed then, the bytes
    an earlier session kept when the file is opened again: finish() names the file
    without reading it whole after its last byte, and the entry is the file's."""
    data = os.urandom(3 * 65536 + 5)
    whole = mf.file_entry(_write(tmp_path / "ref.bin", data), "")
    target = tmp_path / "out" / "f.bin"
    first = part_files.PartFile(str(target), len(data), whole["sha256"])
    first.open()
    first.write(data[:65536])
    first.close()  # a dropped session: 64 KiB kept
    again = part_files.PartFile(str(target), len(data), whole["sha256"])
    assert again.open() == 65536
    for at in range(65536, len(data), 65536):
        again.write(data[at : at + 65536])
    read_whole = []
    monkeypatch.setattr(mf, "file_entry", lambda *a, **k: read_whole.append(a) or whole)
    known: dict = {}
    ok, entry = again.finish(known)
    assert ok and not read_whole and target.read_bytes() == data
    assert entry == {**whole, "path": ""} and known


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("compress", [False, True])
def test_upload_then_download_roundtrip(
    tmp_path: Path, pipe_streams, compress: bool, framing: str
) -> None:
    src = make_tree(tmp_path / "src")
    remote = tmp_path / "pod" / "bundle"
    opts = fast(framing, compress=compress)
    source = Manifest.compute(src)
    up = pty_upload(pipe_streams, POD_SIDE_DIR, src, str(remote), source, options=opts)
    assert isinstance(up, MethodResult)
    assert up.bytes == source.total_bytes and up.source_manifest == source
    assert up.dest_manifest.entries == source.entries
    assert up.dest_manifest.root == str(remote)
    _framed(up, framing)
    _same_tree(src, remote)
    back = tmp_path / "back"
    down = pty_download(pipe_streams, POD_SIDE_DIR, str(remote), back, options=opts)
    assert down.source_manifest.entries == source.entries
    assert down.dest_manifest.entries == source.entries and down.bytes == source.total_bytes
    _framed(down, framing)
    _same_tree(src, back)


@pytest.mark.slow
def test_raw_pty_carries_lines_longer_than_4096(tmp_path: Path, pty_streams, framing: str) -> None:
    src = make_tree(tmp_path / "src", big_bytes=300_000)
    remote = tmp_path / "pod"
    opts = fast(framing, line_chars=20000)
    up = pty_upload(
        pty_streams, POD_SIDE_DIR, src, str(remote), Manifest.compute(src), options=opts
    )
    _framed(up, framing)
    _same_tree(src, remote)
    down = pty_download(pty_streams, POD_SIDE_DIR, str(remote), tmp_path / "back", options=opts)
    _framed(down, framing)
    _same_tree(src, tmp_path / "back")


@pytest.mark.slow
def test_flipped_and_truncated_frames_are_repaired(
    tmp_path: Path, pipe_streams, framing: str
) -> None:
    src = make_tree(tmp_path / "src")
    remote = tmp_path / "pod"
    hooks = FaultHooks(flip_frame=5, truncate_frame=9)
    up = pty_upload(
        pipe_streams,
        POD_SIDE_DIR,
        src,
        str(remote),
        Manifest.compute(src),
        options=fast(framing),
        hooks=hooks,
    )
    assert hooks.fired == ["flip", "truncate"]
    assert up.retries >= 2
    _framed(up, framing)
    _same_tree(src, remote)
    hooks = FaultHooks(flip_read=6)
    down = pty_download(
        pipe_streams,
        POD_SIDE_DIR,
        str(remote),
        tmp_path / "back",
        options=fast(framing),
        hooks=hooks,
    )
    assert hooks.fired == ["flip_read"] and down.retries >= 1
    _framed(down, framing)
    _same_tree(src, tmp_path / "back")


@pytest.mark.slow
def test_dropped_connection_resumes_from_verified_offset(
    tmp_path: Path, pipe_streams, framing: str
) -> None:
    src = make_tree(tmp_path / "src")
    remote = tmp_path / "pod"
    hooks = FaultHooks(drop_at_bytes=1024 * 1024, drop=lambda: pipe_streams.streams[-1].kill())
    up = pty_upload(
        pipe_streams,
        POD_SIDE_DIR,
        src,
        str(remote),
        Manifest.compute(src),
        options=fast(framing),
        hooks=hooks,
        reconnect=pipe_streams.reconnect,
    )
    assert hooks.fired == ["drop"] and up.reconnects == 1 and pipe_streams.reconnects == 1
    _framed(up, framing)
    _same_tree(src, remote)
    hooks = FaultHooks(drop_at_bytes=1024 * 1024, drop=lambda: pipe_streams.streams[-1].kill())
    down = pty_download(
        pipe_streams,
        POD_SIDE_DIR,
        str(remote),
        tmp_path / "back",
        options=fast(framing),
        hooks=hooks,
        reconnect=pipe_streams.reconnect,
    )
    assert down.reconnects == 1
    _framed(down, framing)
    _same_tree(src, tmp_path / "back")


@pytest.mark.slow
def test_upload_resumes_from_part_file(tmp_path: Path, pipe_streams, framing: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(1_000_000)
    (src / "f.bin").write_bytes(data)
    remote = tmp_path / "pod"
    remote.mkdir()
    source = Manifest.compute(src)
    (remote / "f.bin.part").write_bytes(data[:300_000])
    (remote / "f.bin.part.json").write_text(
        json.dumps({"size": len(data), "sha256": source.entries[0].sha256})
    )
    sent = []
    hooks = FaultHooks()
    hooks.frame_out = lambda fid, off, d: sent.append(off) or d  # type: ignore[method-assign]
    pty_upload(
        pipe_streams, POD_SIDE_DIR, src, str(remote), source, options=fast(framing), hooks=hooks
    )
    assert min(sent) == 300_000
    assert (remote / "f.bin").read_bytes() == data


@pytest.mark.slow
def test_disk_limit_names_the_file(tmp_path: Path, pipe_streams, framing: str) -> None:
    src = make_tree(tmp_path / "src")
    opts = fast(framing, shell_prefix="ulimit -f 1024;")  # 1 MiB
    with pytest.raises(TransferError, match=r"file size limit.*big\.bin") as info:
        pty_upload(
            pipe_streams,
            POD_SIDE_DIR,
            src,
            str(tmp_path / "pod"),
            Manifest.compute(src),
            options=opts,
            pod="lp-test",
        )
    assert "lp-test" in str(info.value)
    assert not isinstance(info.value, ChecksumMismatchError)


@pytest.mark.slow
def test_source_changed_during_upload_is_never_accepted(
    tmp_path: Path, pipe_streams, framing: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.bin").write_bytes(os.urandom(200_000))
    source = Manifest.compute(src)
    (src / "model.bin").write_bytes(os.urandom(200_000))  # differs from its manifest
    remote = tmp_path / "pod"
    with pytest.raises(ChecksumMismatchError, match="model.bin") as info:
        pty_upload(pipe_streams, POD_SIDE_DIR, src, str(remote), source, options=fast(framing))
    assert info.value.path == "model.bin"
    assert not (remote / "model.bin").exists()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["first-chunk", "middle", "last-byte"])
def test_a_drop_at_any_point_resumes(
    tmp_path: Path, pipe_streams, framing: str, where: str
) -> None:
    src = make_tree(tmp_path / "src")
    source = Manifest.compute(src)
    at = {"first-chunk": 1, "middle": source.total_bytes // 2, "last-byte": source.total_bytes}
    remote = tmp_path / "pod"
    for direction in ("upload", "download"):
        hooks = FaultHooks(drop_at_bytes=at[where], drop=lambda: pipe_streams.streams[-1].kill())
        if direction == "upload":
            result = pty_upload(
                pipe_streams,
                POD_SIDE_DIR,
                src,
                str(remote),
                source,
                options=fast(framing),
                hooks=hooks,
                reconnect=pipe_streams.reconnect,
            )
            _same_tree(src, remote)
        else:
            result = pty_download(
                pipe_streams,
                POD_SIDE_DIR,
                str(remote),
                tmp_path / "back",
                options=fast(framing),
                hooks=hooks,
                reconnect=pipe_streams.reconnect,
            )
            _same_tree(src, tmp_path / "back")
        assert hooks.fired == ["drop"] and result.reconnects == 1, direction
        _framed(result, framing)


def test_a_full_local_disk_is_no_dropped_connection(
    tmp_path: Path, tiny_disk: Path, pipe_streams
) -> None:
    """Issue 24: a download into a full local disk was retried as a drop and ended
    "pty transfer ... lost its connection 6 times"; the refused write is raised at once."""
    remote = make_tree(tmp_path / "pod")  # 3 MiB: more than the 1 MiB disk holds
    with pytest.raises(OSError) as info:
        pty_download(
            pipe_streams,
            POD_SIDE_DIR,
            str(remote),
            tiny_disk / "outputs",
            options=fast("base64"),
            reconnect=pipe_streams.reconnect,
            pod="lp-test",
        )
    assert info.value.errno == errno.ENOSPC and not isinstance(info.value, TransferError)
    assert pipe_streams.reconnects == 0
