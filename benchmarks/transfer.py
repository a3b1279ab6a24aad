"""Transfer benchmarks: ratios measured in one run on a loopback OpenSSH sshd.

    python -m benchmarks.transfer --json                 # 1 and 8 MiB (about 1 minute)
    python -m benchmarks.transfer --json --sizes 8,64    # bigger files
    python -m benchmarks.transfer --json --sizes 256     # the largest (several minutes)

Measures (upload then download, seconds and MiB/s): ``pty`` and ``sftp`` for random
files of each size and for a compressible text bundle; the best direct method vs
``rsync`` over ssh; 200 trivial console commands vs ``exec_command``; md5+sha256
hashing vs ``sha256sum``; and ``pty`` vs ``sftp`` through a proxy adding 50 ms each
way and capping 100 Mbit/s. Targets (reported, never asserted): pty ≥ 0.6×sftp
(random), ≥ 0.8×sftp via the proxy, direct ≥ 1.0×rsync, console rtt ≤ 1.5×exec,
hashing ≥ 0.9×sha256sum.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.wan_proxy import WanProxy
from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.dispatch import download_dir, upload_dir
from prefect_runpod.blocks.transfer.pod_tools import bootstrap_pod_tools
from prefect_runpod.blocks.transfer.sftp import connect_direct
from tests.fixtures.sshd import run_sshd

MiB = 1024 * 1024


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
    up = upload_dir(console, handle, src, remote, method=method, private_key=key, **kw)
    t = time.monotonic()
    down = download_dir(
        console, handle, remote, work / f"back-{tag}-{method}", method=method, private_key=key, **kw
    )
    down_s = time.monotonic() - t
    console.run(f"rm -rf {remote}", timeout_seconds=120)
    shutil.rmtree(work / f"back-{tag}-{method}", ignore_errors=True)
    assert up.verified and down.verified
    return {
        "upload_s": round(up.seconds, 3),
        "upload_mibps": _mibps(up.bytes, up.seconds),
        "download_s": round(down_s, 3),
        "download_mibps": _mibps(down.bytes, down_s),
        "retries": up.retries + down.retries,
    }


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
    mf.hash_file(str(path))
    ours = time.monotonic() - t
    path.unlink()
    return {
        "bytes": size,
        "sha256sum_mibps": _mibps(size, tool),
        "md5_sha256_mibps": _mibps(size, ours),
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


def run(sizes_mib: list[int], proxy_mib: int) -> dict[str, Any]:
    """Run every benchmark; returns the JSON-able results."""
    results: dict[str, Any] = {"sizes_mib": sizes_mib, "random": {}, "targets": {}}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        with run_sshd(work / "sshd") as server:
            handle = server.handle(pod_id="bench")
            key = server.client_key.private_key
            with PodConsole.for_pod(handle, key) as console:
                bootstrap_pod_tools(console, handle)
                for size in sizes_mib:
                    src = work / f"rand{size}"
                    src.mkdir()
                    (src / "data.bin").write_bytes(os.urandom(size * MiB))
                    row = {
                        m: _roundtrip(console, handle, key, src, m, f"r{size}", work)
                        for m in ("pty", "sftp")
                    }
                    row["pty_over_sftp_upload"] = round(
                        row["pty"]["upload_mibps"] / row["sftp"]["upload_mibps"], 2
                    )
                    dest = str(server.home / f"rsync{size}")
                    rs = _rsync(server, src, dest)
                    subprocess.run(["rm", "-rf", dest], check=True)
                    row["rsync"] = {
                        "upload_s": round(rs, 3),
                        "upload_mibps": _mibps(size * MiB, rs),
                    }
                    row["direct_over_rsync"] = round(
                        row["sftp"]["upload_mibps"] / row["rsync"]["upload_mibps"], 2
                    )
                    results["random"][str(size)] = row
                    shutil.rmtree(src)
                text = work / "text"
                text.mkdir()
                (text / "corpus.jsonl").write_text(
                    '{"text": "the quick brown fox jumps over the lazy dog", "label": 1}\n'
                    * (max(sizes_mib) * MiB // 64)
                )
                from prefect_runpod.blocks.transfer.pty import PtyOptions

                results["text_bundle"] = {
                    "bytes": (text / "corpus.jsonl").stat().st_size,
                    "pty_zlib": _roundtrip(
                        console,
                        handle,
                        key,
                        text,
                        "pty",
                        "tz",
                        work,
                        options=PtyOptions(compress=True),
                    ),
                    "pty": _roundtrip(console, handle, key, text, "pty", "t", work),
                    "sftp": _roundtrip(console, handle, key, text, "sftp", "t", work),
                }
                results["console_rtt"] = _rtt(console, server)
            results["hashing"] = _hashing(work, max(sizes_mib) * MiB)
            with WanProxy(server.port, delay_seconds=0.05, rate_bytes_per_second=12_500_000) as px:
                far = handle.model_copy(
                    update={
                        "ssh": handle.ssh.model_copy(  # type: ignore[union-attr]
                            update={"port": px.port}
                        )
                    }
                )
                src = work / "wan"
                src.mkdir()
                (src / "data.bin").write_bytes(os.urandom(proxy_mib * MiB))
                with PodConsole.for_pod(far, key) as console:
                    wan = {
                        m: _roundtrip(console, far, key, src, m, "wan", work)
                        for m in ("pty", "sftp")
                    }
                wan["pty_over_sftp_upload"] = round(
                    wan["pty"]["upload_mibps"] / wan["sftp"]["upload_mibps"], 2
                )
                wan.update(delay_ms_each_way=50, cap_mbit=100, bytes=proxy_mib * MiB)
                results["wan_proxy"] = wan
    biggest = results["random"][str(max(sizes_mib))]
    results["targets"] = {
        "pty_vs_sftp_random (>=0.6)": biggest["pty_over_sftp_upload"],
        "pty_vs_sftp_proxy (>=0.8)": results["wan_proxy"]["pty_over_sftp_upload"],
        "direct_vs_rsync (>=1.0)": biggest["direct_over_rsync"],
        "console_rtt_vs_exec (<=1.5)": results["console_rtt"]["ratio"],
        "hashing_vs_sha256sum (>=0.9)": results["hashing"]["ratio"],
    }
    return results


def main(argv: list[str] | None = None) -> int:
    """Parse ``--sizes`` (MiB, comma-separated), ``--proxy-mib`` and ``--json``; run."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1,8", help="MiB per random file, e.g. 8,64,256")
    parser.add_argument(
        "--proxy-mib",
        type=int,
        default=None,
        help="MiB through the WAN proxy (default: min(16, largest size))",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    proxy = args.proxy_mib or min(16, max(sizes))
    results = run(sizes, proxy)
    print(json.dumps(results, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
