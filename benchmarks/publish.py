"""Publish benchmark: the time until a fine-tune's output is verified at its destination,
downloading it through the gateway vs publishing it from the pod, and the bytes that
cross the gateway for each.

    python -m benchmarks.publish --json                 # 1600 MiB, a 1.6 GB checkpoint
    python -m benchmarks.publish --json --mib 256       # a smaller output

A local pod (PTY-only gateway mode) holds an output folder: one random file of the
given size (random bytes do not compress) and a small ``config.json``. Its console is
reached through ``wan_proxy.py`` — 50 ms each way, 100 Mbit/s — standing for the
gateway between a laptop and a RunPod datacenter.

- **download**: ``download_dir`` with the ``pty`` method through the proxy, until the
  local copy is verified against the pod-side manifest.
- **publish**: the publish stage's work (``publish_on_pod``): the pod-side manifest
  comes back through the proxy, the pod uploads to the Hub emulator directly
  (unthrottled loopback, standing for the datacenter's own link), and the Hub's
  records are read back and compared, until every file is verified there.

For each it reports seconds and the bytes the proxy forwarded each way. The goal for
publish: only manifests, commands and logs cross the gateway (0 model bytes). Nothing
is asserted; the numbers are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from benchmarks.wan_proxy import WanProxy
from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.provider import PodRequest
from prefect_runpod.blocks.transfer.dispatch import download_dir
from prefect_runpod.blocks.transfer.pod_tools import bootstrap_pod_tools
from prefect_runpod.tasks.publish import publish_on_pod
from prefect_runpod.tasks.publish_target import parse_publish_target
from tests.emulators.hf_hub import HubToken, running_hub

MiB = 1024 * 1024


def _write_random(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        left = size
        while left:
            block = os.urandom(min(left, 16 * MiB))
            fh.write(block)
            left -= len(block)


def _gateway(proxy: WanProxy) -> dict[str, int]:
    return {"bytes_up": proxy.bytes_up, "bytes_down": proxy.bytes_down}


def run(size_mib: int, delay_ms: float = 50.0, mbit: float = 100.0) -> dict[str, Any]:
    """Both paths for one output size; returns the JSON-able results."""
    size = size_mib * MiB
    token = "hf_" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp:
        work = Path(tmp)
        provider = LocalPodProvider(home=work / "pods", mode="gateway")
        keypair = generate_keypair("bench-publish")
        handle = provider.create(PodRequest(public_key=keypair.public_key), "bench-publish")
        try:
            handle = provider.wait_ready(handle, 120)
            outputs = Path(handle.workdir) / "run" / "outputs"
            outputs.mkdir(parents=True)
            _write_random(outputs / "model.safetensors", size)
            (outputs / "config.json").write_text('{"model_type": "bench"}\n')
            assert handle.ssh is not None
            with WanProxy(
                handle.ssh.port,
                delay_seconds=delay_ms / 1000,
                rate_bytes_per_second=mbit * 1e6 / 8,
            ) as proxy:
                far = handle.model_copy(
                    update={"ssh": handle.ssh.model_copy(update={"port": proxy.port})}
                )
                key = keypair.private_key
                with PodConsole.for_pod(far, key) as console:
                    tools = bootstrap_pod_tools(console, far)
                    proxy.reset_counts()
                    started = time.monotonic()
                    down = download_dir(
                        console, far, str(outputs), work / "down", method="pty", private_key=key
                    )
                    download = {
                        "seconds": round(time.monotonic() - started, 1),
                        "verified": down.verified,
                        "payload_bytes": down.bytes,
                        **_gateway(proxy),
                    }
                (work / "down" / "model.safetensors").unlink()
                target = parse_publish_target("hf:bench/model")
                assert target is not None
                with (
                    running_hub([HubToken(token, "bench", "write")], []) as hub,
                    PodConsole.for_pod(far, key) as console,
                ):
                    proxy.reset_counts()
                    started = time.monotonic()
                    report = publish_on_pod(
                        console,
                        far,
                        target,
                        str(outputs),
                        tools_dir=tools,
                        python=sys.executable,
                        hf_token=SecretStr(token),
                        hf_endpoint=hub.endpoint,
                    )
                    publish = {
                        "seconds": round(time.monotonic() - started, 1),
                        "verified": report.verified,
                        "payload_bytes": report.bytes,
                        "storage": {f.path: f.storage for f in report.files},
                        **_gateway(proxy),
                    }
        finally:
            provider.terminate(handle.pod_id)
    for row in (download, publish):
        row["gateway_bytes"] = row["bytes_up"] + row["bytes_down"]
        row["gateway_bytes_per_output_byte"] = round(row["gateway_bytes"] / size, 6)
    return {
        "output_mib": size_mib,
        "link": {"delay_ms_each_way": delay_ms, "cap_mbit": mbit},
        "download": download,
        "publish": publish,
        "publish_over_download_seconds": round(
            publish["seconds"] / max(download["seconds"], 1e-9), 3
        ),
        "gateway_bytes_publish_over_download": round(
            publish["gateway_bytes"] / max(download["gateway_bytes"], 1), 6
        ),
    }


def main(argv: list[str] | None = None) -> int:
    """Parse ``--mib``, ``--delay-ms``, ``--mbit`` and ``--json``; run; print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1600, help="output size in MiB (default 1600)")
    parser.add_argument("--delay-ms", type=float, default=50.0, help="one-way delay (default 50)")
    parser.add_argument("--mbit", type=float, default=100.0, help="link cap (default 100 Mbit/s)")
    parser.add_argument("--json", action="store_true", help="one JSON line instead of indented")
    args = parser.parse_args(argv)
    results = run(args.mib, args.delay_ms, args.mbit)
    print(json.dumps(results) if args.json else json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
