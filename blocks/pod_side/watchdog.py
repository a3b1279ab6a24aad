#!/usr/bin/env python3
"""The pod's dead-man switch: end the pod when the flow stops caring for it, by every
way the pod has.

Runs ON the pod: Python 3.8+, standard library only. Started detached at provision
time. Every ``--check-interval-seconds`` it looks at ``<run_dir>/heartbeat`` (the flow
refreshes its mtime) and acts when:

* the heartbeat is older than ``--heartbeat-stale-seconds`` (a missing heartbeat, or
  one older than this watchdog, counts from the watchdog's start), or
* ``--lifetime-seconds`` have passed since the first watchdog started on this run
  directory (the origin is kept in ``watchdog.start``, so a restart never extends it).

A pod its run keeps on purpose (``<run_dir>/kept`` exists: outputs that could not travel,
or a failed run kept for inspection) is past caring for: its heartbeat is no longer read,
and only the lifetime ends it.

It then tries, in order, until one ends the pod:

1. ``runpodctl pod delete $RUNPOD_POD_ID`` (runpodctl 2.x);
2. ``runpodctl remove pod $RUNPOD_POD_ID`` (the older verb, deprecated in 2.x; an image
   ships whichever runpodctl it was built with);
3. RunPod's REST v2 ``DELETE /v2/pods/{id}`` with the pod's own ``RUNPOD_API_KEY``,
   through urllib (204, or 404 for a pod RunPod no longer knows): with the system's CA
   store first, then with each CA bundle found on the pod (certifi's, pip's vendored
   copy), since bare images fail TLS with ``x509: certificate signed by unknown
   authority`` (runpodctl#149). Verification is never turned off.
With ``--stop-run-first S`` it first asks the run's own process (the launcher's group,
``<run_dir>/train.pid``) to stop, SIGTERM, and waits up to S seconds for it to exit, so a
process that reports for itself (a Prefect flow on a worker's pod marks its run Crashed
when signalled) can say so before the pod goes; the pod is ended next whatever it did.

4. Last resort: stop every process of the pod but PID 1 and this one (PID 1 ignores
   signals it has no handler for, and RunPod restarts a container whose PID 1 exits), so
   at least the workload stops; it records ``workload stopped, pod NOT ended`` and keeps
   trying 1-3: the pod may still be billing until the reaper ends it.

A layer that reports success is given ``--settle-seconds`` for the pod to end (this
process ends with it); still alive after that, the next layer is tried.
``--remove-command`` replaces layers 1 and 2 with one shell command; ``--settle-seconds
0`` trusts a command's exit status and exits 0 at once (for tests).

Every attempt is a JSON line in ``<run_dir>/deadman.jsonl`` (what the reaper and
``prefect-runpod pods`` read): ``ok: null`` when it starts (a layer that works ends the
pod, and this process with it, before it can say so), then its result;
``watchdog.log`` says why in words. The
commands run with ``PREFECT_RUNPOD_ENDED_BY=deadman`` in their environment, so a pod
that records who ended it can say so. With ``--detach`` it double-forks into its own
session, records ``watchdog.pid`` and prints ``{"pid": N}``; a second ``--detach`` while
one runs prints the running one's pid. SIGTERM stops it (logged: the pod is then
unguarded).
"""

import argparse
import contextlib
import glob
import json
import os
import re
import select
import shlex
import signal
import site
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

HEARTBEAT_FILE = "heartbeat"
LOG_FILE = "watchdog.log"
PID_FILE = "watchdog.pid"
START_FILE = "watchdog.start"
ATTEMPTS_FILE = "deadman.jsonl"
KEPT_FILE = "kept"
RUN_PID_FILE = "train.pid"
"""The launcher's file: the run's pid, which is also its process-group id."""
RUN_EXIT_FILE = "train.exit"
STOP_RUN_LAYER = "stop the run's process first"
"""Written by the run that keeps its pod: from then on only the lifetime ends it."""

DEFAULT_API_URL = "https://api.runpod.io/v2"
API_LAYER = "DELETE /v2/pods (pod key)"
WORKLOAD_STOPPED = "workload stopped, pod NOT ended"
INIT_PID_VAR = "PREFECT_RUNPOD_POD_INIT_PID"
"""Set inside a local pod: its daemon's pid, the pod's own PID 1."""

