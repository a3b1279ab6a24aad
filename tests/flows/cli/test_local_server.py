"""The Prefect server prefect-runpod keeps when no API is configured (issue 27): without
``PREFECT_API_URL`` every look-up started Prefect's temporary server (``status`` 22-44 s)
and the run pages it linked died with it. Now the first command starts one server in the
background, every later command reuses it, and its UI keeps the runs.

The real ``prefect server start`` runs under a home of the test's own (never the real
``~/.prefect-runpod``), on a free port, started once for the module (a start takes 10-45 s
on a busy machine); the module's last slow test stops it, and the session's fixture fails
any test that leaves one behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from prefect_runpod.blocks.local_pod.registry import pid_alive
from prefect_runpod.flows.cli import local_server
from prefect_runpod.flows.cli.local_server import MARKER_VAR, ServerRecord
from tests.fixtures.prefect_server import free_port
from tests.fixtures.server_leaks import mark_fixture_servers, prefect_server_pids

_CLI = [sys.executable, "-m", "prefect_runpod.flows.cli"]


@dataclass
class Machine:
    """A user's machine as the CLI sees it: its own prefect-runpod home, Prefect home and
    working directory, and no API configured; ``first_start`` is what its first two
    commands, started together, answered, and ``older`` the process that a record of a
    server of another Prefect version named then."""

    root: Path
    env: dict[str, str]
    first_start: list[tuple[int, str, str]]
    older: subprocess.Popen[bytes] | None = None

    @property
    def server_home(self) -> Path:
        return self.root / "runpod-home" / "server"

    def record(self) -> ServerRecord:
        return ServerRecord(**json.loads((self.server_home / "server.json").read_text()))

    def write_record(self, record: ServerRecord) -> None:
        (self.server_home / "server.json").write_text(json.dumps(asdict(record)))

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_CLI, *args], env=self.env, cwd=self.root, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*_CLI, *args], env=self.env, cwd=self.root, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip


def _servers_marked(home: Path) -> list[int]:
    """Processes carrying a local server's marker whose home is ``home``."""
    return [
        pid
        for pid in prefect_server_pids((str(home),))
        if f"{MARKER_VAR}=".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    ]


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    """The machine, its server started the way the first test describes (once for the
    module: each start takes 10-45 s); stopped at the end."""
    root = tmp_path_factory.mktemp("user-machine")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_RUNPOD_HOME=str(root / "runpod-home"),
        PREFECT_HOME=str(root / "prefect-home"),
        PREFECT_RUNPOD_SERVER_PORT=str(free_port()),
    )
    found = Machine(root, env, [])
    # The record of a server that an older Prefect runs: a process of its own session that
    # carries the record's marker (one real start per module: each takes 10-45 s).
    found.server_home.mkdir(parents=True)
    server_id = "0" * 16
    found.older = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(3600)"],
        env=dict(env, **{MARKER_VAR: server_id}), start_new_session=True,
    )  # fmt: skip
    port = free_port()
    found.write_record(
        ServerRecord(
            pid=found.older.pid, port=port, prefect_version="3.8.0",
            api_url=f"http://127.0.0.1:{port}/api", ui_url=f"http://127.0.0.1:{port}",
            home=str(found.server_home), started_at="2026-12-01T00:00:00+00:00",
            server_id=server_id,
        )
    )  # fmt: skip
    try:
        both = [found.start("server", "start"), found.start("server", "start")]
        for proc in both:
            out, err = proc.communicate(timeout=600)
            found.first_start.append((proc.returncode, out, err))
        with contextlib.suppress(OSError, ValueError, TypeError):
            mark_fixture_servers({found.record().pid})  # the module's, stopped below
        yield found
    finally:
        subprocess.run([*_CLI, "server", "stop"], env=env, capture_output=True, timeout=120)
        if found.older.poll() is None:
            found.older.kill()
        found.older.wait(timeout=60)


@pytest.mark.slow
def test_two_commands_at_once_start_one_server_and_another_prefect_version_is_restarted(
    machine,
):
    """Two commands starting together end up with one server (the lock); the server the
    record named runs another Prefect version, so it is stopped and a fresh one started,
    after a line that says so."""
    said = machine.first_start
    assert [code for code, _, _ in said] == [0, 0], said
    err = "".join(e for _, _, e in said)
    assert err.count("runs Prefect 3.8.0, this install has") == 1, err
    assert err.count("restarting it") == 1, err
    assert err.count("starting a Prefect server in the background") == 1, err
    assert machine.older is not None and machine.older.wait(timeout=60) is not None
    record = machine.record()
    assert record.pid != machine.older.pid
    assert record.prefect_version == local_server.installed_prefect_version()
    assert record.port == int(machine.env["PREFECT_RUNPOD_SERVER_PORT"])
    assert _servers_marked(machine.server_home) == [record.pid]
    with urllib.request.urlopen(f"{record.api_url}/health", timeout=10) as answer:
        assert answer.read() == b"true"
    env = Path(f"/proc/{record.pid}/environ").read_bytes().split(b"\0")
    assert b"PREFECT_SERVER_ANALYTICS_ENABLED=false" in env and b"DO_NOT_TRACK=1" in env
    assert f"PREFECT_UI_API_URL={record.api_url}".encode() in env  # the UI on this port
    assert not [v for v in env if v.startswith(b"PREFECT_API_")], "no API key or URL reaches it"


