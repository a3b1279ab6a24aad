#!/usr/bin/env python3
"""The pod's dead-man switch: remove the pod when the flow stops caring for it.

Runs ON the pod: Python 3.8+, standard library only. Started detached at provision
time. Every ``--check-interval-seconds`` it looks at ``<run_dir>/heartbeat`` (the flow
refreshes its mtime at each training poll) and removes the pod when:

* the heartbeat is older than ``--heartbeat-stale-seconds`` (a missing heartbeat, or
  one older than this watchdog, counts from the watchdog's start), or
* ``--lifetime-seconds`` have passed since the first watchdog started on this run
  directory (the origin is kept in ``watchdog.start``, so a restart never extends it).

Removing runs ``--remove-command`` through ``/bin/sh -c``; by default
``runpodctl remove pod $RUNPOD_POD_ID``, which RunPod documents for terminating a pod
from inside it (every pod ships ``runpodctl`` with a pod-scoped API key). A failed
removal is retried at each interval. Why it acted goes to ``<run_dir>/watchdog.log``.
With ``--detach`` it double-forks into its own session, records ``watchdog.pid`` and
prints ``{"pid": N}``; a second ``--detach`` while one runs prints the running one's pid.
SIGTERM stops it (logged: the pod is then unguarded).
"""

import argparse
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time

HEARTBEAT_FILE = "heartbeat"
LOG_FILE = "watchdog.log"
PID_FILE = "watchdog.pid"
START_FILE = "watchdog.start"

_REMOVE_TIMEOUT_SECONDS = 120.0
_MAX_SLEEP_SECONDS = 1.0


class _Stop(Exception):
    pass


def _log(run_dir, message):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(os.path.join(run_dir, LOG_FILE), "a") as fh:
        fh.write("%s watchdog[%d] %s\n" % (stamp, os.getpid(), message))


def _lifetime_origin(run_dir, now):
    """The epoch seconds the pod's lifetime counts from (kept across restarts)."""
    path = os.path.join(run_dir, START_FILE)
    try:
        with open(path) as fh:
            return float(fh.read().strip())
    except (OSError, ValueError):
        with open(path, "w") as fh:
            fh.write("%.3f\n" % now)
        return now


def _heartbeat_mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def decide(now, started_at, lifetime_origin, heartbeat_mtime, stale_seconds, lifetime_seconds):
    """Why the pod must go now, or None. Times in epoch seconds, limits in seconds."""
    lived = now - lifetime_origin
    if lived >= lifetime_seconds:
        return "lifetime cap: the pod has lived %.0f s >= %.0f s" % (lived, lifetime_seconds)
    reference = started_at if heartbeat_mtime is None else max(heartbeat_mtime, started_at)
    age = now - reference
    if age >= stale_seconds:
        seen = "no heartbeat yet" if heartbeat_mtime is None else "heartbeat"
        return "heartbeat stale: %s, last sign of the flow %.0f s ago >= %.0f s" % (
            seen,
            age,
            stale_seconds,
        )
    return None


def _remove(run_dir, command):
    """Run the remove command; return True when it exited 0."""
    _log(run_dir, "running remove command: %s" % command)
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=_REMOVE_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _log(run_dir, "remove command failed: %s" % exc)
        return False
    output = done.stdout.decode("utf-8", "replace").strip().replace("\n", " | ")
    _log(run_dir, "remove command exited %d: %s" % (done.returncode, output[-500:]))
    return done.returncode == 0


