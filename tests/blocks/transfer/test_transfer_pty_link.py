"""How the pty transfer uses its path: the probe and the framing it decides, the
version handshake with an older receiver, the window sized to the path, compression
only where it pays, and striping over several streams (real receivers, pipes and ptys)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import SpecError, TransferError
from prefect_runpod.blocks.pod_side import frame_codec as codec
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.pod_side.receiver import PROTOCOL_VERSION
from prefect_runpod.blocks.transfer.base import TransferHooks
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.blocks.transfer.pty import Lane, PtyOptions, pty_download, pty_upload
from prefect_runpod.blocks.transfer.pty.session import PathWindow
from tests.fixtures.transfer import POD_SIDE_DIR, StreamFactory, make_tree

DATA = Path(__file__).resolve().parents[2] / "data" / "receivers"
FAST = dict(chunk_bytes=64 * 1024, window_bytes=512 * 1024, stall_seconds=1.0)
_FRAME_HEAD = re.compile(rb"#([DR]) (\d+) \d+ (\d+) \d+ ([rz]) ")


def _same_tree(a: Path, b: Path) -> None:
    assert mf.compute_manifest(str(a))["entries"] == mf.compute_manifest(str(b))["entries"]


class Recorder(TransferHooks):
    """Notes every data frame sent and received (kind, file id, flag) and the most
    frames ever sent but not yet acknowledged."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []
        self.received: list[tuple[str, str, str]] = []
        self.unacked = 0
        self.most_unacked = 0

    def frame_out(self, fid: str, offset: int, data: bytes) -> bytes:
        head = _FRAME_HEAD.match(data)
        assert head is not None
        self.sent.append((head[1].decode(), head[2].decode(), head[4].decode()))
        self.unacked += 1
        self.most_unacked = max(self.most_unacked, self.unacked)
        return data

    def data_in(self, data: bytes) -> bytes:
        self.unacked -= len(re.findall(rb"(?m)^#A \d", data))
        for head in _FRAME_HEAD.finditer(data):
            self.received.append((head[1].decode(), head[2].decode(), head[4].decode()))
        return data


# --- the probe and the framing --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("streams", ["pipe_streams", "pty_streams"])
def test_a_clean_path_passes_the_probe_and_carries_raw_frames(
    tmp_path: Path, streams: str, request: pytest.FixtureRequest
) -> None:
    factory: StreamFactory = request.getfixturevalue(streams)
    src = make_tree(tmp_path / "src")
    hooks = Recorder()
    up = pty_upload(
        factory,
        POD_SIDE_DIR,
        src,
        str(tmp_path / "pod"),
        Manifest.compute(src),
        options=PtyOptions(**FAST),
        hooks=hooks,
    )
    assert up.link is not None
    assert (up.link.framing, up.link.probe) == ("raw", "passed")
    assert "all" in up.link.probe_detail and "intact" in up.link.probe_detail
    assert up.link.protocol == int(PROTOCOL_VERSION)
    assert {kind for kind, _, _ in hooks.sent} == {"R"}
    back = Recorder()
    down = pty_download(
        factory,
        POD_SIDE_DIR,
        str(tmp_path / "pod"),
        tmp_path / "back",
        options=PtyOptions(**FAST),
        hooks=back,
    )
    assert down.link is not None and down.link.framing == "raw"
    assert {kind for kind, _, _ in back.received} == {"R"}
    _same_tree(src, tmp_path / "back")


@pytest.mark.slow
def test_a_cooked_path_fails_the_probe_and_falls_back_to_base64(
    tmp_path: Path, cooked_streams: StreamFactory
) -> None:
    src = make_tree(tmp_path / "src")
    hooks = Recorder()
    up = pty_upload(
        cooked_streams,
        POD_SIDE_DIR,
        src,
        str(tmp_path / "pod"),
        Manifest.compute(src),
        options=PtyOptions(**FAST),
        hooks=hooks,
        pod="lp-cooked",
    )
    assert up.link is not None
    assert (up.link.framing, up.link.probe) == ("base64", "failed")
    # the verdict names the first byte that changed each way: NUL lost going in,
    # LF turned into CR LF coming out
    up_seen, down_seen = up.link.probe_detail.split("; pod→flow: ")
    assert up_seen.startswith("flow→pod: ") and "byte 0 sent 0x00 got 0x01" in up_seen
    assert "sent 0x0a got 0x0d" in down_seen
    assert {kind for kind, _, _ in hooks.sent} == {"D"}
    _same_tree(src, tmp_path / "pod")
    down = pty_download(
        cooked_streams,
        POD_SIDE_DIR,
        str(tmp_path / "pod"),
        tmp_path / "back",
        options=PtyOptions(**FAST),
    )
    assert down.link is not None and down.link.framing == "base64"
    _same_tree(src, tmp_path / "back")