@pytest.mark.slow
def test_later_commands_reuse_it_and_its_links_outlive_the_command(machine):
    """The demo (``--quiet``) and ``status`` use the running server and say nothing about
    it; the run page the summary prints answers after the command has exited; the quiet
    run still shows how to get into its pod; the pod's key is deleted once the pod is gone;
    nothing prints a literal None."""
    before = machine.record()
    run = machine.cli("finetune", "--quiet", "--output-dir", str(machine.root / "run"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Prefect server" not in run.stderr  # reused, so nothing to say
    assert machine.record() == before
    way_in = [line for line in run.stderr.splitlines() if "get in with: ssh -tt" in line]
    assert len(way_in) == 1 and "StrictHostKeyChecking=yes" in way_in[0], run.stderr[-2000:]
    assert not (machine.root / "run" / "pod-ssh-key").exists()
    assert not re.search(r"\bNone\b", run.stdout + run.stderr)
    page = re.search(r"^flow run +(http://\S+/runs/flow-run/(\S+))$", run.stdout, re.M)
    assert page and page.group(1).startswith(before.ui_url), run.stdout[-2000:]

    status = machine.cli("status", page.group(2), "--json")
    assert status.returncode == 0 and status.stderr == "", status.stderr
    assert json.loads(status.stdout)["url"] == page.group(1)
    as_a_browser = urllib.request.Request(page.group(1), headers={"Accept": "text/html"})
    with urllib.request.urlopen(as_a_browser, timeout=30) as answer:  # the UI's page
        assert answer.status == 200 and b"<html" in answer.read().lower()
    with urllib.request.urlopen(f"{before.api_url}/flow_runs/{page.group(2)}", timeout=30) as a:
        assert json.loads(a.read())["state"]["type"] == "COMPLETED"


@pytest.mark.slow
def test_register_setup_without_an_api_uses_the_same_server(machine):
    """Without ``PREFECT_API_URL``, ``register setup`` sets up the server the commands use
    (it set up Prefect's temporary server, whose database the commands never read, and
    printed its 'database is locked' traceback), so ``finetune --concurrency-limit
    runpod-gpu`` finds the limit it made."""
    running = machine.record()
    setup = subprocess.run(
        [sys.executable, "-m", "prefect_runpod.deployments.register", "setup"],
        env=machine.env, cwd=machine.root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert setup.returncode == 0 and "Traceback" not in setup.stderr, setup.stderr[-3000:]
    assert "concurrency limit  runpod-gpu: 2 pods at once" in setup.stdout
    assert "temporary server" not in setup.stdout + setup.stderr
    assert machine.record() == running  # reused, not restarted
    url = f"{running.api_url}/v2/concurrency_limits/runpod-gpu"
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert json.loads(answer.read())["limit"] == 2


@pytest.mark.slow
def test_stop_ends_it_and_a_stale_record_is_noticed(machine):
    """``server stop`` ends the server and removes its record. A record whose process died,
    or whose pid now belongs to a process without the server's marker (a recycled pid),
    counts as no server: ``status`` says none runs, and the next command that needs the
    API starts one (the start the first test watched)."""
    running = machine.record()
    stopped = machine.cli("server", "stop")
    assert stopped.returncode == 0 and f"pid {running.pid}" in stopped.stdout
    assert not pid_alive(running.pid) and not (machine.server_home / "server.json").exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for pid in (dead.pid, os.getpid()):  # gone; alive but not the server
        machine.write_record(ServerRecord(**{**asdict(running), "pid": pid}))
        assert local_server.read_live_record(machine.server_home) is None
    status = machine.cli("server", "status")  # the recycled pid's record
    assert status.stdout.startswith("no prefect-runpod Prefect server runs"), status.stdout
    assert "commands use: this server, started on first use" in status.stdout


def test_a_configured_api_always_wins_and_nothing_is_started(tmp_path, monkeypatch):
    """With ``PREFECT_API_URL`` set (here in Prefect's settings, as a profile would),
    the command uses it: no server is started, no record written."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_runpod.flows.cli.session import api_mode, prefect_api

    monkeypatch.setenv("PREFECT_RUNPOD_HOME", str(tmp_path / "home"))
    configured = temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"})
    with configured, api_mode(ephemeral=False), prefect_api() as url:
        assert url == "http://127.0.0.1:9/api"
    assert not (tmp_path / "home").exists()


def test_the_leak_check_sees_a_server_of_this_session(tmp_path):
    """What the session's fixture (and ``.ci/run``) looks for: a ``prefect server start``
    whose environment names a home of this session."""
    env = dict(os.environ, PREFECT_RUNPOD_HOME=str(tmp_path / "home"))
    fake = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "prefect", "server", "start"],
        env=env, stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # its command line shows once exec is done
        while fake.pid not in prefect_server_pids((str(tmp_path),)):
            assert time.monotonic() < deadline, "the leak check never saw it"
            time.sleep(0.05)
        assert fake.pid not in prefect_server_pids((str(tmp_path / "elsewhere"),))
        # A root that only begins the same way is another session's: pytest's base
        # ``pytest-1`` is not the parent of ``pytest-14``, whose servers run beside it.
        assert fake.pid not in prefect_server_pids((str(tmp_path)[:-1],))
    finally:
        fake.communicate(input=b"", timeout=60)
    assert fake.pid not in prefect_server_pids((str(tmp_path),))


def test_a_port_left_in_time_wait_is_free_for_the_next_start() -> None:
    """After `server stop` the old server's closed connections keep its port in TIME_WAIT
    for a minute; the next start must take the same port again (the server binds with
    SO_REUSEADDR), or every link printed earlier points at a dead port."""
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server's side closes first: its end (our port) enters TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # what the old probe did
    with plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    assert local_server._port_free(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert not local_server._port_free(taken.getsockname()[1])  # a listener still refuses
