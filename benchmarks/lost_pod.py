"""How fast a run notices that its pod is gone: the demo fine-tune, its pod terminated
from outside while it trains, on the local pod and on emulated RunPod.

    python -m benchmarks.lost_pod --json                  # 3 runs each, about 2 minutes
    python -m benchmarks.lost_pod --json --runs 5 --providers local

Each run starts the demo with a pause right after training starts, lets it go, waits
until the job has logged a line, terminates the pod the way another shell would (the
local pod's provider; RunPod's API on the emulator), and measures from the pod's end to
the moment the run's ``train`` stage failed (``detection_seconds``) and to the run's
final state (``stopped_seconds``). Reported against the 30 s target, never asserted;
``pod_poll_seconds`` is the default (10 s): the drop of the SSH session, not the poll,
is what is noticed first while training.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

TARGET_SECONDS = 30.0


def _when_running(faults: Path, out: Path, end_pod: Any, seen: dict[str, Any]) -> None:
    """Release the pause, wait for the job's first log line, end the pod from outside."""
    from prefect_runpod.blocks.faults import release_marker

    marker = faults / "train_running.reached"
    deadline = time.monotonic() + 300
    while not marker.exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    report = json.loads((out / "run-report.json").read_text())
    release_marker(faults, "train_running")
    time.sleep(2.0)  # the follower is reading the log by now
    seen["pod_id"] = report["pod_id"]
    seen["gone_at"] = end_pod(report["pod_id"])


def _one_run(provider: str, work: Path, end_pod: Any) -> dict[str, Any]:
    from prefect_runpod.flows.finetune import finetune

    faults, out = work / "faults", work / "out"
    os.environ["PREFECT_RUNPOD_FAULTS"] = "train_running:pause"
    os.environ["PREFECT_RUNPOD_FAULT_DIR"] = str(faults)
    seen: dict[str, Any] = {}
    helper = threading.Thread(target=_when_running, args=(faults, out, end_pod, seen), daemon=True)
    helper.start()
    try:
        state = finetune(provider=provider, output_dir=str(out), return_state=True)
    finally:
        os.environ.pop("PREFECT_RUNPOD_FAULTS", None)
        helper.join(timeout=60)
    report = json.loads((out / "run-report.json").read_text())
    train = next(s for s in report["stages"] if s["name"] == "train")
    failed_at = datetime.fromisoformat(train["ended_at"]).timestamp()
    stopped_at = state.timestamp.timestamp() if state.timestamp else time.time()
    return {
        "provider": provider,
        "state": state.type.value,
        "train_reason": (train["reason"] or "")[:120],
        "detection_seconds": round(failed_at - seen["gone_at"], 2),
        "stopped_seconds": round(stopped_at - seen["gone_at"], 2),
        "billed_seconds": report["cost"]["billed_seconds"],
        "ended_by": (report.get("pod_end") or {}).get("ended_by"),
    }


def _local(runs: int, root: Path) -> list[dict[str, Any]]:
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

    def end_pod(pod_id: str) -> float:
        return LocalPodProvider().terminate(pod_id).confirmed_at.timestamp()

    return [_one_run("local", root / f"local-{n}", end_pod) for n in range(runs)]


@contextlib.contextmanager
def emulated_runpod(root: Path) -> Iterator[Any]:
    """RunPod's API emulated on loopback (REST v2, gateway SSH; its pods under
    ``root/emulated-pods``), with a fresh SSH key on the account, and this process's
    RunPod settings (``RUNPOD_API_KEY``, ``RUNPOD_API_BASE_URL``, the key path, the
    gateway) pointed at it; the emulator is stopped (its pods ended) on the way out.

    Yields:
        The ``tests.emulators.runpod_api.RunPodEmulator``.
    """
    from prefect_runpod.blocks.keys import generate_keypair
    from tests.emulators.runpod_api import RunPodEmulator

    keypair = generate_keypair("bench")
    key_file = root / "id_ed25519_runpod"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text(keypair.private_key.get_secret_value())
    key_file.chmod(0o600)
    emulator = RunPodEmulator(
        api_key="rpa_" + "b" * 32, home=root / "emulated-pods", retire={"graphql"}
    ).start()
    emulator.pub_key = keypair.public_key
    os.environ.update(
        RUNPOD_API_KEY=emulator.api_key,
        RUNPOD_API_BASE_URL=emulator.base_url,
        RUNPOD_SSH_KEY_PATH=str(key_file),
        RUNPOD_SSH_GATEWAY_HOST="127.0.0.1",
        RUNPOD_SSH_GATEWAY_PORT=str(emulator.gateway_port),
    )
    try:
        yield emulator
    finally:
        emulator.stop()


def _runpod(runs: int, root: Path) -> list[dict[str, Any]]:
    with emulated_runpod(root) as emulator:

        def end_pod(pod_id: str) -> float:
            emulator.terminate(pod_id)  # what RunPod's console (or its API) does
            return float(emulator.ended[pod_id].at)

        return [_one_run("runpod", root / f"runpod-{n}", end_pod) for n in range(runs)]


def main() -> None:
    """Run the benchmark and print the results (JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--providers", default="local,runpod")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-lost-pod-"))
    os.environ.setdefault("PREFECT_RUNPOD_HOME", str(root / "pods"))
    from prefect.testing.utilities import prefect_test_harness

    results: dict[str, Any] = {"target_seconds": TARGET_SECONDS, "pod_poll_seconds": 10.0}
    with prefect_test_harness(server_startup_timeout=120):
        for provider in args.providers.split(","):
            rows = {"local": _local, "runpod": _runpod}[provider](args.runs, root)
            median = statistics.median(r["detection_seconds"] for r in rows)
            results[provider] = {
                "runs": rows,
                "median_detection_seconds": median,
                "ratio_to_target": round(median / TARGET_SECONDS, 3),
            }
    print(json.dumps(results, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
