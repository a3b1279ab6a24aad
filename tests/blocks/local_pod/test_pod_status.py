"""What a local pod's provider says about a pod now (``LocalPodProvider.status``), the
tombstone an ended pod leaves, what an older release's lease left behind, and the
``runpodctl`` stand-in's verbs and faults (issue 14)."""

from __future__ import annotations

import json
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
from prefect_runpod.blocks.provider import PodCause, PodRequest
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


def test_a_pod_keeps_no_deadline_of_its_own(tmp_path: Path) -> None:
    """RunPod never ends a pod on a deadline (its ``terminateAfter`` never fired), so the
    local pod does not either: its config and registry entry carry no lease, and those an
    older release wrote, with one, still load (the key is ignored)."""
    from dataclasses import fields

    from prefect_runpod.blocks.local_pod.daemon import PodConfig
    from prefect_runpod.blocks.local_pod.registry import PodRecord

    assert "terminate_after" not in {f.name for f in fields(PodConfig)}
    assert "terminate_after" not in {f.name for f in fields(PodRecord)}
    old = {
        "pod_id": "oldpod00000000", "name": "prft-old", "mode": "gateway",
        "user": "oldpod00000000-0a1b2c3d", "pod_host_id": "oldpod00000000-0a1b2c3d",
        "host_key": "ssh-ed25519 AAAA", "public_key": "ssh-ed25519 BBBB",
        "cost_per_hr": 0.0, "gpu_type": "cpu", "created_at": "2026-11-30T10:00:00+00:00",
        "lifetime_seconds": 60.0, "terminate_after": "2026-11-30T10:01:00+00:00",
    }  # fmt: skip
    (tmp_path / "pod.json").write_text(json.dumps(old))
    config = PodConfig.load(tmp_path / "pod.json")
    assert (config.pod_id, config.lifetime_seconds) == ("oldpod00000000", 60.0)
    registry = tmp_path / "registry"
    registry.mkdir()
    entry = {k: v for k, v in old.items() if k != "public_key"}
    entry.update(pid=os.getpid(), port=1, workdir=str(tmp_path))
    (registry / "oldpod00000000.json").write_text(json.dumps(entry))
    record = read_record(tmp_path, "oldpod00000000")
    assert record is not None and record.lifetime_seconds == 60.0


def test_a_tombstone_an_older_lease_left_still_reads(tmp_path: Path) -> None:
    """An older release's daemon ended pods at their lease and said so (``by: lease``):
    the status still reads it, naming who."""
    from prefect_runpod.blocks.local_pod.registry import PodTombstone, write_tombstone

    write_tombstone(
        tmp_path,
        PodTombstone(
            pod_id="oldpod00000001", name="prft-old", created_at="2026-11-30T10:00:00+00:00",
            ended_at="2026-11-30T10:01:00+00:00", by="lease", layer="terminateAfter",
        ),
    )  # fmt: skip
    status = LocalPodProvider(home=tmp_path).status("oldpod00000001")
    assert status.cause is PodCause.TERMINATED_OUTSIDE and status.ended_by == "lease"
    assert "lease" in status.provider_status
    assert status.ended_at == datetime(2026, 11, 30, 10, 1, tzinfo=UTC)


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
