"""The pod-side dead-man switch, run as the plain script it is on the pod."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.train import WATCHDOG

TRUST_EXIT = ("--settle-seconds", "0", "--no-api")
"""Trust a command's exit status and skip the API layer: the watchdog's loop alone."""

# The pod's own RunPod key in these tests: obviously fake, never a real key's shape.
FAKE_POD_KEY = "fake-pod-scoped-key-for-tests"


def run_watchdog(run_dir: Path, *args: str, env: dict | None = None, timeout: float = 180.0):
    if "--settle-seconds" not in args:
        args = (*args, *TRUST_EXIT)
    return subprocess.run(
        [sys.executable, str(WATCHDOG), "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def marker_command(marker: Path) -> str:
    """A remove command that records the pod id it was asked to remove."""
    return f'echo "removed $RUNPOD_POD_ID" >> {marker}'


def wait_for(predicate, timeout_seconds: float = 120.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def pod_id() -> str:
    """A pod id of this test's own: the last resort stops every process carrying
    ``RUNPOD_POD_ID=<id>``, so a shared id would let a suite running beside this one
    stop this test's watchdog."""
    return f"podtest{secrets.token_hex(4)}"


@pytest.fixture
def pod_env(pod_id: str) -> dict:
    return {**os.environ, "RUNPOD_POD_ID": pod_id}


class TestDecide:
    """The rule itself, as a pure function (times in epoch seconds)."""

    @pytest.fixture(scope="class")
    def decide(self):
        spec = importlib.util.spec_from_file_location("pod_side_watchdog", WATCHDOG)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.decide

    @pytest.mark.parametrize(
        ("now", "started", "origin", "heartbeat", "expected"),
        [
            (100.0, 100.0, 100.0, None, None),  # just armed
            (159.0, 100.0, 100.0, 150.0, None),  # fresh heartbeat
            (170.0, 100.0, 100.0, 105.0, "heartbeat stale"),  # heartbeat 65 s old
            (170.0, 100.0, 100.0, None, "no heartbeat yet"),  # never beat, 70 s since start
            (120.0, 100.0, 100.0, 10.0, None),  # an old leftover counts from the start
            (1100.0, 100.0, 50.0, 1099.0, "lifetime cap"),  # fresh beat, but too old a pod
        ],
    )
    def test_table(self, decide, now, started, origin, heartbeat, expected):
        reason = decide(now, started, origin, heartbeat, 60.0, 1000.0)
        if expected is None:
            assert reason is None
        else:
            assert expected in reason

    def test_a_kept_pod_outlives_its_heartbeat_but_not_its_lifetime(self, decide):
        # the run kept the pod (outputs left on it) and stopped touching the heartbeat
        assert "heartbeat stale" in decide(900.0, 100.0, 100.0, 105.0, 60.0, 1000.0)
        assert decide(900.0, 100.0, 100.0, 105.0, 60.0, 1000.0, True) is None
        assert "lifetime cap" in decide(1100.0, 100.0, 100.0, 105.0, 60.0, 1000.0, True)


