"""What resuming after a lost pod costs, on the local pod and on emulated RunPod: the
demo fine-tune (6 epochs, a short pause after each) with and without checkpoints, and
with its pod's host lost once a checkpoint has verified off the pod (the local pod's
daemon killed; on emulated RunPod the pod's host failed, ``fail_host``: ERROR).

    python -m benchmarks.resume --json                    # four runs, about 4 minutes
    python -m benchmarks.resume --json --providers local  # the local pod's three

Reported (nothing is asserted):

- ``overhead``: the train stage's seconds with checkpoints (each one copied off the pod
  while it trains) over those of the same demo without, on an uninterrupted run (goal:
  at most 1.05);
- ``loss`` (the local pod) and ``loss_runpod`` (emulated RunPod, its REST v2 API and
  gateway on loopback, the pods local pods under it): from the moment the host was lost
  to training running again on the new pod (the second attempt's train stage started;
  goal 60 s), the steps lost,
  and each checkpoint's copy lag (the job's signal → verified here) as a fraction of
  the checkpoint interval (the mean time between two signals);
- the bytes each checkpoint sent and copied locally.

The overhead is measured on the local pod only: emulated RunPod runs the same job on the
same kind of pod, behind one more API.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

RESUME_GOAL_SECONDS = 60.0
OVERHEAD_GOAL = 1.05
_EPOCHS = "--epochs 6 --sleep-per-epoch-seconds 1.5"


def _bundle(root: Path, checkpoints: bool, tag: str) -> Path:
    """A copy of the demo, 6 epochs; without checkpoints: no checkpoint key, no flags."""
    import shutil

    from prefect_runpod.tasks.bundle import demo_bundle

    dest = root / f"bundle-{tag}"
    shutil.copytree(demo_bundle(), dest, ignore=shutil.ignore_patterns("outputs", "__pycache__"))
    spec = (dest / "bundle.toml").read_text()
    spec = spec.replace("--out outputs ", f"--out outputs {_EPOCHS} ", 1)
    if not checkpoints:
        spec = spec.replace(" --checkpoints checkpoints --resume-from {resume_from}", "")
        spec = "\n".join(
            line for line in spec.splitlines() if not line.startswith(("checkpoints", "keep_"))
        )
    (dest / "bundle.toml").write_text(spec + "\n")
    return dest


def _run(bundle: Path, out: Path, provider: str = "local") -> dict[str, Any]:
    from prefect_runpod.flows.finetune import finetune

    state = finetune(bundle=str(bundle), output_dir=str(out), provider=provider, return_state=True)
    report: dict[str, Any] = json.loads((out / "run-report.json").read_text())
    report["_state"] = state.type.value
    return report


def _stage(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["stages"] if s["name"] == name)


def _kill_local(pod_id: str) -> bool:
    """The local pod's host is lost: its daemon killed (False: no such pod)."""
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from prefect_runpod.blocks.local_pod.registry import read_record

    record = read_record(LocalPodProvider().home, pod_id)
    if record is None:
        return False
    os.kill(record.pid, signal.SIGKILL)
    return True


def _lose_after_a_checkpoint(
    out: Path, seen: dict[str, float], lose: Callable[[str], bool]
) -> None:
    """Once a checkpoint verified off the pod, lose the pod's host (``lose(pod_id)``)."""
    deadline = time.monotonic() + 300
    while not any((out / "checkpoints").glob("step-*.manifest.json")):
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    pod_id = json.loads((out / "run-report.json").read_text())["pod_id"]
    seen["lost_at"] = time.time()
    if not lose(pod_id):
        del seen["lost_at"]


def _loss(
    root: Path, tag: str, provider: str, lose: Callable[[str], bool], model: bytes
) -> dict[str, Any]:
    """One run whose pod's host is lost after its first verified checkpoint: how long
    until it trained again, what it lost, and whether it ended with ``model``."""
    seen: dict[str, float] = {}
    out = root / f"out-{tag}"
    killer = threading.Thread(target=_lose_after_a_checkpoint, args=(out, seen, lose), daemon=True)
    killer.start()
    lost = _run(_bundle(root, True, tag), out, provider)
    killer.join(timeout=60)
    resumed = datetime.fromisoformat(_stage(lost, "train")["started_at"]).timestamp()
    attempts = lost["attempts"]
    return {
        "provider": provider,
        "state": lost["_state"],
        "attempts": len(attempts),
        "resumed_from": attempts[-1]["resumed_from"],
        "steps_lost": attempts[-1]["steps_lost"],
        "loss_to_training_resumed_seconds": round(resumed - seen["lost_at"], 2)
        if "lost_at" in seen
        else None,
        "same_model": (out / "outputs" / "model.json").read_bytes() == model,
        **_lags(lost),
    }


def _lags(report: dict[str, Any]) -> dict[str, Any]:
    copies = report["checkpoints"]
    signals = sorted(datetime.fromisoformat(c["signalled_at"]).timestamp() for c in copies)
    gaps = [b - a for a, b in zip(signals, signals[1:], strict=False)]
    interval = statistics.mean(gaps) if gaps else None
    lags = [c["lag_seconds"] for c in copies]
    return {
        "checkpoints": len(copies),
        "interval_seconds": round(interval, 3) if interval else None,
        "lag_seconds": lags,
        "lag_over_interval_max": round(max(lags) / interval, 3) if interval and lags else None,
        "sent_bytes": [c["sent_bytes"] for c in copies],
        "local_bytes": [c["local_bytes"] for c in copies],
    }


def main() -> None:
    """Run the benchmark and print the results (JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--providers", default="local,runpod")
    args = parser.parse_args()
    providers = args.providers.split(",")
    root = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    os.environ.setdefault("PREFECT_RUNPOD_HOME", str(root / "pods"))
    from prefect.testing.utilities import prefect_test_harness

    from benchmarks.lost_pod import emulated_runpod

    results: dict[str, Any] = {
        "goals": {"resume_s": RESUME_GOAL_SECONDS, "overhead": OVERHEAD_GOAL}
    }
    with prefect_test_harness(server_startup_timeout=120):
        plain = _run(_bundle(root, False, "plain"), root / "out-plain")
        ckpt = _run(_bundle(root, True, "ckpt"), root / "out-ckpt")
        base, with_ck = _stage(plain, "train")["seconds"], _stage(ckpt, "train")["seconds"]
        results["overhead"] = {
            "train_seconds_without": base,
            "train_seconds_with": with_ck,
            "ratio": round(with_ck / base, 3) if base else None,
            **_lags(ckpt),
        }
        model = (root / "out-ckpt" / "outputs" / "model.json").read_bytes()
        if "local" in providers:
            results["loss"] = _loss(root, "lost", "local", _kill_local, model)
        if "runpod" in providers:
            with emulated_runpod(root / "runpod") as emulator:

                def fail_host(pod_id: str) -> bool:
                    emulator.fail_host(pod_id, "ERROR")  # the host lost under the pod
                    return True

                results["loss_runpod"] = _loss(root, "lost-runpod", "runpod", fail_host, model)
                results["loss_runpod"]["pods_left"] = emulator.live_pod_ids()
    print(json.dumps(results, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
