#!/usr/bin/env python3
"""Start, watch, read and stop a training process on the pod, detached from SSH.

Runs ON the pod: Python 3.8+, standard library only. One run directory holds::

    <run_dir>/bundle/      the uploaded job (the training's working directory)
    <run_dir>/train.log    stdout + stderr of the training
    <run_dir>/train.pid    the training's pid, which is also its process-group id
    <run_dir>/train.exit   the exit code, written when the process ends (128+N on signal N)
    <run_dir>/train.cmd    the command (never holds secrets)
    <run_dir>/heartbeat    refreshed by the flow at each ``read --heartbeat``
    <run_dir>/train.supervisor.pid   the small process that waits and records the exit

The training runs in its own session and process group (``setsid``), stdin from
/dev/null, ``PYTHONUNBUFFERED=1``: a dropped SSH channel (SIGHUP to the login shell's
group) never reaches it. A double-forked supervisor, also in its own session, waits
for it and writes ``train.exit``. Subcommands, each printing ONE JSON line::

    start  --run-dir D [--cwd D/bundle] -- COMMAND...   {"pid", "pgid", "supervisor_pid"}
    status --run-dir D                                  {"state", "running", "exit_code", ...}
    read   --run-dir D --offset N [--max-bytes M] [--heartbeat FILE]
           {"offset", "next_offset", "data_b64", "running", "exit_code", "state", "log_bytes"}
    kill   --run-dir D [--grace-seconds S]              SIGTERM the group, then SIGKILL

``read`` returns log bytes base64-encoded (so ANSI escapes, ``\\r`` redraws and
binary survive a PTY) and only up to the last line end (``\\n`` or ``\\r``) while the
process runs; once it has ended, everything. A single COMMAND argument is run by
``/bin/sh -c`` (a simple command is ``exec``-ed, so it leads the group); several are
executed as they are.
"""

import argparse
import base64
import contextlib
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time

LOG_FILE = "train.log"
PID_FILE = "train.pid"
EXIT_FILE = "train.exit"
CMD_FILE = "train.cmd"
SUPERVISOR_FILE = "train.supervisor.pid"
HEARTBEAT_FILE = "heartbeat"

_START_TIMEOUT_SECONDS = 30.0
_KILL_WAIT_SECONDS = 10.0
_EXIT_RECORD_WAIT_SECONDS = 5.0


def _path(run_dir, name):
    return os.path.join(run_dir, name)