@pytest.mark.slow
class TestWatchdog:
    def test_stale_heartbeat_removes_the_pod(self, tmp_path: Path, pod_env: dict, pod_id: str):
        marker = tmp_path / "removed.txt"
        (tmp_path / "heartbeat").touch()
        os.utime(tmp_path / "heartbeat", (time.time() - 100, time.time() - 100))
        done = run_watchdog(
            tmp_path,
            "--heartbeat-stale-seconds",
            "1",
            "--lifetime-seconds",
            "3600",
            "--check-interval-seconds",
            "0.2",
            "--remove-command",
            marker_command(marker),
            env=pod_env,
        )
        assert done.returncode == 0
        assert marker.read_text() == f"removed {pod_id}\n"
        log = (tmp_path / "watchdog.log").read_text()
        assert "heartbeat stale" in log and "remove command succeeded" in log

    def test_lifetime_cap_removes_the_pod_despite_a_fresh_heartbeat(
        self, tmp_path: Path, pod_env: dict, pod_id: str
    ):
        marker = tmp_path / "removed.txt"
        heartbeat = tmp_path / "heartbeat"
        proc = subprocess.Popen(
            [sys.executable, str(WATCHDOG), "--run-dir", str(tmp_path),
             "--heartbeat-stale-seconds", "3600", "--lifetime-seconds", "1",
             "--check-interval-seconds", "0.2", "--remove-command", marker_command(marker),
             *TRUST_EXIT],
            env=pod_env,
        )  # fmt: skip
        try:
            while proc.poll() is None:
                heartbeat.touch()
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        assert proc.returncode == 0
        assert "lifetime cap" in (tmp_path / "watchdog.log").read_text()
        assert marker.read_text() == f"removed {pod_id}\n"

    def test_lifetime_counts_from_the_first_start(self, tmp_path: Path, pod_env: dict):
        """A restarted watchdog must not grant the pod a new lifetime."""
        marker = tmp_path / "removed.txt"
        (tmp_path / "watchdog.start").write_text(f"{time.time() - 7200:.3f}\n")
        done = run_watchdog(
            tmp_path,
            "--heartbeat-stale-seconds",
            "3600",
            "--lifetime-seconds",
            "3600",
            "--check-interval-seconds",
            "0.2",
            "--remove-command",
            marker_command(marker),
            env=pod_env,
        )
        assert done.returncode == 0 and marker.exists()
        assert "lifetime cap" in (tmp_path / "watchdog.log").read_text()

    def test_failed_removal_is_retried(self, tmp_path: Path, pod_env: dict):
        counter = tmp_path / "attempts"
        command = (
            f"echo x >> {counter}; "
            f'test "$(wc -l < {counter})" -ge 2 || {{ echo "api down" >&2; exit 1; }}'
        )
        done = run_watchdog(
            tmp_path,
            "--heartbeat-stale-seconds",
            "0.1",
            "--lifetime-seconds",
            "3600",
            "--check-interval-seconds",
            "0.1",
            "--remove-command",
            command,
            env=pod_env,
        )
        assert done.returncode == 0
        assert counter.read_text().count("x") == 2
        log = (tmp_path / "watchdog.log").read_text()
        assert "exited 1: api down" in log and "will retry" in log
        attempts = _attempts(tmp_path)
        # every way failed once: the workload was stopped, and the next round worked
        assert [(a["layer"], a["ok"]) for a in attempts] == [
            ("remove command", False),
            ("stop workload", False),
            ("remove command", True),
        ]

    def test_default_command_is_runpodctl_pod_delete(
        self, tmp_path: Path, pod_env: dict, pod_id: str
    ):
        """runpodctl 2.x's verb first (``remove pod`` is deprecated there)."""
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "runpodctl"
        shim.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/runpodctl-args\n')
        shim.chmod(0o755)
        env = {**pod_env, "PATH": f"{bin_dir}:{pod_env['PATH']}"}
        done = run_watchdog(
            tmp_path,
            "--heartbeat-stale-seconds",
            "0.1",
            "--lifetime-seconds",
            "3600",
            "--check-interval-seconds",
            "0.1",
            env=env,
        )
        assert done.returncode == 0
        assert (tmp_path / "runpodctl-args").read_text() == f"pod delete {pod_id}\n"

    def test_refuses_to_start_without_a_way_to_remove_the_pod(self, tmp_path: Path):
        env = {k: v for k, v in os.environ.items() if k != "RUNPOD_POD_ID"}
        done = run_watchdog(
            tmp_path, "--heartbeat-stale-seconds", "1", "--lifetime-seconds", "10", env=env
        )
        assert done.returncode == 2 and "RUNPOD_POD_ID is not set" in done.stderr

    def test_detach_runs_one_instance_and_stops_on_sigterm(self, tmp_path: Path, pod_env: dict):
        marker = tmp_path / "removed.txt"
        args = (
            "--heartbeat-stale-seconds", "3600", "--lifetime-seconds", "3600",
            "--check-interval-seconds", "0.2", "--remove-command", marker_command(marker),
            "--detach",
        )  # fmt: skip
        first = run_watchdog(tmp_path, *args, env=pod_env)
        pid = json.loads(first.stdout)["pid"]
        try:
            second = json.loads(run_watchdog(tmp_path, *args, env=pod_env).stdout)
            assert second == {"pid": pid, "already_running": True}
            assert os.getsid(pid) != os.getsid(0)  # its own session: an SSH drop cannot reach it
        finally:
            os.kill(pid, signal.SIGTERM)
        log = tmp_path / "watchdog.log"
        wait_for(lambda: "stopped by SIGTERM" in log.read_text(), what="the watchdog to stop")
        assert not marker.exists()


