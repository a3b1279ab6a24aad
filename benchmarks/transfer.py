"""Transfer benchmarks: ratios measured in one run on a loopback OpenSSH sshd.

Run from a venv with the project's ``[test]`` extra: the sshd comes from the test
fixtures, which import pytest.

    python -m benchmarks.transfer --json                 # 1 and 8 MiB (about 1 minute)
    python -m benchmarks.transfer --json --sizes 8,64    # bigger files
    python -m benchmarks.transfer --json --sizes 64 --proxy-mib 64 --framing raw,base64
    python -m benchmarks.transfer --json --sizes 8 --proxy-only --proxy-mib 1600 --framing raw
    python -m benchmarks.transfer --json --sizes 8 --proxy-only --proxy-mib 64 \
        --conn-mbit 25 --mbit 1000 --streams 1,4          # a gateway capping each session

Measures (upload then download, seconds and MiB/s): ``pty``, ``sftp`` and ``rsync`` for
random files of each size, ``pty`` and ``sftp`` for a compressible text bundle; the
best direct method (``sftp`` or ``rsync``) vs bare ``rsync -a`` over ssh; a second
upload of an unchanged file and of one with 1 MiB rewritten in place (bytes sent);
200 trivial console commands vs ``exec_command``; a manifest's hashing (sha256 + git
blob id, one read) vs ``sha256sum``; and ``pty`` (each framing and stream count asked
for) vs ``sftp`` and vs the link itself through a proxy adding 50 ms each way and capping
100 Mbit/s (``wan_proxy.pty_over_link``). Goals (reported, never asserted): through the
proxy pty ≥ 0.9 × the link with raw frames and ≥ 0.72 with base64, downloads as fast as
uploads; loopback pty ≥ 0.6 × sftp (random, both ways); direct ≥ 0.9 × rsync; nothing
sent by an unchanged second upload; console rtt ≤ 1.5 ×
exec; hashing ≥ 0.9 × sha256sum; peak RSS ≤ 200 MiB on each end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.wan_proxy import WanProxy, measure_link
from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.dispatch import download_dir, upload_dir
from prefect_runpod.blocks.transfer.openssh_login import close_shared_connections
from prefect_runpod.blocks.transfer.pod_tools import bootstrap_pod_tools
from prefect_runpod.blocks.transfer.pty import FRAMING_CHOICES, PtyOptions
from prefect_runpod.blocks.transfer.sftp import connect_direct
from tests.fixtures.sshd import run_sshd

MiB = 1024 * 1024
MAX_PROXY_MIB = 1600
_WRITE_PIECE = 8 * MiB
METHODS = ("pty", "sftp", "rsync")
"""The methods a loopback sshd serves (s3 and runpodctl need a bucket or a relay)."""


def _random_file(path: Path, size: int) -> None:
    """``size`` random bytes in ``path``, written in pieces (memory stays small)."""
    with open(path, "wb") as fh:
        left = size
        while left > 0:
            piece = min(left, _WRITE_PIECE)
            fh.write(os.urandom(piece))
            left -= piece


def _reset_peak_rss() -> None:
    """Start this process's peak-RSS count afresh (Linux: ``clear_refs`` 5)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_rss_mib() -> float | None:
    """This process's peak resident memory since the last reset, MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _mibps(size: int, seconds: float) -> float:
    return round(size / MiB / max(seconds, 1e-9), 1)


def _roundtrip(
    console: PodConsole,
    handle: PodHandle,
    key: Any,
    src: Path,
    method: str,
    tag: str,
    work: Path,
    **kw: Any,
) -> dict[str, Any]:
    remote = f"bench-{tag}-{method}"
    _reset_peak_rss()
    up = upload_dir(console, handle, src, remote, method=method, private_key=key, **kw)
    up_rss = _peak_rss_mib()
    _reset_peak_rss()
    t = time.monotonic()
    down = download_dir(
        console, handle, remote, work / f"back-{tag}-{method}", method=method, private_key=key, **kw
    )
    down_s = time.monotonic() - t
    down_rss = _peak_rss_mib()
    console.run(f"rm -rf {remote}", timeout_seconds=600)
    shutil.rmtree(work / f"back-{tag}-{method}", ignore_errors=True)
    assert up.verified and down.verified
    row: dict[str, Any] = {
        "upload_s": round(up.seconds, 3),
        "upload_mibps": _mibps(up.bytes, up.seconds),
        "download_s": round(down_s, 3),
        "download_mibps": _mibps(down.bytes, down_s),
        "retries": up.retries + down.retries,
        "client_peak_rss_mib": {"upload": up_rss, "download": down_rss},
    }
    if up.link is not None and down.link is not None:
        row["link"] = {
            "framing": up.link.framing,
            "probe": up.link.probe,
            "streams": up.link.streams,
            "rtt_ms": up.link.rtt_ms,
            "window_mib": round(max(up.link.window_bytes, down.link.window_bytes) / MiB, 1),
            "pod_peak_rss_mib": max(
                (x.pod_peak_rss_bytes or 0) / MiB for x in (up.link, down.link)
            ),
        }
    return row


def _random_round(
    console: PodConsole, handle: PodHandle, key: Any, server: Any, src: Path, size: int, work: Path
) -> dict[str, Any]:
    """One round on the random file: each method's upload and download, an rsync upload
    on a fresh connection (``rsync_fresh``: the pod's first transfer; the ``rsync`` row's
    transfers share the connection an earlier one opened), then bare rsync."""
    row = {m: _roundtrip(console, handle, key, src, m, f"r{size}", work) for m in METHODS}
    close_shared_connections()
    fresh = upload_dir(console, handle, src, f"bench-f{size}", method="rsync", private_key=key)
    console.run(f"rm -rf bench-f{size}", timeout_seconds=600)
    row["rsync_fresh"] = {
        "upload_s": round(fresh.seconds, 3),
        "upload_mibps": _mibps(size * MiB, fresh.seconds),
    }
    dest = str(server.home / f"rsync{size}")
    rs = _rsync(server, src, dest)
    subprocess.run(["rm", "-rf", dest], check=True)
    row["bare_rsync"] = {"upload_s": round(rs, 3), "upload_mibps": _mibps(size * MiB, rs)}
    return row


def _median_round(rows: list[dict[str, Any]], size_mib: int) -> dict[str, Any]:
    """One method's rounds as one row: the median seconds (and their MiB/s) each way, the
    largest peak RSS, the retries summed; the rest as the first round had it."""
    row = dict(rows[0])
    for way in ("upload", "download"):
        if f"{way}_s" in row:
            seconds = statistics.median(r[f"{way}_s"] for r in rows)
            row[f"{way}_s"] = round(seconds, 3)
            row[f"{way}_mibps"] = _mibps(size_mib * MiB, seconds)
    if "client_peak_rss_mib" in row:
        row["client_peak_rss_mib"] = {
            way: max(r["client_peak_rss_mib"][way] for r in rows) for way in ("upload", "download")
        }
        row["retries"] = sum(r["retries"] for r in rows)
    if len(rows) > 1:
        row["rounds"] = len(rows)
    return row


def _ratios(row: dict[str, Any]) -> dict[str, Any]:
    """pty over sftp each way, and the best direct method over bare rsync (upload)."""
    out: dict[str, Any] = {
        f"pty_over_sftp_{way}": round(row["sftp"][f"{way}_s"] / row["pty"][f"{way}_s"], 2)
        for way in ("upload", "download")
    }
    best = min(("sftp", "rsync"), key=lambda m: row[m]["upload_s"])
    out["best_direct"] = best
    out["direct_over_rsync"] = round(row["bare_rsync"]["upload_s"] / row[best]["upload_s"], 2)
    fresh = min(row["sftp"]["upload_s"], row["rsync_fresh"]["upload_s"])
    out["direct_over_rsync_fresh"] = round(row["bare_rsync"]["upload_s"] / fresh, 2)
    return out


def _second_uploads(
    console: PodConsole, handle: PodHandle, key: Any, work: Path, size_mib: int
) -> dict[str, Any]:
    """Per direct method, one random ``size_mib`` file uploaded, then uploaded again
    unchanged (a retry, a resumed attempt), then again after 1 MiB in its middle was
    rewritten in place (a checkpoint saved over the old one): the file content each
    upload sent (``sent_bytes``, bytes) and its seconds."""
    src = work / "again"
    src.mkdir()
    path = src / "ckpt.bin"
    _random_file(path, size_mib * MiB)
    changed = min(MiB, size_mib * MiB // 2)
    middle = (size_mib * MiB - changed) // 2
    out: dict[str, Any] = {"bytes": size_mib * MiB, "rewritten_bytes": changed}
    for method in METHODS:
        remote = f"bench-again-{method}"
        row: dict[str, Any] = {}
        with open(path, "rb") as fh:
            fh.seek(middle)
            kept = fh.read(changed)
        for name in ("first", "unchanged", "rewritten_1mib"):
            if name == "rewritten_1mib":
                with open(path, "r+b") as fh:
                    fh.seek(middle)
                    fh.write(os.urandom(changed))
            up = upload_dir(console, handle, src, remote, method=method, private_key=key)
            assert up.verified
            row[name] = {"sent_bytes": up.sent_bytes, "seconds": round(up.seconds, 3)}
        with open(path, "r+b") as fh:
            fh.seek(middle)
            fh.write(kept)
        console.run(f"rm -rf {remote}", timeout_seconds=600)
        out[method] = row
    shutil.rmtree(src)
    return out


def _rsync(server: Any, src: Path, dest: str) -> float:
    ssh = (
        f"ssh -i {server.key_file()} -p {server.port} -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    )
    t = time.monotonic()
    subprocess.run(
        ["rsync", "-a", "-e", ssh, f"{src}/", f"{server.user}@127.0.0.1:{dest}/"], check=True
    )
    return time.monotonic() - t


def _hashing(work: Path, size: int) -> dict[str, Any]:
    path = work / "hash.bin"
    path.write_bytes(os.urandom(size))
    subprocess.run(["sha256sum", str(path)], capture_output=True, check=True)  # warm cache
    t = time.monotonic()
    subprocess.run(["sha256sum", str(path)], capture_output=True, check=True)
    tool = time.monotonic() - t
    t = time.monotonic()
    mf.file_entry(str(path), path.name)
    ours = time.monotonic() - t
    path.unlink()
    return {
        "bytes": size,
        "sha256sum_mibps": _mibps(size, tool),
        "manifest_mibps": _mibps(size, ours),
        "ratio": round(tool / ours, 2),
    }


def _rtt(console: PodConsole, server: Any, n: int = 200) -> dict[str, Any]:
    t = time.monotonic()
    for _ in range(n):
        console.run("true", timeout_seconds=30)
    pty_s = time.monotonic() - t
    client = connect_direct(server.endpoint(), server.client_key.private_key)
    t = time.monotonic()
    for _ in range(n):
        _, out, _ = client.exec_command("true")
        out.channel.recv_exit_status()
    exec_s = time.monotonic() - t
    client.close()
    return {
        "commands": n,
        "console_s": round(pty_s, 3),
        "exec_s": round(exec_s, 3),
        "ratio": round(pty_s / exec_s, 2),
    }


def run(
    sizes_mib: list[int],
    proxy_mib: int,
    *,
    framings: tuple[str, ...] = ("auto",),
    streams: tuple[int, ...] = (1,),
    link_mbit: float = 100.0,
    conn_mbit: float | None = None,
    delay_ms: float = 50.0,
    proxy_only: bool = False,
    proxy_sftp: bool = True,
    rounds: int = 1,
) -> dict[str, Any]:
    """Run every benchmark (or only the proxy's, ``proxy_only``); returns the JSON-able
    results."""
    results: dict[str, Any] = {
        "sizes_mib": sizes_mib,
        "rounds": rounds,
        "load_average": list(os.getloadavg()),
        "random": {},
        "targets": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        with run_sshd(work / "sshd") as server:
            handle = server.handle(pod_id="bench")
            key = server.client_key.private_key
            if not proxy_only:
                _loopback(results, server, handle, key, work, sizes_mib, rounds)
            results["wan_proxy"] = _through_proxy(
                server,
                handle,
                key,
                work,
                proxy_mib,
                framings=framings,
                streams=streams,
                link_mbit=link_mbit,
                conn_mbit=conn_mbit,
                delay_ms=delay_ms,
                sftp=proxy_sftp,
            )
    results["load_average_after"] = list(os.getloadavg())
    results["targets"] = _targets(results)
    return results


def _loopback(
    results: dict[str, Any],
    server: Any,
    handle: PodHandle,
    key: Any,
    work: Path,
    sizes_mib: list[int],
    rounds: int = 1,
) -> None:
    """The loopback measurements: random files (pty, sftp, rsync), the text bundle,
    the console round trip and hashing."""
    with PodConsole.for_pod(handle, key) as console:
        bootstrap_pod_tools(console, handle)
        for size in sizes_mib:
            src = work / f"rand{size}"
            src.mkdir()
            _random_file(src / "data.bin", size * MiB)
            each = [
                _random_round(console, handle, key, server, src, size, work) for _ in range(rounds)
            ]
            named = (*METHODS, "rsync_fresh", "bare_rsync")
            row: dict[str, Any] = {m: _median_round([r[m] for r in each], size) for m in named}
            row.update(_ratios(row))
            if rounds > 1:
                row["per_round"] = [_ratios(r) for r in each]
            results["random"][str(size)] = row
            shutil.rmtree(src)
        results["second_upload"] = _second_uploads(console, handle, key, work, max(sizes_mib))
        text = work / "text"
        text.mkdir()
        (text / "corpus.jsonl").write_text(
            '{"text": "the quick brown fox jumps over the lazy dog", "label": 1}\n'
            * (max(sizes_mib) * MiB // 64)
        )
        results["text_bundle"] = {
            "bytes": (text / "corpus.jsonl").stat().st_size,
            "pty_auto": _roundtrip(console, handle, key, text, "pty", "t", work),
            "pty_no_zlib": _roundtrip(
                console, handle, key, text, "pty", "tn", work, options=PtyOptions(compress=False)
            ),
            "sftp": _roundtrip(console, handle, key, text, "sftp", "t", work),
        }
        results["console_rtt"] = _rtt(console, server)
    results["hashing"] = _hashing(work, max(sizes_mib) * MiB)


def _through_proxy(
    server: Any,
    handle: PodHandle,
    key: Any,
    work: Path,
    size_mib: int,
    *,
    framings: tuple[str, ...],
    streams: tuple[int, ...],
    link_mbit: float,
    conn_mbit: float | None,
    delay_ms: float,
    sftp: bool,
) -> dict[str, Any]:
    """``pty`` (each framing × stream count) and ``sftp`` through the WAN proxy, each
    against what one plain TCP stream gets through the same proxy."""
    link_rate = link_mbit * 1e6 / 8
    conn_rate = conn_mbit * 1e6 / 8 if conn_mbit else None
    wan: dict[str, Any] = {
        "delay_ms_each_way": delay_ms,
        "cap_mbit": link_mbit,
        "per_connection_cap_mbit": conn_mbit,
        "bytes": size_mib * MiB,
        "pty": {},
    }
    with WanProxy(
        server.port,
        delay_seconds=delay_ms / 1000,
        rate_bytes_per_second=link_rate,
        connection_rate_bytes_per_second=conn_rate,
    ) as px:
        one_stream = measure_link(px)
        wan["tcp_stream_mibps"] = round(one_stream / MiB, 2)
        wan["link_mibps"] = round(link_rate / MiB, 2)
        # The link a transfer can fill: one TCP stream's rate without a per-connection
        # cap (the cap less TCP's own overhead); the shared cap with one.
        link = one_stream if conn_rate is None else link_rate
        far = handle.model_copy(
            update={"ssh": handle.ssh.model_copy(update={"port": px.port})}  # type: ignore[union-attr]
        )
        src = work / "wan"
        src.mkdir()
        _random_file(src / "data.bin", size_mib * MiB)
        with PodConsole.for_pod(far, key) as console:
            bootstrap_pod_tools(console, far)
            for framing in framings:
                for n in streams:
                    opts = PtyOptions(framing=framing, streams=n)
                    row = _roundtrip(
                        console, far, key, src, "pty", f"w{framing}{n}", work, options=opts
                    )
                    row["upload_over_link"] = round(row["upload_mibps"] * MiB / link, 2)
                    row["download_over_link"] = round(row["download_mibps"] * MiB / link, 2)
                    row["down_over_up"] = round(row["download_mibps"] / row["upload_mibps"], 2)
                    wan["pty"][f"{framing}x{n}"] = row
            if sftp:
                wan["sftp"] = _roundtrip(console, far, key, src, "sftp", "wan", work)
        shutil.rmtree(src)
    rows = list(wan["pty"].values())
    wan["pty_over_link"] = {
        name: min(r["upload_over_link"], r["download_over_link"]) for name, r in wan["pty"].items()
    }
    if sftp and rows:
        wan["pty_over_sftp_upload"] = round(
            max(r["upload_mibps"] for r in rows) / wan["sftp"]["upload_mibps"], 2
        )
    return wan


def _targets(results: dict[str, Any]) -> dict[str, Any]:
    """Each goal with the measured value (None: not measured in this run)."""
    wan = results["wan_proxy"]
    by_framing: dict[str, float] = {}
    for name, ratio in wan["pty_over_link"].items():
        framing = wan["pty"][name]["link"]["framing"]
        by_framing[framing] = max(by_framing.get(framing, 0.0), ratio)
    rows = list(wan["pty"].values())
    targets: dict[str, Any] = {
        "proxy_pty_raw_over_link (>=0.9)": by_framing.get("raw"),
        "proxy_pty_base64_over_link (>=0.72)": by_framing.get("base64"),
        "proxy_pty_download_over_upload (>=1.0)": min(
            (r["down_over_up"] for r in rows), default=None
        ),
        "client_peak_rss_mib (<=200)": max(
            (max(v for v in r["client_peak_rss_mib"].values() if v is not None) for r in rows),
            default=None,
        ),
        "pod_peak_rss_mib (<=200)": max(
            (r["link"]["pod_peak_rss_mib"] for r in rows), default=None
        ),
    }
    if results["random"]:
        biggest = results["random"][str(max(results["sizes_mib"]))]
        targets["pty_vs_sftp_random (>=0.6)"] = {
            way: biggest[f"pty_over_sftp_{way}"] for way in ("upload", "download")
        }
        targets["direct_vs_rsync (>=0.9)"] = biggest["direct_over_rsync"]
        targets["direct_vs_rsync_fresh_connection (>=0.9)"] = biggest["direct_over_rsync_fresh"]
        targets["console_rtt_vs_exec (<=1.5)"] = results["console_rtt"]["ratio"]
        targets["hashing_vs_sha256sum (>=0.9)"] = results["hashing"]["ratio"]
        again = results["second_upload"]
        targets["unchanged_second_upload_sent_bytes (==0)"] = max(
            again[m]["unchanged"]["sent_bytes"] for m in METHODS
        )
        targets["rewritten_1mib_sent_bytes"] = {
            m: again[m]["rewritten_1mib"]["sent_bytes"] for m in METHODS
        }
    return targets


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv: list[str] | None = None) -> int:
    """Parse the options (see ``--help``); run; print the results as JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1,8", help="MiB per random file, e.g. 8,64,256")
    parser.add_argument(
        "--proxy-mib",
        type=int,
        default=None,
        help=f"MiB through the WAN proxy, up to {MAX_PROXY_MIB} (default: min(16, largest size))",
    )
    parser.add_argument(
        "--framing", default="auto", help="pty framings through the proxy, e.g. raw,base64"
    )
    parser.add_argument(
        "--streams", default="1", help="pty stream counts through the proxy, e.g. 1,4"
    )
    parser.add_argument("--mbit", type=float, default=100.0, help="the proxy's link cap (Mbit/s)")
    parser.add_argument(
        "--conn-mbit",
        type=float,
        default=None,
        help="per-connection cap (Mbit/s): a gateway that limits each session",
    )
    parser.add_argument("--delay-ms", type=float, default=50.0, help="one-way delay of the proxy")
    parser.add_argument(
        "--proxy-only", action="store_true", help="only the proxy measurements (no loopback)"
    )
    parser.add_argument("--no-proxy-sftp", action="store_true", help="skip sftp through the proxy")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of the random-file rows (each method, then bare rsync, per round); "
        "each row then gives the median seconds",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in _csv(args.sizes)]
    proxy = args.proxy_mib or min(16, max(sizes))
    if not 1 <= proxy <= MAX_PROXY_MIB:
        parser.error(f"--proxy-mib must be 1 to {MAX_PROXY_MIB}")
    framings = tuple(_csv(args.framing))
    for framing in framings:
        if framing not in FRAMING_CHOICES:
            parser.error(f"--framing {framing!r} is not one of: {', '.join(FRAMING_CHOICES)}")
    results = run(
        sizes,
        proxy,
        framings=framings,
        streams=tuple(int(n) for n in _csv(args.streams)),
        link_mbit=args.mbit,
        conn_mbit=args.conn_mbit,
        delay_ms=args.delay_ms,
        proxy_only=args.proxy_only,
        proxy_sftp=not args.no_proxy_sftp,
        rounds=args.rounds,
    )
    print(json.dumps(results, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