_REMOVE_TIMEOUT_SECONDS = 120.0
_API_TIMEOUT_SECONDS = 30.0
_MAX_SLEEP_SECONDS = 1.0
_STOP_GRACE_SECONDS = 5.0
_POD_ID = re.compile(r"[a-z0-9]{1,64}")
_ODD = re.compile(r"[\s\x00-\x1f\x7f]")
"""Whitespace or a control character: never part of a key (``blocks/secret_mask.py``'s
rule, repeated here because this script runs on the pod with the standard library only)."""
_BUNDLES = ("certifi/cacert.pem", "pip/_vendor/certifi/cacert.pem")
_SITE_GLOBS = (
    "/usr/lib/python3*/dist-packages",
    "/usr/lib/python3/dist-packages",
    "/usr/local/lib/python3*/site-packages",
    "/usr/local/lib/python3*/dist-packages",
    "/opt/conda/lib/python3*/site-packages",
    "/root/.local/lib/python3*/site-packages",
)


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


def decide(
    now, started_at, lifetime_origin, heartbeat_mtime, stale_seconds, lifetime_seconds, kept=False
):
    """Why the pod must go now, or None. Times in epoch seconds, limits in seconds; a
    ``kept`` pod ends only at its lifetime."""
    lived = now - lifetime_origin
    if lived >= lifetime_seconds:
        return "lifetime cap: the pod has lived %.0f s >= %.0f s" % (lived, lifetime_seconds)
    if kept:
        return None
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


def _stamp(moment=None):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def _record(run_dir, **fields):
    """Append one attempt to ``deadman.jsonl`` (what the reaper and ``pods`` read)."""
    fields = dict({"at": _stamp(), "pid": os.getpid()}, **fields)
    with open(os.path.join(run_dir, ATTEMPTS_FILE), "a") as fh:
        fh.write(json.dumps(fields, sort_keys=True) + "\n")


def _run_command(run_dir, layer, command):
    """Run one shell layer; return ``(ok, detail)``."""
    _log(run_dir, "%s: running %s" % (layer, command))
    env = dict(os.environ, PREFECT_RUNPOD_ENDED_BY="deadman")
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=_REMOVE_TIMEOUT_SECONDS,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, "failed to run: %s" % exc
    output = done.stdout.decode("utf-8", "replace").strip().replace("\n", " | ")[-500:]
    return done.returncode == 0, "exited %d: %s" % (done.returncode, output)


def ca_bundles(extra=()):
    """CA bundles found on the pod, beside the system store: certifi's and pip's vendored
    copy under every site directory this Python (and the image's others) knows; then
    ``extra``. Existing files only, each once."""
    roots = list(sys.path)
    with contextlib.suppress(AttributeError):  # a virtualenv's old site module lacks them
        roots += site.getsitepackages() + [site.getusersitepackages()]
    for pattern in _SITE_GLOBS:
        roots += sorted(glob.glob(pattern))
    found, seen = [], set()
    for root in roots:
        for rel in _BUNDLES:
            path = os.path.join(root or ".", rel)
            real = os.path.realpath(path)
            if real not in seen and os.path.isfile(real):
                seen.add(real)
                found.append(path)
    for path in extra:
        real = os.path.realpath(path)
        if real not in seen and os.path.isfile(real):
            seen.add(real)
            found.append(path)
    return found