# --- issue 14: a dead-man that always finds a way ---------------------------------------

X509 = 'Error: Post "https://api.runpod.io/graphql?api_key=XXX": x509: certificate signed by unknown authority'


def _runpodctl(bin_dir: Path, log: Path, fail_verbs: tuple[str, ...]) -> dict:
    """A runpodctl stand-in on PATH: logs its arguments; the verbs in ``fail_verbs``
    ("pod delete", "remove pod") fail as runpodctl does without CA certificates."""
    bin_dir.mkdir(exist_ok=True)
    cases = "".join(f'  "{verb}") echo {json.dumps(X509)} >&2; exit 1 ;;\n' for verb in fail_verbs)
    shim = bin_dir / "runpodctl"
    shim.write_text(
        f'#!/bin/sh\necho "$1 $2 $3 by=$PREFECT_RUNPOD_ENDED_BY" >> {log}\n'
        f'case "$1 $2" in\n{cases}esac\nexit 0\n'
    )
    shim.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


class _API:
    """A loopback HTTPS stand-in for RunPod's REST v2 ``DELETE /v2/pods/{id}`` (204), its
    certificate signed by a throwaway CA: a client verifies it only with that CA's
    bundle. ``url`` is the v2 base the watchdog takes."""

    def __init__(self, tmp_path: Path) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from tests.emulators.tls import make_loopback_ca

        self.ca = make_loopback_ca()
        self.calls: list[tuple[str, str]] = []
        self.answer: tuple[int, dict | None] = (204, None)
        """What the next DELETE answers: a status and a problem object (or none)."""
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_DELETE(self) -> None:
                api.calls.append((self.headers.get("Authorization", ""), f"DELETE {self.path}"))
                status, problem = api.answer
                out = json.dumps(problem).encode() if problem else b""
                self.send_response(status)
                if problem:
                    self.send_header("Content-Type", "application/problem+json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = self.ca.server_context(tmp_path / "tls").wrap_socket(
            self.server.socket, server_side=True
        )
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/v2"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[_API]:
    served = _API(tmp_path)
    try:
        yield served
    finally:
        served.close()


def _attempts(run_dir: Path) -> list[dict]:
    """The recorded results (each layer also records ``ok: null`` as it starts)."""
    lines = (run_dir / "deadman.jsonl").read_text().splitlines()
    return [a for a in map(json.loads, lines) if a["ok"] is not None]


def _stale(run_dir: Path, *extra: str, env: dict) -> subprocess.CompletedProcess:
    return run_watchdog(
        run_dir,
        "--heartbeat-stale-seconds", "0.1", "--lifetime-seconds", "3600",
        "--check-interval-seconds", "0.1", "--settle-seconds", "0", *extra,
        env=env,
    )  # fmt: skip