@pytest.mark.slow
def test_raw_framing_asked_for_on_a_cooked_path_is_refused(
    tmp_path: Path, cooked_streams: StreamFactory
) -> None:
    src = make_tree(tmp_path / "src", big_bytes=1000)
    with pytest.raises(TransferError, match=r"raw frames.*--pty-framing") as info:
        pty_upload(
            cooked_streams,
            POD_SIDE_DIR,
            src,
            str(tmp_path / "pod"),
            Manifest.compute(src),
            options=PtyOptions(**FAST, framing="raw"),
            pod="lp-cooked",
        )
    assert "lp-cooked" in str(info.value)
    assert not (tmp_path / "pod" / "text.log").exists()


@pytest.mark.slow
def test_base64_framing_skips_the_probe(tmp_path: Path, pty_streams: StreamFactory) -> None:
    src = make_tree(tmp_path / "src", big_bytes=200_000)
    hooks = Recorder()
    up = pty_upload(
        pty_streams,
        POD_SIDE_DIR,
        src,
        str(tmp_path / "pod"),
        Manifest.compute(src),
        options=PtyOptions(**FAST, framing="base64"),
        hooks=hooks,
    )
    assert up.link is not None
    assert (up.link.framing, up.link.probe, up.link.probe_detail) == (
        "base64",
        "skipped",
        "base64 asked for",
    )
    assert {kind for kind, _, _ in hooks.sent} == {"D"}