def watch(run_dir, heartbeat, stale_seconds, lifetime_seconds, interval_seconds, remove_command):
    """The loop. Returns 0 once the remove command succeeded, 0 on SIGTERM."""

    def _on_term(signum, _frame):
        raise _Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    started_at = time.time()
    origin = _lifetime_origin(run_dir, started_at)
    _log(
        run_dir,
        "armed: heartbeat %s stale after %.0f s, lifetime %.0f s from %s, check every %.1f s"
        % (
            heartbeat,
            stale_seconds,
            lifetime_seconds,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(origin)),
            interval_seconds,
        ),
    )
    try:
        while True:
            now = time.time()
            reason = decide(
                now,
                started_at,
                origin,
                _heartbeat_mtime(heartbeat),
                stale_seconds,
                lifetime_seconds,
            )
            if reason is not None:
                _log(run_dir, "removing the pod: %s" % reason)
                if _remove(run_dir, remove_command):
                    _log(run_dir, "remove command succeeded; exiting")
                    return 0
                _log(run_dir, "will retry in %.1f s" % interval_seconds)
            deadline = time.time() + interval_seconds
            while time.time() < deadline:
                time.sleep(min(_MAX_SLEEP_SECONDS, max(0.0, deadline - time.time())))
    except _Stop as stop:
        _log(run_dir, "stopped by %s; the pod is no longer guarded by this watchdog" % stop)
        return 0


def _running_pid(run_dir):
    try:
        with open(os.path.join(run_dir, PID_FILE)) as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            if b"watchdog" not in fh.read():
                return None
    except ProcessLookupError:
        return None
    except OSError:
        pass
    return pid


def _detach(run_dir, run):
    """Double-fork ``run`` into its own session; print its pid as JSON; return 0."""
    existing = _running_pid(run_dir)
    if existing:
        print(json.dumps({"pid": existing, "already_running": True}))
        return 0
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(read_fd)
            os.setsid()
            if os.fork() == 0:
                code = 1
                try:
                    devnull = os.open(os.devnull, os.O_RDWR)
                    for fd in (0, 1, 2):
                        os.dup2(devnull, fd)
                    with open(os.path.join(run_dir, PID_FILE), "w") as fh:
                        fh.write("%d\n" % os.getpid())
                    os.write(write_fd, str(os.getpid()).encode())
                    os.close(write_fd)
                    code = run()
                finally:
                    os._exit(code)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(child, 0)
    ready, _, _ = select.select([read_fd], [], [], 30.0)
    text = os.read(read_fd, 64).decode() if ready else ""
    os.close(read_fd)
    if not text.isdigit():
        print(json.dumps({"error": "the watchdog did not start"}))
        return 1
    print(json.dumps({"pid": int(text)}))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="watchdog.py", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--heartbeat-stale-seconds", type=float, required=True)
    parser.add_argument("--lifetime-seconds", type=float, required=True)
    parser.add_argument("--check-interval-seconds", type=float, default=30.0)
    parser.add_argument("--heartbeat-file", default=None, help="default RUN_DIR/heartbeat")
    parser.add_argument(
        "--remove-command",
        default=None,
        help="shell command that removes this pod (default: runpodctl remove pod $RUNPOD_POD_ID)",
    )
    parser.add_argument("--detach", action="store_true", help="run in the background")
    args = parser.parse_args(argv)
    limits = (args.heartbeat_stale_seconds, args.lifetime_seconds, args.check_interval_seconds)
    if min(limits) <= 0:
        parser.error("the stale, lifetime and interval seconds must be > 0")
    run_dir = os.path.abspath(args.run_dir)
    os.makedirs(run_dir, exist_ok=True)
    command = args.remove_command
    if not command:
        pod_id = os.environ.get("RUNPOD_POD_ID", "")
        if not pod_id:
            sys.stderr.write(
                "watchdog.py: RUNPOD_POD_ID is not set and no --remove-command was given; "
                "refusing to start a dead-man switch that cannot remove the pod\n"
            )
            return 2
        command = "runpodctl remove pod %s" % shlex.quote(pod_id)
    heartbeat = args.heartbeat_file or os.path.join(run_dir, HEARTBEAT_FILE)

    def run():
        return watch(
            run_dir,
            heartbeat,
            args.heartbeat_stale_seconds,
            args.lifetime_seconds,
            args.check_interval_seconds,
            command,
        )

    if args.detach:
        return _detach(run_dir, run)
    return run()


if __name__ == "__main__":
    sys.exit(main())
