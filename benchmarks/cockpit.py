"""How quickly the cockpit answers: ``prefect-runpod`` look-ups against the local Prefect
server it keeps, beside Prefect's own ``prefect flow-run ls`` against the same server.

    python -m benchmarks.cockpit --json                   # idle and under load, ~4 minutes
    python -m benchmarks.cockpit --json --load-workers 0  # idle only

In a scratch home (its own ``PREFECT_RUNPOD_HOME``, ``PREFECT_HOME`` and working
directory, no ``PREFECT_API_URL``) it starts the local server (``server start``), runs
the demo twice (the second run shows what a run costs once the server is up: its wall
time against the sum of its stage seconds in ``run-report.json``), then starts a third
demo paused in training so a pod lives, and times, as separate processes, best of
``--rounds`` taken in turns:

- ``prefect flow-run ls`` (Prefect's CLI, pointed at the same server);
- ``status``, ``pods``, ``logs RUN`` (the finished second run: its kept log) and ``cost``;
- ``ssh RUN --print`` (the paused run's live pod);
- ``--help``.

Then the same under load (``--load-workers`` ``stress-ng --cpu`` workers; 0 skips it).
It prints one JSON object with each phase's seconds, the ratios to ``prefect flow-run
ls``, the load averages, and ``targets`` (each goal with its measured value). Nothing is
asserted; the paused run is released and the server stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOOKUP_LIMIT_SECONDS = 1.5
HELP_LIMIT_SECONDS = 0.3
DEMO_RATIO_LIMIT = 1.5
_EXITS = {"cost": (0, 1)}
"""Exit statuses that are answers: ``cost`` exits 1 while a record may still bill (the
paused run's pod does)."""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect_runpod.flows.cli", *args]


def _prefect(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect", *args]


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int, str]:
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - started, proc.returncode, proc.stdout[-2000:] + proc.stderr[-2000:]


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _best_of(
    commands: dict[str, tuple[list[str], dict[str, str]]], cwd: Path, rounds: int
) -> dict[str, Any]:
    """Best wall seconds of each command over ``rounds`` rounds, the commands in turns (so
    a change of load falls on all of them alike)."""
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    failures: dict[str, str] = {}
    for _ in range(rounds):
        for name, (argv, env) in commands.items():
            took, code, tail = _timed(argv, env, cwd)
            seconds[name].append(took)
            if code not in _EXITS.get(name, (0,)):
                failures[name] = f"exit {code}: {tail.strip()[-300:]}"
    out: dict[str, Any] = {
        name: {"best_seconds": round(min(s), 3), "all_seconds": [round(x, 3) for x in s]}
        for name, s in seconds.items()
    }
    if failures:
        out["failures"] = failures
    return out


def _phase(env: dict[str, str], api_env: dict[str, str], work: Path, finished: str,
           live: str, rounds: int) -> dict[str, Any]:  # fmt: skip
    load_before = _load()
    commands = {
        "prefect flow-run ls": (_prefect("flow-run", "ls"), api_env),
        "status": (_cli("status"), env),
        "pods": (_cli("pods"), env),
        "logs RUN": (_cli("logs", finished), env),
        "cost": (_cli("cost"), env),
        "ssh RUN --print": (_cli("ssh", live, "--print"), env),
        "--help": (_cli("--help"), env),
    }
    timings = _best_of(commands, work, rounds)
    base = timings["prefect flow-run ls"]["best_seconds"]
    ratios = {
        name: round(timings[name]["best_seconds"] / base, 3)
        for name in ("status", "pods", "logs RUN", "cost", "ssh RUN --print")
    }
    return {
        "load_average_before": load_before,
        "load_average_after": _load(),
        "seconds": timings,
        "ratio_to_prefect_flow_run_ls": ratios,
    }


@contextlib.contextmanager
def _stress(workers: int) -> Iterator[None]:
    if workers <= 0 or shutil.which("stress-ng") is None:
        yield
        return
    proc = subprocess.Popen(
        ["stress-ng", "--cpu", str(workers), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        time.sleep(10.0)  # let the load average climb
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _demo(env: dict[str, str], work: Path, name: str) -> dict[str, Any]:
    out = work / name
    took, code, tail = _timed(_cli("finetune", "--output-dir", str(out)), env, work)
    report = json.loads((out / "run-report.json").read_text())
    stages = round(sum(s["seconds"] or 0.0 for s in report["stages"]), 3)
    return {
        "exit": code,
        "flow_run_id": report["flow_run_id"],
        "wall_seconds": round(took, 3),
        "stage_seconds": stages,
        "ratio": round(took / stages, 3) if stages else None,
        "tail": None if code == 0 else tail[-500:],
    }


def _paused_run(env: dict[str, str], work: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """A demo paused as training starts (its pod lives); returns the process, the run id
    and the fault marker dir."""
    faults, out = work / "faults", work / "live"
    paused = dict(env, PREFECT_RUNPOD_FAULTS="train_running:pause")
    paused["PREFECT_RUNPOD_FAULT_DIR"] = str(faults)
    paused["PREFECT_RUNPOD_FAULT_PAUSE_SECONDS"] = "3600"  # past both phases, under load too
    proc = subprocess.Popen(
        _cli("finetune", "--output-dir", str(out)),
        env=paused,
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not (faults / "train_running.reached").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the paused demo never reached training")
        time.sleep(0.2)
    return proc, json.loads((out / "run-report.json").read_text())["flow_run_id"], faults


def _targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    idle = result["phases"]["idle"]
    best = {k: v["best_seconds"] for k, v in idle["seconds"].items() if k != "failures"}
    rows: list[dict[str, Any]] = []
    for phase_name, phase in result["phases"].items():
        for name, ratio in phase["ratio_to_prefect_flow_run_ls"].items():
            rows.append(
                {
                    "goal": f"{name} <= 1.0 x prefect flow-run ls ({phase_name})",
                    "value": ratio,
                    "met": ratio <= 1.0,
                }  # fmt: skip
            )
    for name in ("status", "pods", "logs RUN", "cost", "ssh RUN --print"):
        rows.append(
            {
                "goal": f"{name} <= {LOOKUP_LIMIT_SECONDS} s idle",
                "value": best[name],
                "met": best[name] <= LOOKUP_LIMIT_SECONDS,
            }  # fmt: skip
        )
    rows.append(
        {
            "goal": f"--help <= {HELP_LIMIT_SECONDS} s idle",
            "value": best["--help"],
            "met": best["--help"] <= HELP_LIMIT_SECONDS,
        }  # fmt: skip
    )
    ratio = result["demo"]["second"]["ratio"]
    rows.append(
        {
            "goal": f"demo's second run <= {DEMO_RATIO_LIMIT} x its stage seconds",
            "value": ratio,
            "met": ratio is not None and ratio <= DEMO_RATIO_LIMIT,
        }  # fmt: skip
    )
    return rows


def run(rounds: int, load_workers: int) -> dict[str, Any]:
    """Everything the module's docstring lists; returns the JSON-ready result."""
    root = Path(tempfile.mkdtemp(prefix="cockpit-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_RUNPOD_HOME=str(root / "runpod-home"),
        PREFECT_HOME=str(root / "prefect-home"),
        PREFECT_RUNPOD_SERVER_PORT=os.environ.get("PREFECT_RUNPOD_SERVER_PORT", "4380"),
    )
    result: dict[str, Any] = {"load_average": _load(), "rounds": rounds}
    paused: subprocess.Popen[bytes] | None = None
    faults = root / "faults"
    try:
        took, code, tail = _timed(_cli("server", "start"), env, root)
        if code != 0:
            raise RuntimeError(f"server start failed: {tail}")
        record = json.loads((root / "runpod-home" / "server" / "server.json").read_text())
        result["server_start_seconds"] = round(took, 3)
        api_env = dict(env, PREFECT_API_URL=record["api_url"])
        result["demo"] = {"first": _demo(env, root, "run1"), "second": _demo(env, root, "run2")}
        finished = result["demo"]["second"]["flow_run_id"]
        paused, live, faults = _paused_run(env, root)
        result["phases"] = {"idle": _phase(env, api_env, root, finished, live, rounds)}
        if load_workers > 0:
            with _stress(load_workers):
                result["phases"]["loaded"] = _phase(env, api_env, root, finished, live, rounds)
            result["phases"]["loaded"]["stress_ng_cpu_workers"] = load_workers
        result["targets"] = _targets(result)
    finally:
        if paused is not None:
            from prefect_runpod.blocks.faults import release_marker

            release_marker(faults, "train_running")
            with contextlib.suppress(subprocess.TimeoutExpired):
                paused.wait(timeout=300)
        subprocess.run(_cli("server", "stop"), env=env, cwd=root, capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--rounds", type=int, default=3, help="timings per command (best of)")
    parser.add_argument(
        "--load-workers", type=int, default=2, help="stress-ng --cpu workers for the loaded phase"
    )
    args = parser.parse_args(argv)
    result = run(max(1, args.rounds), args.load_workers)
    print(json.dumps(result, indent=2 if args.json else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
