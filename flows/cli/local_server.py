"""The Prefect server ``prefect-runpod`` keeps for the user when no API is configured
(docs/cli.md#the-prefect-server): one ``prefect server start`` on loopback, started in
the background by the first command that needs the API and reused by every later one,
so the runs' history and their pages in the Prefect UI outlive the command that made
them.

- **Where it lives.** ``<home>/server/`` (``home`` is ``$PREFECT_RUNPOD_HOME``, else
  ``~/.prefect-runpod``) is the server's own ``PREFECT_HOME``: its SQLite database
  (``prefect.db``), its log (``server.log``), the record of the running server
  (``server.json``: pid, port, Prefect version, URLs) and the lock (``server.lock``).
- **One server.** Starting, replacing and stopping happen under an exclusive ``flock``
  on ``server.lock``: two commands that start at once end up with one server, the second
  reusing what the first started.
- **Noticing a dead or foreign server.** The record counts only while its pid is alive
  and carries the server's marker in its environment (``PREFECT_RUNPOD_SERVER_ID``, as a
  local pod's processes carry ``RUNPOD_POD_ID``), so a recycled pid never passes; a
  stale record is replaced by a fresh server. A server of another Prefect version than
  this install is stopped and started again (the same database; Prefect migrates it
  on start).
- **Port.** ``DEFAULT_PORT`` (not Prefect's 4200, which a user's own ``prefect server
  start`` takes), ``$PREFECT_RUNPOD_SERVER_PORT`` instead when set; when that port is
  taken, the next ones, then any free port.
- **Quiet and offline.** Telemetry is off (``PREFECT_SERVER_ANALYTICS_ENABLED=false``,
  ``DO_NOT_TRACK=1``), the UI is told its own API address (``PREFECT_UI_API_URL``, needed
  on a port other than 4200), and none of the user's other ``PREFECT_*`` settings (an API
  key, another database) reach it.

Stdlib only, and nothing here imports Prefect: ``server status`` answers at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib.metadata import version as _dist_version
from pathlib import Path

from prefect_runpod.blocks.local_pod.registry import default_home, pid_alive, write_json

__all__ = [
    "DEFAULT_PORT",
    "MARKER_VAR",
    "PORT_VAR",
    "ServerRecord",
    "ServerStartError",
    "ensure_server",
    "installed_prefect_version",
    "read_live_record",
    "server_home",
    "stop_server",
]

DEFAULT_PORT = 4280
"""The local server's port unless ``$PREFECT_RUNPOD_SERVER_PORT`` says otherwise."""
PORT_VAR = "PREFECT_RUNPOD_SERVER_PORT"
"""The environment variable that picks another port for the local server."""
MARKER_VAR = "PREFECT_RUNPOD_SERVER_ID"
"""The environment variable that marks the local server's process (its value is the
record's ``server_id``)."""
_PORT_TRIES = 10
"""How many ports from the preferred one are tried before any free port is taken."""
_STARTUP_SECONDS = 300.0
"""How long a start waits for the server's health check (a busy 2-core machine takes
10-45 s)."""
_STOP_GRACE_SECONDS = 30.0
"""How long a stop waits after SIGTERM before SIGKILL."""
_STARTED: list[subprocess.Popen[bytes]] = []
"""The servers this process started (kept so they are reaped when stopped here)."""


class ServerStartError(RuntimeError):
    """The local Prefect server did not come up (the message names its log)."""


@dataclass(frozen=True)
class ServerRecord:
    """The running local server, as ``server.json`` records it.

    Attributes:
        pid: the ``prefect server start`` process (leader of its own session).
        port: its loopback TCP port.
        prefect_version: the Prefect version that runs it.
        api_url: ``http://127.0.0.1:<port>/api``.
        ui_url: ``http://127.0.0.1:<port>``.
        home: its PREFECT_HOME (database and log).
        started_at: when it was started (UTC, ISO-8601).
        server_id: the marker its process carries (``PREFECT_RUNPOD_SERVER_ID``).
    """

    pid: int
    port: int
    prefect_version: str
    api_url: str
    ui_url: str
    home: str
    started_at: str
    server_id: str

    @property
    def log_path(self) -> Path:
        """The server's combined stdout and stderr."""
        return Path(self.home) / "server.log"


def server_home() -> Path:
    """The local server's PREFECT_HOME: ``<PREFECT_RUNPOD_HOME or ~/.prefect-runpod>/server``."""
    return default_home() / "server"


def installed_prefect_version() -> str:
    """The Prefect version installed beside this package (read from its metadata, without
    importing Prefect)."""
    return _dist_version("prefect")


def _record_path(home: Path) -> Path:
    return home / "server.json"


def _read_record(home: Path) -> ServerRecord | None:
    try:
        data = json.loads(_record_path(home).read_text())
        return ServerRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def _write_record(home: Path, record: ServerRecord) -> None:
    write_json(_record_path(home), asdict(record))


def _carries_marker(pid: int, server_id: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return f"{MARKER_VAR}={server_id}".encode() in fh.read().split(b"\0")
    except OSError:
        return False


def _process_alive(record: ServerRecord) -> bool:
    """True while the record's process runs and is that server (not a recycled pid)."""
    return pid_alive(record.pid) and _carries_marker(record.pid, record.server_id)


def _healthy(api_url: str, timeout_seconds: float = 2.0) -> bool:
    """True when ``GET <api>/health`` answers ``true`` (Prefect's health check)."""
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_seconds) as answer:
            return bool(answer.status == 200 and answer.read().strip() == b"true")
    except (OSError, urllib.error.URLError, ValueError):
        return False