def _read_int(path):
    try:
        with open(path) as fh:
            return int(fh.read().strip().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def _write_atomic(path, text):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _proc_state(pid):
    """The /proc state letter of ``pid`` (``R``, ``S``, ``Z`` …), None if gone or no /proc."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            text = fh.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split(" ", 1)[0]


def _pid_alive(pid):
    """True when ``pid`` exists and is not a zombie."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _proc_state(pid) != "Z"


def _group_alive(pgid):
    """True when some process of group ``pgid`` exists and is not a zombie."""
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as fh:
                text = fh.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split(" ")
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def run_state(run_dir):
    """The run's state as a dict: ``state`` is ``absent`` (never started), ``running``,
    ``exited`` (exit code recorded) or ``lost`` (no process left and no exit code)."""
    exit_code = _read_int(_path(run_dir, EXIT_FILE))
    pid = _read_int(_path(run_dir, PID_FILE))
    supervisor = _read_int(_path(run_dir, SUPERVISOR_FILE))
    try:
        log_bytes = os.path.getsize(_path(run_dir, LOG_FILE))
    except OSError:
        log_bytes = 0
    if exit_code is not None:
        state = "exited"
    elif pid is None:
        state = "absent"
    elif _group_alive(pid) or _pid_alive(supervisor):
        state = "running"
    else:
        # The supervisor may have written the code between our two looks.
        exit_code = _read_int(_path(run_dir, EXIT_FILE))
        state = "exited" if exit_code is not None else "lost"
    return {
        "state": state,
        "running": state == "running",
        "exit_code": exit_code,
        "pid": pid,
        "pgid": pid,
        "log_bytes": log_bytes,
    }


def _exit_code_of(returncode):
    return returncode if returncode >= 0 else 128 - returncode


def _supervise(run_dir, cwd, argv, notify_fd):
    """The grandchild: start the training in its own session, report its pid on
    ``notify_fd``, wait, record the exit code. Never returns to the caller's code."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log_path = _path(run_dir, LOG_FILE)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=devnull,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
    except OSError as exc:
        with open(log_path, "ab") as log:
            log.write(("launcher: cannot start %s: %s\n" % (argv[0], exc)).encode())
        _write_atomic(_path(run_dir, EXIT_FILE), "127\n")
        os.write(notify_fd, json.dumps({"error": "cannot start: %s" % exc}).encode())
        os.close(notify_fd)
        return

    def _forward(signum, _frame):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signum)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    _write_atomic(_path(run_dir, PID_FILE), "%d\n" % proc.pid)
    _write_atomic(_path(run_dir, SUPERVISOR_FILE), "%d\n" % os.getpid())
    info = {"pid": proc.pid, "pgid": proc.pid, "supervisor_pid": os.getpid()}
    os.write(notify_fd, json.dumps(info).encode())
    os.close(notify_fd)
    code = _exit_code_of(proc.wait())
    _write_atomic(_path(run_dir, EXIT_FILE), "%d\n" % code)


def _shell_script(command):
    """``command`` for ``sh -c``; a simple command is ``exec``-ed, so the job itself
    leads the process group and its own exit code (or signal) is what gets recorded."""
    words = command.split()
    if words and "=" not in words[0] and not re.search(r"[;&|<>()`$\n]", command):
        return "exec " + command
    return command


def cmd_start(run_dir, cwd, argv):
    """Start ``argv`` detached; return the JSON-able result and the process exit status."""
    if not argv:
        return {"error": "no command given after --"}, 2
    os.makedirs(run_dir, exist_ok=True)
    cwd = cwd or _path(run_dir, "bundle")
    if not os.path.isdir(cwd):
        return {"error": "working directory %s does not exist" % cwd}, 2
    current = run_state(run_dir)
    if current["running"]:
        current["error"] = "a training process already runs in %s (pid %s)" % (
            run_dir,
            current["pid"],
        )
        return current, 3
    for name in (EXIT_FILE, PID_FILE, SUPERVISOR_FILE):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_path(run_dir, name))
    if len(argv) == 1:
        shown, argv = argv[0], ["/bin/sh", "-c", _shell_script(argv[0])]
    else:
        shown = " ".join(shlex.quote(a) for a in argv)
    _write_atomic(_path(run_dir, CMD_FILE), shown + "\n")
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # first child: new session, fork the supervisor, leave at once
        try:
            os.close(read_fd)
            os.setsid()
            if os.fork() == 0:
                try:
                    _supervise(run_dir, cwd, argv, write_fd)
                finally:
                    os._exit(0)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(child, 0)
    chunks = []
    deadline = time.time() + _START_TIMEOUT_SECONDS
    while time.time() < deadline:
        ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.time()))
        if not ready:
            break
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    try:
        info = json.loads(b"".join(chunks).decode() or "{}")
    except ValueError:
        info = {}
    if "pid" not in info:
        info.setdefault("error", "the supervisor did not report a pid")
        return info, 1
    return info, 0


def _touch(path):
    with open(path, "a"):
        pass
    os.utime(path, None)


def cmd_read(run_dir, offset, max_bytes, heartbeat=None):
    """Read the log from byte ``offset``: at most ``max_bytes``, whole lines while running."""
    if heartbeat:
        _touch(heartbeat)
    state = run_state(run_dir)  # looked at BEFORE reading: if ended, the log is final
    data = b""
    size = 0
    try:
        with open(_path(run_dir, LOG_FILE), "rb") as fh:
            fh.seek(offset)
            data = fh.read(max_bytes)
            size = os.fstat(fh.fileno()).st_size
    except FileNotFoundError:
        pass
    if offset > size and state["state"] != "absent":
        state["error"] = "offset %d is past the end of the log (%d bytes)" % (offset, size)
        data = b""
    final = not state["running"] and offset + len(data) >= size
    if not final and data:
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut >= 0:
            data = data[: cut + 1]
        elif len(data) < max_bytes:
            data = b""  # a partial line: wait for its end
        # else: one line longer than max_bytes, returned in pieces
    state.update(
        {
            "offset": offset,
            "next_offset": offset + len(data),
            "data_b64": base64.b64encode(data).decode("ascii"),
            "log_bytes": size,
        }
    )
    return state


def cmd_kill(run_dir, grace_seconds):
    """SIGTERM the training's process group, SIGKILL it after ``grace_seconds``, and
    make sure ``train.exit`` is written (143 after SIGTERM, 137 after SIGKILL)."""
    state = run_state(run_dir)
    pgid = state["pid"]
    sent = []
    if pgid and _group_alive(pgid):
        if state["exit_code"] is None:
            sent.append("SIGTERM")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            deadline = time.time() + grace_seconds
            while _group_alive(pgid) and time.time() < deadline:
                time.sleep(0.1)
        if _group_alive(pgid):
            sent.append("SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            deadline = time.time() + _KILL_WAIT_SECONDS
            while _group_alive(pgid) and time.time() < deadline:
                time.sleep(0.05)
    if sent:
        deadline = time.time() + _EXIT_RECORD_WAIT_SECONDS
        while _read_int(_path(run_dir, EXIT_FILE)) is None and time.time() < deadline:
            time.sleep(0.05)
        if _read_int(_path(run_dir, EXIT_FILE)) is None and not _group_alive(pgid):
            code = 137 if "SIGKILL" in sent else 143
            _write_atomic(_path(run_dir, EXIT_FILE), "%d\n" % code)
    result = run_state(run_dir)
    result["signals"] = sent
    return result, (1 if result["running"] else 0)


def _parser():
    parser = argparse.ArgumentParser(prog="launcher.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action")
    start = sub.add_parser("start", help="start COMMAND detached")
    start.add_argument("--run-dir", required=True)
    start.add_argument("--cwd", default=None, help="working directory (default RUN_DIR/bundle)")
    start.add_argument("command", nargs=argparse.REMAINDER)
    status = sub.add_parser("status", help="state of the run")
    status.add_argument("--run-dir", required=True)
    read = sub.add_parser("read", help="log bytes from an offset, base64")
    read.add_argument("--run-dir", required=True)
    read.add_argument("--offset", type=int, default=0)
    read.add_argument("--max-bytes", type=int, default=65536)
    read.add_argument("--heartbeat", default=None, help="file whose mtime to refresh")
    kill = sub.add_parser("kill", help="SIGTERM, then SIGKILL, the process group")
    kill.add_argument("--run-dir", required=True)
    kill.add_argument("--grace-seconds", type=float, default=30.0)
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    run_dir = os.path.abspath(args.run_dir) if getattr(args, "run_dir", None) else None
    if args.action == "start":
        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        result, rc = cmd_start(run_dir, args.cwd, command)
    elif args.action == "status":
        result, rc = run_state(run_dir), 0
    elif args.action == "read":
        if args.offset < 0 or args.max_bytes < 1:
            result, rc = {"error": "offset must be >= 0 and max-bytes >= 1"}, 2
        else:
            result, rc = cmd_read(run_dir, args.offset, args.max_bytes, args.heartbeat), 0
    elif args.action == "kill":
        result, rc = cmd_kill(run_dir, max(0.0, args.grace_seconds))
    else:
        _parser().print_help(sys.stderr)
        return 2
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main())