@pytest.mark.slow
class TestLayers:
    def test_the_deprecated_verb_when_pod_delete_fails(
        self, tmp_path: Path, pod_env: dict, pod_id: str
    ) -> None:
        log = tmp_path / "runpodctl.log"
        env = {**pod_env, **_runpodctl(tmp_path / "bin", log, ("pod delete",))}
        assert _stale(tmp_path, "--no-api", env=env).returncode == 0
        assert log.read_text().splitlines() == [
            f"pod delete {pod_id} by=deadman",
            f"remove pod {pod_id} by=deadman",
        ]
        layers = [(a["layer"], a["ok"]) for a in _attempts(tmp_path)]
        assert layers == [("runpodctl pod delete", False), ("runpodctl remove pod", True)]
        assert "x509" in _attempts(tmp_path)[0]["detail"]

    def test_the_api_with_the_pods_key_and_a_ca_bundle_found_on_the_pod(
        self, tmp_path: Path, pod_env: dict, pod_id: str, api: _API
    ) -> None:
        """runpodctl fails both ways (x509); the system store does not trust the API's
        certificate either; certifi's bundle on the pod's Python path does."""
        site_dir = tmp_path / "site"
        (site_dir / "certifi").mkdir(parents=True)
        (site_dir / "certifi" / "cacert.pem").write_bytes(api.ca.ca_pem)
        log = tmp_path / "runpodctl.log"
        env = {
            **pod_env,
            **_runpodctl(tmp_path / "bin", log, ("pod delete", "remove pod")),
            "RUNPOD_API_KEY": FAKE_POD_KEY,
            "PYTHONPATH": str(site_dir),
        }
        assert _stale(tmp_path, "--api-url", api.url, env=env).returncode == 0
        assert api.calls == [(f"Bearer {FAKE_POD_KEY}", f"DELETE /v2/pods/{pod_id}")]
        attempts = _attempts(tmp_path)
        assert [(a["layer"], a["ok"]) for a in attempts] == [
            ("runpodctl pod delete", False),
            ("runpodctl remove pod", False),
            ("DELETE /v2/pods (pod key)", True),
        ]
        assert f"TLS verified with {site_dir}/certifi/cacert.pem" in attempts[-1]["detail"]

    def test_x509_everywhere_stops_the_workload_and_says_the_pod_was_not_ended(
        self, tmp_path: Path, pod_env: dict, api: _API
    ) -> None:
        """No bundle on the pod trusts the API: verification is never turned off, so the
        last resort stops the pod's processes (never one of another pod, never PID 1)."""
        log = tmp_path / "runpodctl.log"
        env = {
            **pod_env,
            **_runpodctl(tmp_path / "bin", log, ("pod delete", "remove pod")),
            "RUNPOD_API_KEY": FAKE_POD_KEY,
        }
        workload = subprocess.Popen(["sleep", "600"], env=env)
        other = f"otherpod{secrets.token_hex(4)}"
        bystander = subprocess.Popen(["sleep", "600"], env={**env, "RUNPOD_POD_ID": other})
        proc = subprocess.Popen(
            [sys.executable, str(WATCHDOG), "--run-dir", str(tmp_path),
             "--heartbeat-stale-seconds", "0.1", "--lifetime-seconds", "3600",
             "--check-interval-seconds", "0.5", "--settle-seconds", "0", "--api-url", api.url],
            env=env,
        )  # fmt: skip
        try:
            wait_for(lambda: workload.poll() is not None, 180, "the workload to be stopped")
            wait_for(lambda: any(a.get("outcome") for a in _attempts(tmp_path)), 120, "the outcome")
            assert bystander.poll() is None and proc.poll() is None  # it keeps trying
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            bystander.kill()
            bystander.wait()
        assert api.calls == []  # TLS never verified, so nothing was sent
        attempts = _attempts(tmp_path)
        api_layer = [a for a in attempts if a["layer"] == "DELETE /v2/pods (pod key)"]
        assert api_layer and "x509" in api_layer[0]["detail"]
        assert "the system CA store" in api_layer[0]["detail"]
        stopped = [a for a in attempts if a.get("outcome")]
        assert stopped[0]["outcome"] == "workload stopped, pod NOT ended"
        assert stopped[0]["layer"] == "stop workload"