def test_the_probe_pattern_holds_every_byte_value_and_names_the_first_change() -> None:
    assert set(codec.PROBE_PATTERN) == set(range(256))
    block = codec.probe_block("abc123")
    ((kind, (token, got)),) = codec.FrameParser().feed(b"echo noise\r\n" + block)
    assert (kind, token) == ("probe", "abc123")
    assert codec.probe_verdict(got) == (True, f"all {len(codec.PROBE_PATTERN)} bytes intact")
    mangled = block.replace(b"\r", b"\n")
    ((_, (_, got)),) = codec.FrameParser().feed(mangled)
    ok, detail = codec.probe_verdict(got)
    assert not ok and "byte 13 sent 0x0d got 0x0a" in detail


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("framing", "binary", r"--pty-framing.*'binary'.*auto, raw, base64"),
        ("streams", 0, r"--pty-streams"),
        ("streams", 17, r"--pty-streams"),
        ("streams", 2.5, r"--pty-streams.*whole number"),
        ("compress", "yes", r"compress must be auto, True or False"),
        ("chunk_bytes", 0, r"chunk_bytes must be a positive number of bytes"),
    ],
)
def test_bad_options_are_refused_when_made(field: str, value: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        PtyOptions(**{field: value})  # type: ignore[arg-type]


# --- an older receiver left on the pod ------------------------------------------------


def _old_tools(tmp_path: Path, version: int) -> str:
    """A tools folder holding the receiver of protocol ``version`` (from git history)."""
    tools = tmp_path / f"tools-v{version}"
    tools.mkdir()
    shutil.copy(DATA / f"receiver-protocol-{version}.py.txt", tools / "receiver.py")
    shutil.copy(DATA / "manifest-protocol-3.py.txt", tools / "manifest.py")
    return str(tools)


@pytest.mark.slow
def test_a_protocol_3_receiver_is_spoken_to_in_protocol_3(
    tmp_path: Path, pty_streams: StreamFactory, caplog: pytest.LogCaptureFixture
) -> None:
    tools = _old_tools(tmp_path, 3)
    src = make_tree(tmp_path / "src")
    hooks = Recorder()
    up = pty_upload(
        pty_streams,
        tools,
        src,
        str(tmp_path / "pod"),
        Manifest.compute(src),
        options=PtyOptions(**FAST, streams=2),
        hooks=hooks,
        more_lanes=lambda: Lane(pty_streams),
    )
    assert up.link is not None
    assert (up.link.protocol, up.link.framing, up.link.probe) == (3, "base64", "skipped")
    assert "protocol 3" in up.link.probe_detail and PROTOCOL_VERSION in up.link.probe_detail
    assert up.link.streams == 1  # protocol 3 has no segments
    assert {kind for kind, _, _ in hooks.sent} == {"D"}
    assert any("protocol 3" in r.getMessage() for r in caplog.records)
    _same_tree(src, tmp_path / "pod")
    down = pty_download(
        pty_streams, tools, str(tmp_path / "pod"), tmp_path / "back", options=PtyOptions(**FAST)
    )
    assert down.link is not None and down.link.protocol == 3
    _same_tree(src, tmp_path / "back")


@pytest.mark.slow
def test_a_protocol_2_receiver_is_refused_naming_both_versions(
    tmp_path: Path, pipe_streams: StreamFactory
) -> None:
    tools = _old_tools(tmp_path, 2)
    src = make_tree(tmp_path / "src", big_bytes=1000)
    with pytest.raises(TransferError) as info:
        pty_upload(
            pipe_streams,
            tools,
            src,
            str(tmp_path / "pod"),
            Manifest.compute(src),
            options=PtyOptions(**FAST),
            pod="lp-old",
        )
    text = str(info.value)
    assert "protocol 2" in text and f"speaks {PROTOCOL_VERSION}" in text and "lp-old" in text
    assert "rerun" in text
    assert not (tmp_path / "pod" / "text.log").exists()


@pytest.mark.slow
def test_raw_framing_with_a_protocol_3_receiver_is_refused(
    tmp_path: Path, pipe_streams: StreamFactory
) -> None:
    tools = _old_tools(tmp_path, 3)
    src = make_tree(tmp_path / "src", big_bytes=1000)
    with pytest.raises(TransferError, match=r"protocol 3 and this side 4"):
        pty_upload(
            pipe_streams,
            tools,
            src,
            str(tmp_path / "pod"),
            Manifest.compute(src),
            options=PtyOptions(**FAST, framing="raw"),
        )


# --- the window -----------------------------------------------------------------------


def test_the_window_keeps_twice_the_bandwidth_delay_product() -> None:
    opts = PtyOptions(min_window_bytes=64 * 1024, max_window_bytes=256 * 1024 * 1024)
    window = PathWindow(0.1, opts)  # 100 ms round trip measured at the start
    rate = 12_500_000  # 100 Mbit/s of acknowledgements
    for i in range(1, 41):
        size = window.on_acked(int(rate * i * 0.05), now=i * 0.05)
    bdp = rate * 0.1
    assert 2 * bdp * 0.95 <= size <= 2 * bdp * 1.05
    assert window.peak >= size
    # a faster round trip shrinks it; the floor and the cap hold
    window.on_rtt(0.01)
    assert window.on_acked(int(rate * 41 * 0.05), now=41 * 0.05) == 64 * 1024 or (
        window.bytes <= 2 * rate * 0.01 * 1.05
    )
    capped = PathWindow(1.0, PtyOptions(min_window_bytes=64 * 1024, max_window_bytes=1 << 20))
    for i in range(1, 41):
        capped.on_acked(rate * i, now=float(i))
    assert capped.bytes == 1 << 20
    fixed = PathWindow(0.1, PtyOptions(window_bytes=300_000))
    assert fixed.on_acked(10**9, now=5.0) == 300_000


@pytest.mark.slow
def test_chunks_are_pipelined_never_stop_and_wait(
    tmp_path: Path, pty_streams: StreamFactory
) -> None:
    src = make_tree(tmp_path / "src")
    hooks = Recorder()
    up = pty_upload(
        pty_streams,
        POD_SIDE_DIR,
        src,
        str(tmp_path / "pod"),
        Manifest.compute(src),
        options=PtyOptions(chunk_bytes=64 * 1024, min_window_bytes=1 << 20, stall_seconds=1.0),
        hooks=hooks,
    )
    # a 1 MiB window holds 16 chunks of 64 KiB: many go out before the first answer
    assert hooks.most_unacked >= 8
    assert up.link is not None and up.link.rtt_ms is not None and up.link.rtt_ms > 0
    assert up.link.window_bytes >= 1 << 20


# --- compression ----------------------------------------------------------------------


@pytest.mark.slow
def test_only_files_whose_sample_shrinks_are_compressed(
    tmp_path: Path, pipe_streams: StreamFactory
) -> None:
    src = make_tree(tmp_path / "src")  # big.bin random, text.log compressible text
    order = [e["path"] for e in mf.file_entries(mf.compute_manifest(str(src)))]
    fid = {path: str(i) for i, path in enumerate(order)}
    hooks = Recorder()
    up = pty_upload(
        pipe_streams,
        POD_SIDE_DIR,
        src,
        str(tmp_path / "pod"),
        Manifest.compute(src),
        options=PtyOptions(**FAST),
        hooks=hooks,
    )
    flags = {(f, flag) for _, f, flag in hooks.sent}
    assert (fid["text.log"], "z") in flags and (fid["text.log"], "r") not in flags
    assert {flag for f, flag in flags if f == fid["sub dir/deeper/big.bin"]} == {"r"}
    assert up.link is not None and up.link.compressed_files == 1
    back = Recorder()
    pty_download(
        pipe_streams,
        POD_SIDE_DIR,
        str(tmp_path / "pod"),
        tmp_path / "back",
        options=PtyOptions(**FAST),
        hooks=back,
    )
    got = {(f, flag) for _, f, flag in back.received}
    assert (fid["text.log"], "z") in got
    assert {flag for f, flag in got if f == fid["sub dir/deeper/big.bin"]} == {"r"}
    _same_tree(src, tmp_path / "back")


def test_worth_compressing_says_no_to_random_data() -> None:
    import os

    assert codec.worth_compressing(b'{"text": "hello world", "label": 1}\n' * 2000)
    assert not codec.worth_compressing(os.urandom(64 * 1024))
    assert not codec.worth_compressing(b"")


# --- several streams ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("framing", ["raw", "base64"])
def test_large_files_stripe_over_several_streams(
    tmp_path: Path, pty_streams: StreamFactory, framing: str
) -> None:
    src = make_tree(tmp_path / "src")
    opts = PtyOptions(**FAST, streams=3, framing=framing)
    up = pty_upload(
        pty_streams,
        POD_SIDE_DIR,
        src,
        str(tmp_path / "pod"),
        Manifest.compute(src),
        options=opts,
        more_lanes=lambda: Lane(pty_streams),
    )
    assert up.link is not None and up.link.streams == 3 and up.link.framing == framing
    _same_tree(src, tmp_path / "pod")
    assert not [p for p in mf.list_files(str(tmp_path / "pod")) if mf.is_transfer_scratch(p)]
    down = pty_download(
        pty_streams,
        POD_SIDE_DIR,
        str(tmp_path / "pod"),
        tmp_path / "back",
        options=opts,
        more_lanes=lambda: Lane(pty_streams),
    )
    assert down.link is not None and down.link.streams == 3
    _same_tree(src, tmp_path / "back")
    assert not [p for p in mf.list_files(str(tmp_path / "back")) if mf.is_transfer_scratch(p)]


class _BreaksOnProbe(StreamFactory):
    """A path that drops the session when the probe's bytes cross it (a gateway that
    hangs up on some byte value), and carries everything else."""

    def __init__(self) -> None:
        super().__init__()
        self.drops = 0

    def __call__(self, command: str):  # type: ignore[no-untyped-def]
        stream = super().__call__(command)
        plain = stream.write

        def write(data: bytes) -> None:
            if b"#PROBE " in data:
                self.drops += 1
                stream.kill()
                raise EOFError("the gateway hung up")
            plain(data)

        stream.write = write  # type: ignore[method-assign]
        return stream


@pytest.mark.slow
def test_a_path_that_drops_on_the_probe_settles_for_base64(tmp_path: Path) -> None:
    factory = _BreaksOnProbe()
    try:
        src = make_tree(tmp_path / "src")
        up = pty_upload(
            factory,
            POD_SIDE_DIR,
            src,
            str(tmp_path / "pod"),
            Manifest.compute(src),
            options=PtyOptions(**FAST),
            reconnect=factory.reconnect,
        )
        assert factory.drops == 1 and up.reconnects == 1
        assert up.link is not None
        assert (up.link.framing, up.link.probe) == ("base64", "failed")
        assert "dropped during the probe" in up.link.probe_detail
        _same_tree(src, tmp_path / "pod")
    finally:
        factory.close()