def _tls_failure(exc):
    reason = getattr(exc, "reason", exc)
    return isinstance(reason, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(
        reason
    )


def _problem_text(exc):
    """RunPod's words from an error answer: a problem object's ``title: detail``."""
    try:
        data = json.loads(exc.read().decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    words = ": ".join(str(data[k]) for k in ("title", "detail") if data.get(k))
    return words or "no problem object"


def api_terminate(url, api_key, pod_id, bundles, timeout=_API_TIMEOUT_SECONDS):
    """RunPod's REST v2 ``DELETE {url}/pods/{pod_id}`` with the pod's key, through urllib
    (``url`` is the v2 base, ``https://api.runpod.io/v2``).

    Tries the system CA store, then each of ``bundles``; verification stays on. The key
    never appears in ``detail``: one trailing newline is stripped, any other whitespace
    or control character skips this layer (``http.client`` would quote the header it
    refuses).

    Returns:
        ``(ok, detail)``; ``ok`` when RunPod accepted it (204) or no longer knows the pod
        (404).
    """
    if not _POD_ID.fullmatch(pod_id or ""):
        return False, "RUNPOD_POD_ID %r is not a pod id" % (pod_id,)
    if not api_key:
        return False, "no RUNPOD_API_KEY in the pod's environment"
    if api_key.endswith("\n") and not _ODD.search(api_key[:-1]):
        api_key = api_key[:-1]
    if _ODD.search(api_key):
        return False, (
            "the pod's RUNPOD_API_KEY holds whitespace or a control character, so it "
            "cannot be sent (the value is not shown)"
        )
    target = "%s/pods/%s" % (url.rstrip("/"), pod_id)
    headers = {"Accept": "application/json", "Authorization": "Bearer " + api_key}
    stores = [("the system CA store", None)] + [(path, path) for path in bundles]
    problems = []
    for label, cafile in stores:
        request = urllib.request.Request(target, headers=headers, method="DELETE")
        context = None
        if target.startswith("https:"):
            try:
                context = ssl.create_default_context(cafile=cafile)
            except (OSError, ssl.SSLError) as exc:
                problems.append("%s: unusable (%s)" % (label, exc))
                continue
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
                status = answer.status
        except urllib.error.HTTPError as exc:
            said = _problem_text(exc)
            if exc.code == 404:
                return (
                    True,
                    "RunPod no longer knows the pod (HTTP 404 %s); TLS verified with %s"
                    % (
                        said,
                        label,
                    ),
                )
            if exc.code in (401, 403):
                return False, "HTTP %d: the pod's key was refused (%s)" % (exc.code, said)
            return False, "RunPod answered HTTP %d %s (%s)" % (exc.code, said, label)
        except (urllib.error.URLError, ssl.SSLError, OSError) as exc:
            if _tls_failure(exc):
                problems.append("%s: x509: %s" % (label, getattr(exc, "reason", exc)))
                continue
            return False, "%s (%s)" % (exc, label)
        except ValueError as exc:  # http.client refused the request: never quote it
            return False, "the request was refused before it was sent (%s, %s)" % (
                type(exc).__name__,
                label,
            )
        return True, "DELETE accepted (HTTP %d); TLS verified with %s" % (status, label)
    return False, "; ".join(problems) or "no answer"


def _pod_processes(pod_id, everything):
    """Pids to stop: every process of the pod but PID 1, its init and this one. With
    ``everything`` (a container whose PID 1 is the pod's), every visible process; else
    only those carrying ``RUNPOD_POD_ID=<pod_id>``."""
    spare = {1, os.getpid(), os.getppid()}
    with contextlib.suppress(ValueError):
        spare.add(int(os.environ.get(INIT_PID_VAR, "")))
    marker = ("RUNPOD_POD_ID=%s" % pod_id).encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in spare:
            continue
        if not everything:
            try:
                with open("/proc/%s/environ" % name, "rb") as fh:
                    if marker not in fh.read().split(b"\0"):
                        continue
            except OSError:
                continue
        out.append(int(name))
    return out


def _whole_container(pod_id):
    """True only where PID 1 is this pod's own init (a container RunPod started, which
    gave PID 1 its ``RUNPOD_POD_ID``) and no local pod says otherwise."""
    if os.environ.get(INIT_PID_VAR):
        return False
    try:
        with open("/proc/1/environ", "rb") as fh:
            return ("RUNPOD_POD_ID=%s" % pod_id).encode() in fh.read().split(b"\0")
    except OSError:
        return False


def stop_run_first(run_dir, grace_seconds):
    """SIGTERM the run's process group (``train.pid``) and wait up to ``grace_seconds``
    for it to exit (gone, or ``train.exit`` written). Returns ``(ok, detail)``: ok when
    no run process is left running."""
    try:
        with open(os.path.join(run_dir, RUN_PID_FILE)) as fh:
            pgid = int(fh.read().strip().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return True, "no run process recorded"
    exit_path = os.path.join(run_dir, RUN_EXIT_FILE)
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return True, "the run's process %d had already exited" % pgid
    except PermissionError as exc:
        return False, "could not signal the run's process %d: %s" % (pgid, exc)
    deadline = time.time() + grace_seconds
    while time.time() < deadline:
        if os.path.exists(exit_path):
            return True, "the run's process %d exited after SIGTERM" % pgid
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True, "the run's process %d exited after SIGTERM" % pgid
        time.sleep(0.1)
    return False, "the run's process %d still ran %.0f s after SIGTERM" % (pgid, grace_seconds)


def stop_workload(pod_id):
    """SIGTERM, then after a grace SIGKILL, every process of the pod but PID 1 (its
    init) and this one. Returns how many were signalled."""
    targets = _pod_processes(pod_id, _whole_container(pod_id))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if sig == signal.SIGTERM:
            deadline = time.time() + _STOP_GRACE_SECONDS
            while time.time() < deadline and any(os.path.exists("/proc/%d" % p) for p in targets):
                time.sleep(0.1)
    return len(targets)


class Layers:
    """The ways this pod can end itself, tried in order (see the module docstring)."""

    def __init__(
        self,
        run_dir,
        pod_id,
        commands,
        api_url,
        bundles,
        settle_seconds,
        last_resort,
        stop_run_seconds=0.0,
    ):
        self.run_dir = run_dir
        self.pod_id = pod_id
        self.commands = commands
        self.api_url = api_url
        self.bundles = bundles
        self.settle_seconds = settle_seconds
        self.last_resort = last_resort
        self.workload_stopped = False
        self.stop_run_seconds = stop_run_seconds
        self.run_asked = False

    def _settled(self, layer, reason, detail):
        """After a layer reported success: True when this process may exit (tests: the
        exit status is trusted); else wait for the pod to end us, then go on."""
        _record(self.run_dir, layer=layer, reason=reason, ok=True, detail=detail)
        if self.settle_seconds <= 0:
            _log(self.run_dir, "%s succeeded; exiting" % layer)
            return True
        _log(
            self.run_dir,
            "%s succeeded; waiting %.0f s for the pod to end" % (layer, self.settle_seconds),
        )
        deadline = time.time() + self.settle_seconds
        while time.time() < deadline:
            time.sleep(min(_MAX_SLEEP_SECONDS, max(0.0, deadline - time.time())))
        _record(
            self.run_dir,
            layer=layer,
            reason=reason,
            ok=False,
            detail="reported success, yet the pod still runs after %.0f s" % self.settle_seconds,
        )
        return False

    def _try(self, layer, reason, attempt, *args):
        """One layer: record that it starts, run ``attempt(*args)`` → ``(ok, detail)``,
        record the result; True when this process may exit (see ``_settled``)."""
        # Recorded first: a layer that works ends the pod, and this process with it.
        _record(self.run_dir, layer=layer, reason=reason, ok=None, detail="trying")
        ok, detail = attempt(*args)
        _log(self.run_dir, "%s: %s" % (layer, detail))
        if ok:
            return self._settled(layer, reason, detail)
        _record(self.run_dir, layer=layer, reason=reason, ok=False, detail=detail)
        return False

    def end_pod(self, reason):
        """Try every layer once; True when one ended the pod (as far as we can tell).
        With ``stop_run_seconds``, the run's own process is asked to stop first (once)."""
        if self.stop_run_seconds > 0 and not self.run_asked:
            self.run_asked = True
            _record(self.run_dir, layer=STOP_RUN_LAYER, reason=reason, ok=None, detail="trying")
            ok, detail = stop_run_first(self.run_dir, self.stop_run_seconds)
            _log(self.run_dir, "%s: %s" % (STOP_RUN_LAYER, detail))
            _record(self.run_dir, layer=STOP_RUN_LAYER, reason=reason, ok=ok, detail=detail)
        for layer, command in self.commands:
            if self._try(layer, reason, _run_command, self.run_dir, layer, command):
                return True
        key = os.environ.get("RUNPOD_API_KEY", "")
        if self.api_url and self._try(
            API_LAYER,
            reason,
            api_terminate,
            self.api_url,
            key,
            self.pod_id,
            self.bundles,
        ):
            return True
        if self.last_resort and not self.workload_stopped:
            count = stop_workload(self.pod_id)
            self.workload_stopped = True
            _record(
                self.run_dir,
                layer="stop workload",
                reason=reason,
                ok=False,
                outcome=WORKLOAD_STOPPED,
                detail="%d processes stopped; every way to end the pod failed, it may still "
                "be billing until the reaper ends it" % count,
            )
            _log(self.run_dir, "%s (%d processes stopped)" % (WORKLOAD_STOPPED, count))
        return False


def watch(run_dir, heartbeat, stale_seconds, lifetime_seconds, interval_seconds, layers):
    """The loop. Returns 0 once a layer ended the pod (tests), 0 on SIGTERM."""

    def _on_term(signum, _frame):
        raise _Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    started_at = time.time()
    origin = _lifetime_origin(run_dir, started_at)
    _log(
        run_dir,
        "armed: heartbeat %s stale after %.0f s, lifetime %.0f s from %s, check every %.1f s"
        % (heartbeat, stale_seconds, lifetime_seconds, _stamp(origin), interval_seconds),
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
                os.path.exists(os.path.join(run_dir, KEPT_FILE)),
            )
            if reason is not None:
                _log(run_dir, "ending the pod: %s" % reason)
                if layers.end_pod(reason):
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
        help="one shell command instead of runpodctl's two verbs",
    )
    parser.add_argument(
        "--api-url",
        default=None,
        help="RunPod's REST v2 base (default $RUNPOD_API_BASE_URL/v2, else %s)" % DEFAULT_API_URL,
    )
    parser.add_argument("--no-api", action="store_true", help="skip the REST v2 layer")
    parser.add_argument(
        "--ca-bundle", action="append", default=[], help="one more CA bundle to try"
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=30.0,
        help="how long a layer that reported success gets to end the pod (0: trust it)",
    )
    parser.add_argument(
        "--no-last-resort", action="store_true", help="never stop the pod's processes"
    )
    parser.add_argument(
        "--stop-run-first",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="SIGTERM the run's process and give it this long before ending the pod (0: no)",
    )
    parser.add_argument("--detach", action="store_true", help="run in the background")
    args = parser.parse_args(argv)
    limits = (args.heartbeat_stale_seconds, args.lifetime_seconds, args.check_interval_seconds)
    if min(limits) <= 0:
        parser.error("the stale, lifetime and interval seconds must be > 0")
    run_dir = os.path.abspath(args.run_dir)
    os.makedirs(run_dir, exist_ok=True)
    pod_id = os.environ.get("RUNPOD_POD_ID", "")
    if args.remove_command:
        commands = [("remove command", args.remove_command)]
    elif not pod_id:
        sys.stderr.write(
            "watchdog.py: RUNPOD_POD_ID is not set and no --remove-command was given; "
            "refusing to start a dead-man switch that cannot remove the pod\n"
        )
        return 2
    else:
        quoted = shlex.quote(pod_id)
        commands = [
            ("runpodctl pod delete", "runpodctl pod delete %s" % quoted),
            ("runpodctl remove pod", "runpodctl remove pod %s" % quoted),
        ]
    api_url = None
    if not args.no_api and pod_id:
        base = os.environ.get("RUNPOD_API_BASE_URL", "").rstrip("/")
        api_url = args.api_url or (base + "/v2" if base else DEFAULT_API_URL)
    layers = Layers(
        run_dir,
        pod_id,
        commands,
        api_url,
        ca_bundles(args.ca_bundle),
        args.settle_seconds,
        not args.no_last_resort,
        max(0.0, args.stop_run_first),
    )
    heartbeat = args.heartbeat_file or os.path.join(run_dir, HEARTBEAT_FILE)

    def run():
        return watch(
            run_dir,
            heartbeat,
            args.heartbeat_stale_seconds,
            args.lifetime_seconds,
            args.check_interval_seconds,
            layers,
        )

    if args.detach:
        return _detach(run_dir, run)
    return run()


if __name__ == "__main__":
    sys.exit(main())
