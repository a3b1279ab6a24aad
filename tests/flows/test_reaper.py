"""The reaper (docs/architecture.md#termination-layers layer 4): the pure decision table, then real local pods and
real flow runs on a real Prefect server, including a SIGKILLed flow process whose pod
only the reaper can end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.flows.reaper import (
    RunSnapshot,
    decide_reap,
    flow_run_id_from_pod_name,
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
RUN_ID = "3f1b2c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"


def _pod(age_seconds: float, name: str = f"prft-{RUN_ID}") -> PodHandle:
    return PodHandle(
        pod_id="lp-1", name=name, provider="local", created_at=NOW - timedelta(seconds=age_seconds)
    )


def _run(
    state_type: str, state_name: str, silent_seconds: float, kept: tuple[str, ...] = ()
) -> RunSnapshot:
    return RunSnapshot(
        flow_run_id=RUN_ID,
        state_type=state_type,
        state_name=state_name,
        last_seen_at=NOW - timedelta(seconds=silent_seconds),
        kept_pods=list(kept),
    )


@pytest.mark.parametrize(
    ("pod", "run", "reap", "reason_has"),
    [
        (_pod(100), _run("COMPLETED", "Completed", 50), True, "Completed"),
        (_pod(100), _run("FAILED", "Failed", 50), True, "Failed"),
        # a run that kept its pod (outputs left on it): spared until the TTL, not after
        (_pod(100), _run("FAILED", "Failed", 50, ("lp-1",)), False, "kept this pod"),
        (_pod(100), _run("FAILED", "Failed", 50, ("lp-2",)), True, "still lives"),
        (_pod(90_000), _run("FAILED", "Failed", 50, ("lp-1",)), True, "TTL"),
        (_pod(100), _run("CRASHED", "Crashed", 50), True, "Crashed"),
        (_pod(100), _run("CANCELLED", "Cancelled", 50), True, "Cancelled"),
        (_pod(100), None, True, "unknown"),
        (_pod(10), None, False, "grace"),
        (_pod(100), _run("RUNNING", "Running", 30), False, "last seen"),
        (_pod(5000), _run("RUNNING", "Running", 1000), True, "silent"),
        (_pod(5000), _run("CANCELLING", "Cancelling", 10), False, "last seen"),
        (_pod(5000), _run("SCHEDULED", "AwaitingRetry", 2000), True, "silent"),
        (_pod(5000), _run("PAUSED", "Paused", 100), False, "last seen"),
        (_pod(90_000), _run("RUNNING", "Running", 5), True, "TTL"),
        (_pod(100, name="prft-debug-box"), None, False, "no flow run id"),
        (_pod(90_000, name="prft-debug-box"), None, True, "TTL"),
    ],
)
def test_decide_reap_table(pod: PodHandle, run: RunSnapshot | None, reap: bool, reason_has: str):
    got, reason = decide_reap(
        pod, run, NOW, ttl_seconds=86_400, stale_running_seconds=900, grace_seconds=60
    )
    assert got is reap, reason
    assert reason_has in reason


def test_the_default_ttl_is_the_pods_lifetime_plus_a_grace_even_with_a_fresh_heartbeat():
    """Issue 14: the TTL is a hard cap whatever the heartbeat says; by default the pod's
    recorded lifetime plus REAPER_TTL_GRACE_SECONDS (the dead-man acts
    first); a fresh heartbeat still protects a younger pod."""
    from prefect_runpod.blocks.provider import (
        DEFAULT_POD_LIFETIME_SECONDS,
        REAPER_TTL_GRACE_SECONDS,
    )

    live = _run("RUNNING", "Running", 1)
    young = _pod(3000).model_copy(update={"lifetime_seconds": 3600.0})
    old = _pod(3600 + REAPER_TTL_GRACE_SECONDS + 1).model_copy(update={"lifetime_seconds": 3600.0})
    assert decide_reap(young, live, NOW, ttl_seconds=None)[0] is False
    reap, reason = decide_reap(old, live, NOW, ttl_seconds=None)
    assert reap is True and "TTL" in reason
    unrecorded = DEFAULT_POD_LIFETIME_SECONDS + REAPER_TTL_GRACE_SECONDS
    assert decide_reap(_pod(unrecorded - 10), live, NOW)[0] is False
    assert decide_reap(_pod(unrecorded + 10), live, NOW)[0] is True


def test_the_reaper_refuses_a_ttl_that_is_not_positive(capsys):
    """Issue 14: ``reaper --ttl-seconds -1`` ended a healthy run's pod."""
    from prefect_runpod.flows.cli import EXIT_USAGE, main

    for bad in ("-1", "0"):
        assert main(["reaper", "--ttl-seconds", bad]) == EXIT_USAGE
        assert "ttl_seconds (--ttl-seconds) must be a finite number of seconds above 0" in (
            capsys.readouterr().err
        )


