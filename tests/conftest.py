"""Session-wide test setup: an isolated Prefect home and pod home, and the fixture
modules under tests/fixtures/ (one per area, so areas never edit each other's)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="prefect-runpod-tests-"))
# Set before Prefect is imported anywhere, so settings pick them up.
os.environ.setdefault("PREFECT_HOME", str(_SESSION_TMP / "prefect-home"))
os.environ["PREFECT_RUNPOD_HOME"] = str(_SESSION_TMP / "runpod-home")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The test servers (both inherit this) log the cause of each 503 they answer: on a busy
# machine SQLite's write races show up in the failing test's captured output.
os.environ.setdefault("PREFECT_API_LOG_RETRYABLE_ERRORS", "true")
# Keep huggingface_hub on loopback: its import-time endpoint is used for a registry fetch
# (user-agent detection); point it at a closed local port and a private HF_HOME.
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("HF_HOME", str(_SESSION_TMP / "hf-home"))

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}"
    for p in (Path(__file__).parent / "fixtures").glob("*.py")
    if p.stem != "__init__"
)


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """A real Prefect API server for the session (Prefect's own test harness: a
    temporary SQLite database behind a subprocess server on a free loopback port)."""
    from prefect.testing.utilities import prefect_test_harness

    from tests.fixtures.server_leaks import mark_fixture_servers

    with prefect_test_harness(server_startup_timeout=300):
        mark_fixture_servers()  # the session's own: no test leaves it behind
        yield


@pytest.fixture(autouse=True)
def _no_shared_ssh_connection_between_tests() -> Iterator[None]:
    """Each test starts without the OpenSSH connections an earlier one left open for
    later transfers (``openssh_login``): a test sees only its own."""
    yield
    from prefect_runpod.blocks.transfer.openssh_login import close_shared_connections

    close_shared_connections()


@pytest.fixture(scope="session")
def runpod_home() -> Path:
    """The pod home every LocalPod in this session lives under."""
    path = Path(os.environ["PREFECT_RUNPOD_HOME"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Pods left running = 0, guardians left running = 0: any local pod still registered
    under this session's pod home is terminated, any run's guardian still waiting there
    is stopped, and either fails the run, naming it."""
    home = Path(os.environ["PREFECT_RUNPOD_HOME"])
    _no_guardian_left(session, home)
    if not (home / "registry").is_dir():
        return
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

    provider = LocalPodProvider(home=home)
    leftovers = provider.list("")
    for handle in leftovers:
        provider.terminate(handle.pod_id)
    if leftovers:
        names = ", ".join(f"{h.pod_id} ({h.name})" for h in leftovers)
        print(f"\nERROR: tests left {len(leftovers)} local pod(s) running: {names}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _no_guardian_left(session: pytest.Session, home: Path) -> None:
    import signal
    import time

    from prefect_runpod.flows.run.guardian import live_guardians

    deadline = time.monotonic() + 30.0  # one told to go a moment ago may still be exiting
    while (left := live_guardians(home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for entry in left:
        os.kill(int(entry["pid"]), signal.SIGKILL)
    if left:
        runs = ", ".join(f"{e['pid']} (run {e['flow_run_id']})" for e in left)
        print(f"\nERROR: tests left {len(left)} guardian(s) running: {runs}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