def read_live_record(home: Path | None = None) -> ServerRecord | None:
    """The record of the local server when its process is alive (healthy or not yet),
    else None. Reads only; takes no lock."""
    record = _read_record(home or server_home())
    return record if record is not None and _process_alive(record) else None


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / "server.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def ensure_server(say: Callable[[str], None], home: Path | None = None) -> ServerRecord:
    """The running local server, started first when there is none (or it died, or runs
    another Prefect version than this install).

    Args:
        say: where the one-line notes go (the start, a replaced or restarted server).
        home: the server's PREFECT_HOME (default ``server_home()``).

    Returns:
        The record of a server that answered its health check.

    Raises:
        ServerStartError: the server did not come up (its log is named).
    """
    home = home or server_home()
    with _locked(home):
        record = _read_record(home)
        if record is not None and _process_alive(record):
            wanted = installed_prefect_version()
            if record.prefect_version != wanted:
                say(
                    f"the prefect-runpod Prefect server at {record.ui_url} runs Prefect "
                    f"{record.prefect_version}, this install has {wanted}: restarting it "
                    f"(its runs stay in {home})"
                )
                _stop(record)
            elif _wait_healthy(record, deadline=time.monotonic() + 30.0):
                return record
            else:
                say(f"the Prefect server at {record.ui_url} does not answer: replacing it")
                _stop(record)
        elif record is not None:
            say(f"the Prefect server recorded at {record.ui_url} is gone: starting a new one")
        return _start(home, say)


def stop_server(home: Path | None = None) -> ServerRecord | None:
    """Stop the local server (SIGTERM, SIGKILL after a grace) and remove its record.

    Returns:
        The record of the server that was stopped, or None when none was running (a
        stale record is removed all the same).
    """
    home = home or server_home()
    if not home.is_dir():
        return None
    with _locked(home):
        record = _read_record(home)
        stopped = None
        if record is not None and _process_alive(record):
            _stop(record)
            stopped = record
        with contextlib.suppress(FileNotFoundError):
            _record_path(home).unlink()
        return stopped


def _stop(record: ServerRecord) -> None:
    """End the server's process group and wait until its process is gone."""
    for sig, grace in ((signal.SIGTERM, _STOP_GRACE_SECONDS), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            _reap(record.pid)
            if not pid_alive(record.pid):
                return
            time.sleep(0.1)


def _reap(pid: int) -> None:
    """Collect the exit status of a server this process started (else it stays a zombie)."""
    for proc in list(_STARTED):
        if proc.pid == pid and proc.poll() is not None:
            _STARTED.remove(proc)


def _port_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now: probed with SO_REUSEADDR, as the
    server binds, so connections of a stopped server still in TIME_WAIT do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _candidate_ports() -> Iterator[int]:
    """The preferred port, the next ones, then any free port the kernel gives."""
    preferred = DEFAULT_PORT
    given = os.environ.get(PORT_VAR, "").strip()
    if given.isdigit() and 0 < int(given) < 65536:
        preferred = int(given)
    for port in range(preferred, min(preferred + _PORT_TRIES, 65536)):
        if _port_free(port):
            yield port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        yield port


def _server_env(home: Path, port: int, server_id: str) -> dict[str, str]:
    """The server's environment: the user's, less every Prefect setting, plus its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PREFECT_") or k.startswith("PREFECT_RUNPOD_")
    }
    api_url = f"http://127.0.0.1:{port}/api"
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_API_HOST="127.0.0.1",
        PREFECT_SERVER_API_PORT=str(port),
        PREFECT_UI_API_URL=api_url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_LOGGING_LEVEL="WARNING",
        DO_NOT_TRACK="1",
    )
    env[MARKER_VAR] = server_id
    return env


def _start(home: Path, say: Callable[[str], None]) -> ServerRecord:
    """Start ``prefect server start`` in a session of its own, wait for its health check,
    write its record. A port taken between the check and the server's bind is retried on
    the next one."""
    with contextlib.suppress(FileNotFoundError):
        _record_path(home).unlink()
    ports = _candidate_ports()
    told = False
    for _attempt in range(3):
        port = next(ports)
        server_id = secrets.token_hex(8)
        record = ServerRecord(
            pid=0,
            port=port,
            prefect_version=installed_prefect_version(),
            api_url=f"http://127.0.0.1:{port}/api",
            ui_url=f"http://127.0.0.1:{port}",
            home=str(home),
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
            server_id=server_id,
        )
        if not told:
            say(
                f"starting a Prefect server in the background for prefect-runpod: UI at "
                f"{record.ui_url}, runs kept in {home} (`prefect-runpod server stop` stops it)"
            )
            told = True
        with open(record.log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start"]
                + ["--host", "127.0.0.1", "--port", str(port)],
                env=_server_env(home, port, server_id),
                cwd=home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the user's terminal does not reach it
            )
        _STARTED.append(proc)
        record = ServerRecord(**{**asdict(record), "pid": proc.pid})
        if _wait_healthy(record, deadline=time.monotonic() + _STARTUP_SECONDS, proc=proc):
            _write_record(home, record)
            return record
        if proc.poll() is None:  # alive but silent past the deadline: give up on it
            _stop(record)
            break
        if _port_free(port):  # it died for another reason than the port
            break
    raise ServerStartError(
        f"the Prefect server did not start (see {record.log_path}); set PREFECT_API_URL to "
        "a server of your own, or pass --ephemeral for a temporary one"
    )


def _wait_healthy(
    record: ServerRecord, deadline: float, proc: subprocess.Popen[bytes] | None = None
) -> bool:
    """Poll the health check until it answers, the process ends, or the deadline passes."""
    while time.monotonic() < deadline:
        if _healthy(record.api_url):
            return True
        if proc is not None and proc.poll() is not None:
            return False
        if proc is None and not _process_alive(record):
            return False
        time.sleep(0.25)
    return _healthy(record.api_url)
