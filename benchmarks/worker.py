"""What a pod adds before a flow starts: seconds from ``prefect deployment run`` to the
flow's first log line, examples/any-flow on a ``runpod`` pool (the local pod) against the
same flow on a process pool (a process worker running it on this machine).

    python -m benchmarks.worker --json              # 3 runs each, about 2 minutes
    python -m benchmarks.worker --json --runs 1

Both workers are real ``prefect worker start`` processes polling every second against
Prefect's test server. Each run starts when ``prefect deployment run`` is invoked (the
CLI's own start-up is in both) and ends at the timestamp of the flow's own first line
(``digest …``, logged by the flow's code: on the pod for the ``runpod`` pool).
``first_log_seconds`` is each run's; ``best`` the fastest; ``pod_over_process`` the
best pod run over the best process run. Never asserted: the tests check the behaviour.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "any-flow"


def _prefect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _env() -> dict[str, str]:
    from prefect.settings import get_current_settings

    return os.environ | {"PREFECT_API_URL": str(get_current_settings().api.url)}


@contextmanager
def _worker(pool: str, kind: str, log: Path) -> Iterator[None]:
    """``prefect worker start --pool POOL --type KIND``, stopped (its group) at the end."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool,
             "--type", kind, "--prefetch-seconds", "5"],
            env=_env() | {"PREFECT_WORKER_QUERY_SECONDS": "1"},
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _first_flow_line(flow_run_id: str, deadline_s: float) -> Any:
    """The flow's own first log line (``digest …``) of the run, once it is in Prefect."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    end = time.monotonic() + deadline_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < end:
            logs = client.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))  # type: ignore[list-item]
            )
            found = [e for e in logs if e.message.startswith("digest ")]
            if found:
                return min(found, key=lambda e: e.timestamp)
            time.sleep(0.2)
    raise RuntimeError(f"flow run {flow_run_id} logged no 'digest' line in {deadline_s:.0f} s")


def _wait_final(flow_run_id: str, deadline_s: float) -> str:
    from prefect.client.orchestration import get_client

    end = time.monotonic() + deadline_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < end:
            state = client.read_flow_run(flow_run_id).state  # type: ignore[arg-type]
            if state is not None and state.is_final():
                return state.type.value
            time.sleep(0.5)
    return "not final"


def _one_run(deployment: str, out: str) -> dict[str, Any]:
    """``prefect deployment run DEPLOYMENT`` to the flow's first line, in s; the flow
    writes its file to ``out``."""
    started = time.time()
    done = _prefect("deployment", "run", deployment, "--param", "rounds=1", "--param", f"out={out}")
    if done.returncode != 0:
        raise RuntimeError(f"prefect deployment run failed: {done.stdout}{done.stderr}")
    found = re.search(r"UUID: ([0-9a-f-]{36})", done.stdout)
    if found is None:
        raise RuntimeError(f"prefect deployment run named no flow run: {done.stdout}")
    flow_run_id = found.group(1)
    line = _first_flow_line(flow_run_id, 300.0)
    return {
        "first_log_seconds": round(line.timestamp.timestamp() - started, 2),
        "state": _wait_final(flow_run_id, 300.0),
    }


def _pool_runs(kind: str, runs: int, work: Path) -> dict[str, Any]:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from deploy import deploy  # examples/any-flow/deploy.py
    finally:
        sys.path.remove(str(EXAMPLE))
    pool = f"bench-{kind}"
    done = _prefect("work-pool", "create", pool, "--type", kind)
    if done.returncode != 0:
        raise RuntimeError(f"could not create pool {pool}: {done.stdout}{done.stderr}")
    with redirect_stdout(sys.stderr):  # Prefect's deploy prints a table: stdout is the JSON
        deploy(pool, name=pool)
    with _worker(pool, kind, work / f"{kind}-worker.log"):
        # The process worker runs the flow in examples/any-flow itself: its file goes here.
        out = str(work / "result.txt") if kind == "process" else "result.txt"
        rows = [_one_run(f"any-flow/{pool}", out) for _ in range(runs)]
    seconds = [r["first_log_seconds"] for r in rows]
    return {"runs": rows, "best": min(seconds)}


def main() -> None:
    """Run the benchmark and print the results (JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    os.environ.setdefault("PREFECT_RUNPOD_HOME", str(work / "pods"))
    from prefect.testing.utilities import prefect_test_harness

    load = os.getloadavg()[0]
    with prefect_test_harness(server_startup_timeout=300):
        results: dict[str, Any] = {
            "process": _pool_runs("process", args.runs, work),
            "runpod_local_pod": _pool_runs("runpod", args.runs, work),
        }
    results["pod_over_process"] = round(
        results["runpod_local_pod"]["best"] / results["process"]["best"], 2
    )
    results["pod_adds_seconds"] = round(
        results["runpod_local_pod"]["best"] - results["process"]["best"], 2
    )
    results["load_average"] = round(load, 2)
    results["load_average_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
