"""What a local pod's provider says about a pod now (``LocalPodProvider.status``), the
tombstone an ended pod leaves, its own lease and the ``runpodctl`` stand-in's verbs and
faults (issue 14)."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.local_pod.pod_files import X509_ERROR
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.local_pod.registry import find_marked_pids, read_record
from prefect_runpod.blocks.provider import DeadmanConfig, PodCause, PodRequest
from tests.fixtures.local_pod import PodFixture, connect_paramiko, read_shell_until, start_pod


def _wait_for(predicate, timeout_seconds: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    return predicate()


def _type(fixture: PodFixture, line: bytes, marker: bytes = b"\x00never") -> bytes:
    _, handle, keypair = fixture
    client = connect_paramiko(handle, keypair)
    try:
        chan = client.invoke_shell(term="xterm")
        chan.send(line)
        return read_shell_until(chan, marker, timeout_seconds=120)
    finally:
        client.close()


@pytest.mark.slow
def test_a_live_pod_is_alive(local_pod: PodFixture) -> None:
    provider, handle, _ = local_pod
    status = provider.status(handle.pod_id)
    assert status.cause is PodCause.ALIVE and not status.gone


@pytest.mark.slow
def test_runpodctl_pod_delete_ends_the_pod_and_leaves_a_tombstone(local_pod: PodFixture) -> None:
    """runpodctl 2.x's verb; the tombstone says when, by whom and how."""
    provider, handle, _ = local_pod
    before = datetime.now(UTC)
    _type(local_pod, b"PREFECT_RUNPOD_ENDED_BY=deadman runpodctl pod delete $RUNPOD_POD_ID\n")
    assert _wait_for(
        lambda: provider.get(handle.pod_id) is None and not find_marked_pids(handle.pod_id)
    )
    status = provider.status(handle.pod_id)
    assert status.cause is PodCause.TERMINATED_OUTSIDE and status.gone
    assert (status.ended_by, status.ended_layer) == ("deadman", "runpodctl pod delete")
    assert status.ended_at is not None and before <= status.ended_at <= datetime.now(UTC)
    # terminate afterwards is idempotent and confirms the recorded end, not "now"
    again = provider.terminate(handle.pod_id)
    assert again.already_gone and again.confirmed_at == status.ended_at


@pytest.mark.slow
def test_the_deprecated_remove_verb_still_works_and_says_so(local_pod: PodFixture) -> None:
    provider, handle, _ = local_pod
    out = _type(local_pod, b"runpodctl remove pod someotherpod; echo RC=$?-$((40+2))\n", b"RC=1-42")
    assert b"deprecated" in out and b"not found" in out  # says so, and acts on its own pod only
    _type(local_pod, b"runpodctl remove pod $RUNPOD_POD_ID\n")
    assert _wait_for(lambda: provider.status(handle.pod_id).gone)
    status = provider.status(handle.pod_id)
    assert (status.ended_by, status.ended_layer) == ("pod", "runpodctl remove pod")


@pytest.mark.slow
def test_a_dead_daemon_is_a_lost_host(local_provider: LocalPodProvider) -> None:
    handle, _ = start_pod(local_provider)
    try:
        record = read_record(local_provider.home, handle.pod_id)
        assert record is not None
        os.kill(record.pid, signal.SIGKILL)
        status = _wait_for(
            lambda: (s := local_provider.status(handle.pod_id)).cause is PodCause.HOST_LOST and s
        )
        assert status and "dead" in status.provider_status
    finally:
        local_provider.terminate(handle.pod_id)
    assert local_provider.status(handle.pod_id).ended_by == "terminate"


def test_nothing_at_all_is_terminated_outside(local_provider: LocalPodProvider) -> None:
    status = local_provider.status("doesnotexist00")
    assert status.cause is PodCause.TERMINATED_OUTSIDE and status.ended_at is None


@pytest.mark.slow
def test_the_daemon_ends_the_pod_at_its_lease(local_provider: LocalPodProvider) -> None:
    """The local pod's equivalent of RunPod's terminateAfter: created + the dead-man
    lifetime, kept by the daemon itself, so a pod whose flow dies before the watchdog is
    armed still ends."""
    keypair = generate_keypair("lease")
    request = PodRequest(public_key=keypair.public_key, deadman=DeadmanConfig(lifetime_seconds=2.0))
    handle = local_provider.create(request, f"test-lease-{os.getpid()}")
    assert handle.lifetime_seconds == 2.0
    assert handle.terminate_after is not None
    try:
        status = _wait_for(
            lambda: (
                local_provider.status(handle.pod_id).gone and local_provider.status(handle.pod_id)
            ),
            120.0,
        )
        assert status and (status.ended_by, status.ended_layer) == ("lease", "terminateAfter")
        assert status.ended_at is not None and status.ended_at >= handle.terminate_after
    finally:
        local_provider.terminate(handle.pod_id)


@pytest.mark.slow
def test_the_x509_fault_breaks_runpodctl(local_provider: LocalPodProvider) -> None:
    """An image whose runpodctl cannot verify RunPod's certificate (runpodctl#149)."""
    handle, keypair = start_pod(local_provider, env={"PREFECT_RUNPOD_POD_FAULTS": "runpodctl:x509"})
    try:
        out = _type(
            (local_provider, handle, keypair),
            b"runpodctl pod delete $RUNPOD_POD_ID; echo RC=$?-$((40+2))\n",
            b"RC=1-42",
        )
        assert X509_ERROR.encode() in out
        assert local_provider.status(handle.pod_id).cause is PodCause.ALIVE
    finally:
        local_provider.terminate(handle.pod_id)


@pytest.mark.parametrize("name", ["HF_HOME\n", "1ABC", "A B"])
def test_env_names_match_whole(local_provider: LocalPodProvider, name: str) -> None:
    """A trailing newline used to pass ``re.match(...$)`` (issue 14)."""
    request = PodRequest(public_key=generate_keypair("env").public_key, env={name: "x"})
    with pytest.raises(SpecError, match="not a valid name"):
        local_provider.create(request, "test-bad-env")
    assert local_provider.find("test-bad-env") is None


def test_ids_of_any_pod_get_the_workspace_tombstones(tmp_path: Path) -> None:
    """Tombstones live beside the registry, so they outlast the pod directory."""
    provider = LocalPodProvider(home=tmp_path, start_timeout_seconds=120.0)
    handle, _ = start_pod(provider)
    provider.terminate(handle.pod_id)
    assert not (tmp_path / "pods" / handle.pod_id).exists()
    assert (tmp_path / "ended" / f"{handle.pod_id}.json").is_file()