def test_flow_run_id_from_pod_name():
    assert str(flow_run_id_from_pod_name(f"prft-{RUN_ID}", "prft")) == RUN_ID
    assert str(flow_run_id_from_pod_name(f"my-team-{RUN_ID}", "my-team")) == RUN_ID
    assert flow_run_id_from_pod_name(f"other-{RUN_ID}", "prft") is None
    assert flow_run_id_from_pod_name("prft-not-a-uuid", "prft") is None
    assert flow_run_id_from_pod_name(f"prft-{RUN_ID}x", "prft") is None
    # A run's later pod attempts (issue 25) name the same flow run, whatever the prefix.
    assert str(flow_run_id_from_pod_name(f"prft-{RUN_ID}-a2", "prft")) == RUN_ID
    assert str(flow_run_id_from_pod_name(f"my-team-{RUN_ID}-a12", None)) == RUN_ID
    assert flow_run_id_from_pod_name(f"prft-{RUN_ID}-a0", "prft") is None
    assert flow_run_id_from_pod_name(f"prft-{RUN_ID}-b2", "prft") is None


# --- against a real server and real local pods ---------------------------------------


def _provider():
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

    return LocalPodProvider()


def _public_key() -> str:
    from prefect_runpod.blocks.keys import generate_keypair

    return generate_keypair().public_key


def _make_run(client, final: str | None):  # type: ignore[no-untyped-def]
    """A flow run of a throwaway flow, left Running or moved to a final state."""
    from prefect import flow
    from prefect.states import Completed, Pending, Running

    @flow(name="reaper-test-subject")
    def subject() -> None:  # pragma: no cover - never executed, only named
        return None

    run = client.create_flow_run(subject, state=Pending())
    client.set_flow_run_state(run.id, Running(), force=True)
    if final == "Completed":
        client.set_flow_run_state(run.id, Completed(), force=True)
    return run.id


