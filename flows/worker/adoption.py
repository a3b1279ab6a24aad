"""What a ``runpod`` worker needs to take over a pod a stopped worker left
(docs/worker.md#a-worker-that-stops): where a local pod's per-run key is kept, how long
the pod's heartbeat must be quiet, and the look at that heartbeat."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.exceptions import SpecError

__all__ = ["adoption_quiet_seconds", "heartbeat_quiet", "worker_run_dir"]


def worker_run_dir(flow_run_id: str) -> Path:
    """``<PREFECT_RUNPOD_HOME>/worker/<flow_run_id>``: where the worker keeps a local
    pod's per-run SSH key (mode 0600) while the pod lives, so a restarted worker can
    reach the pod again; deleted once the pod is confirmed gone."""
    from prefect_runpod.blocks.local_pod.registry import default_home

    return default_home() / "worker" / flow_run_id


def adoption_quiet_seconds(heartbeat_stale_seconds: float) -> float:
    """How long a pod's heartbeat must go untouched before a worker takes the pod over,
    s: a quarter of the dead-man's limit, between 5 and 30 s. A worker that follows the
    pod touches it about every second, so a quiet heartbeat means no worker follows it,
    and the quarter leaves most of the limit to take the pod over in."""
    return min(30.0, max(5.0, heartbeat_stale_seconds / 4.0))


def heartbeat_quiet(console: Any, run_dir: str, pod_name: str, quiet_seconds: float) -> bool:
    """True once the pod's heartbeat file (``<run_dir>/heartbeat``) is ``quiet_seconds``
    old (or missing); False as soon as someone touches it (another worker follows the
    pod). ``console`` is the pod's connected console.

    Raises:
        SpecError: the pod gave no answer about the file.
        ConsoleError: the pod could not be reached.
    """
    probe = (
        "import os, sys, time\n"
        "try: m = os.stat(sys.argv[1]).st_mtime\n"
        "except OSError: m = -1.0\n"
        "print('HB=%f %f' % (m, time.time()))"
    )
    command = f"python3 -c {shlex.quote(probe)} {shlex.quote(run_dir + '/heartbeat')}"
    first: float | None = None
    while True:
        output = console.run(command, check=True).output or ""
        found = re.search(r"HB=(-?[0-9.]+) ([0-9.]+)", output)
        if found is None:
            raise SpecError(f"pod {pod_name}: no answer about its heartbeat: {output!r}")
        mtime, now = float(found.group(1)), float(found.group(2))
        if mtime < 0:
            return True
        first = mtime if first is None else first
        if mtime != first:
            return False
        if now - mtime >= quiet_seconds:
            return True
        time.sleep(1.0)