def test_ca_bundles_are_found_where_pip_and_certifi_put_them(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("pod_side_watchdog", WATCHDOG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for rel in ("certifi/cacert.pem", "pip/_vendor/certifi/cacert.pem"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    saved = list(sys.path)
    try:
        sys.path.insert(0, str(tmp_path))
        found = module.ca_bundles([str(tmp_path / "certifi/cacert.pem"), "/no/such/file"])
    finally:
        sys.path[:] = saved
    ours = [p for p in found if p.startswith(str(tmp_path))]
    assert ours == [
        str(tmp_path / "certifi/cacert.pem"),
        str(tmp_path / "pip/_vendor/certifi/cacert.pem"),
    ]


def test_the_pods_key_of_the_wrong_shape_is_never_quoted(tmp_path: Path, api: _API) -> None:
    """The pod's own key with a newline inside (or a space): ``http.client`` would refuse
    the header and quote it in its error, which ``deadman.jsonl`` (read back by the flow,
    the reaper and ``pods``) would keep; the layer says why it cannot run instead. One
    trailing newline is stripped, and the call goes through (issue 21)."""
    spec = importlib.util.spec_from_file_location("pod_side_watchdog", WATCHDOG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(api.ca.ca_pem)
    for bad in (f"{FAKE_POD_KEY}\nsecond-half-of-it", f"{FAKE_POD_KEY} second-half-of-it"):
        ok, detail = module.api_terminate(api.url, bad, "podtest1", [str(bundle)])
        assert not ok and "holds whitespace or a control character" in detail
        assert FAKE_POD_KEY not in detail and "second-half" not in detail
    assert api.calls == []
    ok, detail = module.api_terminate(api.url, FAKE_POD_KEY + "\n", "podtest1", [str(bundle)])
    assert ok, detail
    assert api.calls == [(f"Bearer {FAKE_POD_KEY}", "DELETE /v2/pods/podtest1")]


@pytest.mark.parametrize(
    ("status", "problem", "ok", "said"),
    [
        (204, None, True, "DELETE accepted (HTTP 204)"),
        (404, {"title": "Not Found", "status": 404, "detail": "pod not found"}, True,
         "RunPod no longer knows the pod (HTTP 404 Not Found: pod not found)"),
        (401, {"title": "Unauthorized", "status": 401, "detail": "invalid bearer token"}, False,
         "HTTP 401: the pod's key was refused (Unauthorized: invalid bearer token)"),
        (500, {"title": "Internal Server Error", "status": 500, "detail": "try later"}, False,
         "RunPod answered HTTP 500 Internal Server Error: try later"),
    ],
)  # fmt: skip
def test_the_api_layer_reads_runpods_v2_answers(  # type: ignore[no-untyped-def]
    tmp_path: Path, api: _API, status, problem, ok, said
) -> None:
    """``DELETE /v2/pods/{id}``: 204 ends it, 404 means RunPod no longer knows it (gone),
    anything else is RunPod's problem object in its own words."""
    spec = importlib.util.spec_from_file_location("pod_side_watchdog", WATCHDOG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(api.ca.ca_pem)
    api.answer = (status, problem)
    got, detail = module.api_terminate(api.url, FAKE_POD_KEY, "podtest1", [str(bundle)])
    assert (got, said in detail) == (ok, True), detail
    assert FAKE_POD_KEY not in detail


def test_the_runs_own_process_is_stopped_before_the_pod_is_ended(
    tmp_path: Path, pod_env: dict, pod_id: str
) -> None:
    """``--stop-run-first``: the run's process group (the launcher's ``train.pid``) gets
    SIGTERM and may report before the pod is ended (a flow's engine marks its run
    Crashed); the pod is ended once it exited."""
    import threading

    said, ready = tmp_path / "said.txt", tmp_path / "ready"
    trap = (
        "import signal, sys, time\n"
        f"def bye(*_): open({str(said)!r}, 'w').write('stopped'); sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(120)\n"
    )
    run = subprocess.Popen([sys.executable, "-c", trap], start_new_session=True)

    def supervise() -> None:  # the launcher's supervisor: reap it, record its exit
        (tmp_path / "train.exit").write_text(f"{run.wait()}\n")

    supervisor = threading.Thread(target=supervise, daemon=True)
    supervisor.start()
    try:
        wait_for(ready.exists, 60.0, "the run's SIGTERM handler")
        (tmp_path / "train.pid").write_text(f"{run.pid}\n")
        marker = tmp_path / "removed.txt"
        removed = f"test -f {said} && echo after-stop > {marker} || echo before-stop > {marker}"
        done = _stale(tmp_path, "--stop-run-first", "20", "--remove-command", removed, env=pod_env)
        assert done.returncode == 0, done.stderr
        supervisor.join(timeout=10)
        assert (tmp_path / "train.exit").read_text() == "143\n"
        assert said.read_text() == "stopped"
        assert marker.read_text() == "after-stop\n"
        layers = [(a["layer"], a["ok"]) for a in _attempts(tmp_path)]
        assert layers == [("stop the run's process first", True), ("remove command", True)]
    finally:
        if run.poll() is None:
            run.kill()
        supervisor.join(timeout=10)