@pytest.mark.slow
def test_reaper_reaps_finished_and_unknown_keeps_live(prefect_api, runpod_home):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from prefect_runpod.blocks.provider import PodRequest
    from prefect_runpod.flows.reaper import reaper

    prefix = f"rt{uuid.uuid4().hex[:6]}"
    provider = _provider()
    request = PodRequest(public_key=_public_key())
    with get_client(sync_client=True) as client:
        done_id = _make_run(client, "Completed")
        live_id = _make_run(client, None)
    names = {
        "done": f"{prefix}-{done_id}",
        "done_a2": f"{prefix}-{done_id}-a2",  # the pod a finished run resumed on
        "live": f"{prefix}-{live_id}",
        "live_a2": f"{prefix}-{live_id}-a2",
        "unknown": f"{prefix}-{uuid.uuid4()}",
    }
    with get_client(sync_client=True) as client:
        kept_id = _make_run(client, "Completed")
    names["kept"] = f"{prefix}-{kept_id}"
    pods = {k: provider.create(request, n) for k, n in names.items()}
    with get_client(sync_client=True) as client:  # the run kept its pod: outputs left on it
        client.update_flow_run(kept_id, tags=[f"kept-pod:{pods['kept'].pod_id}"])
    try:
        state = reaper(
            provider="local",
            name_prefix=prefix,
            stale_running_seconds=600,
            grace_seconds=0,
            return_state=True,
        )
        rows = {r["pod_name"]: r for r in state.result()}
        assert rows[names["done"]]["reap"] and rows[names["done"]]["terminated"]
        assert rows[names["done"]]["run_state"] == "Completed"
        assert rows[names["unknown"]]["reap"] and rows[names["unknown"]]["run_state"] == "unknown"
        assert not rows[names["live"]]["reap"] and rows[names["live"]]["run_state"] == "Running"
        assert rows[names["done_a2"]]["reap"] and rows[names["done_a2"]]["terminated"]
        assert rows[names["done_a2"]]["run_state"] == "Completed"
        assert not rows[names["live_a2"]]["reap"]
        assert not rows[names["kept"]]["reap"], rows[names["kept"]]
        assert "kept this pod" in rows[names["kept"]]["reason"]
        left = {p.name for p in provider.list(prefix)}
        assert left == {names["live"], names["live_a2"], names["kept"]}

        with get_client(sync_client=True) as client:
            arts = client.read_artifacts(
                flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
                )
            )
        assert [a.key for a in arts] == ["reaper-report"]
        assert names["live"] in str(arts[0].data)
    finally:
        for pod in pods.values():
            provider.terminate(pod.pod_id)


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from prefect import flow
    from prefect.runtime import flow_run
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from prefect_runpod.blocks.provider import PodRequest

    @flow(name="pod-holder")
    def hold(prefix: str, public_key: str) -> None:
        LocalPodProvider().create(PodRequest(public_key=public_key), f"{prefix}-{flow_run.id}")
        print("POD-CREATED", flush=True)
        time.sleep(600)

    hold(sys.argv[1], sys.argv[2])
    """
)


@pytest.mark.slow
def test_reaper_ends_the_pod_of_a_sigkilled_flow_process(prefect_api, runpod_home, tmp_path: Path):
    """SIGKILL runs no finally and no hook; the run stays Running on a self-hosted
    server. The reaper keeps the pod while the run is fresh, and reaps it once the
    run has been silent longer than ``stale_running_seconds``."""
    from prefect.client.orchestration import get_client

    from prefect_runpod.flows.reaper import flow_run_id_from_pod_name, reaper

    prefix = f"rk{uuid.uuid4().hex[:6]}"
    provider = _provider()
    script = tmp_path / "holder.py"
    script.write_text(_HOLDER)
    proc = subprocess.Popen(
        [sys.executable, str(script), prefix, _public_key()],
        env=prefect_api.client_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 240
        while not provider.list(prefix):
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline, "holder flow made no pod within 240 s"
            time.sleep(0.5)
        (pod,) = provider.list(prefix)
        run_id = flow_run_id_from_pod_name(pod.name, prefix)

        kept = reaper(provider="local", name_prefix=prefix, stale_running_seconds=600)
        assert [r["reap"] for r in kept] == [False]

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(run_id).state.type.value == "RUNNING"
        assert provider.find(pod.name) is not None, "the pod must outlive its flow process"

        stale = 3.0
        time.sleep(stale + 1.0)
        rows = reaper(provider="local", name_prefix=prefix, stale_running_seconds=stale)
        assert len(rows) == 1 and rows[0]["reap"] and rows[0]["terminated"], rows
        assert "silent" in rows[0]["reason"]
        assert provider.find(pod.name) is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for left in provider.list(prefix):
            provider.terminate(left.pod_id)


def test_a_pod_found_by_its_id_names_its_run_whatever_its_prefix():
    """``prefect-runpod terminate POD_ID`` records the end in the pod's run, found from
    the name alone, whichever prefix the run used."""
    assert flow_run_id_from_pod_name(f"fm1a2b-{RUN_ID}", None) == uuid.UUID(RUN_ID)
    assert flow_run_id_from_pod_name(f"prft-{RUN_ID}", None) == uuid.UUID(RUN_ID)
    assert flow_run_id_from_pod_name(RUN_ID, None) is None  # no prefix at all
    assert flow_run_id_from_pod_name(f"prft_{RUN_ID}", None) is None
    assert flow_run_id_from_pod_name("prft-debug-box", None) is None
