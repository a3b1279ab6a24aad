"""RunPod's own bill beside ours, from REST v2 only: the v2 shape parsed, the emulator's
ledger answered as the schema says (buckets snapped, ``lastN``), and REST v1 — retired,
410 Gone — never asked, so reconciling keeps working."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import requests
from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import ProviderAuthError, ProviderTransientError
from prefect_runpod.blocks.provider import PodRequest
from prefect_runpod.blocks.runpod.billing import (
    RunPodBill,
    fetch_pod_bill,
    parse_v2_records,
    summarise,
)
from prefect_runpod.blocks.runpod.blocks import RunPodCredentials
from tests.emulators.runpod_api import RunPodEmulator
from tests.fixtures.runpod_emulator import assert_billed_as_the_ledger

V2 = {
    "records": [
        {"startTime": "2026-04-15T10:00:00Z", "endTime": "2026-04-15T11:00:00Z", "podId": "abc", "totalAmount": 0.11, "gpuAmount": 0.1, "cpuAmount": 0, "diskAmount": 0.01},
        {"startTime": "2026-04-15T10:00:00Z", "endTime": "2026-04-15T11:00:00Z", "podId": "zzz", "totalAmount": 3.0},
    ],
    "metadata": {"totals": {"totalAmount": 3.11}},
}  # fmt: skip
POD = "abcdef12345678"
GPU = "NVIDIA GeForce RTX 3090"


def test_v2_records_of_one_pod_with_their_parts() -> None:
    bill = summarise(parse_v2_records(V2, "abc"), "abc", "v2")
    assert bill.usd == pytest.approx(0.11) and bill.billed_seconds is None
    record = bill.records[0]
    assert (record.gpu_usd, record.cpu_usd, record.disk_usd) == (0.1, 0.0, 0.01)
    assert record.end == datetime(2026, 4, 15, 11, tzinfo=UTC)


@pytest.mark.parametrize("junk", [None, {}, [], "x", [1, "a"], {"records": "x"}])
def test_unexpected_shapes_are_no_records(junk) -> None:  # type: ignore[no-untyped-def]
    assert parse_v2_records(junk, "abc") == []


def test_a_bill_an_older_release_fetched_from_v1_still_reads() -> None:
    """Records say ``api: v1`` in run records written before v1's retirement."""
    old = {
        "pod_id": "abc",
        "usd": 0.165,
        "billed_seconds": 2700.0,
        "api": "v1",
        "records": [{"pod_id": "abc", "usd": 0.165, "billed_seconds": 2700.0, "api": "v1"}],
        "fetched_at": "2026-04-15T12:00:00Z",
    }
    bill = RunPodBill.model_validate(old)
    assert (bill.api, bill.billed_seconds, bill.records[0].api) == ("v1", 2700.0, "v1")


def _ledger_pod(emu: RunPodEmulator, start: datetime, end: datetime, usd_per_hr: float = 0.36):
    emu.ledger.open(POD, GPU, usd_per_hr, start.timestamp())
    emu.ledger.close(POD, end.timestamp())


def _billing(emu: RunPodEmulator, **params: object) -> requests.Response:
    return requests.get(
        f"{emu.base_url}/v2/billing/pods",
        params=params,
        headers={"Authorization": f"Bearer {emu.api_key}"},
        timeout=30,
    )


class TestTheEmulatorsLedger:
    """Buckets as RunPod's schema says; no pod needed (a ledger entry stands for one)."""

    def test_a_pod_across_two_hours_is_two_records_snapped_to_the_hour(
        self, runpod_emulator: RunPodEmulator
    ) -> None:
        start = datetime(2026, 12, 1, 10, 40, tzinfo=UTC)
        runpod_emulator.clock = lambda: start.timestamp() + 7200  # type: ignore[method-assign]
        _ledger_pod(runpod_emulator, start, start + timedelta(minutes=40))
        answer = _billing(
            runpod_emulator,
            podId=POD,
            bucketSize="hour",
            startTime="2026-12-01T10:30:00Z",
            endTime="2026-12-01T11:10:00Z",
        ).json()
        query = answer["metadata"]["query"]
        assert (query["startTime"], query["endTime"]) == (
            "2026-12-01T10:00:00Z",
            "2026-12-01T12:00:00Z",
        )
        amounts = [(r["startTime"], r["totalAmount"]) for r in answer["records"]]
        assert amounts == [("2026-12-01T10:00:00Z", 0.12), ("2026-12-01T11:00:00Z", 0.12)]
        assert answer["metadata"]["totals"]["totalAmount"] == pytest.approx(0.24)
        assert (answer["metadata"]["recordCount"], answer["metadata"]["uniquePodCount"]) == (2, 1)

    def test_last_n_buckets_end_with_the_current_one_and_exclude_a_window(
        self, runpod_emulator: RunPodEmulator
    ) -> None:
        now = datetime(2026, 12, 3, 15, 20, tzinfo=UTC)
        runpod_emulator.clock = lambda: now.timestamp()  # type: ignore[method-assign]
        _ledger_pod(runpod_emulator, now - timedelta(days=1, hours=1), now - timedelta(days=1))
        answer = _billing(runpod_emulator, bucketSize="day", lastN=2).json()
        query = answer["metadata"]["query"]
        assert (query["startTime"], query["endTime"]) == (
            "2026-12-02T00:00:00Z",
            "2026-12-04T00:00:00Z",
        )
        assert [r["startTime"] for r in answer["records"]] == ["2026-12-02T00:00:00Z"]
        both = _billing(runpod_emulator, lastN=2, startTime="2026-12-01T00:00:00Z")
        assert both.status_code == 400 and "mutually exclusive" in both.json()["detail"]

    def test_the_client_asks_hour_aligned_so_nothing_widens(
        self, runpod_emulator: RunPodEmulator
    ) -> None:
        start = datetime(2026, 12, 1, 10, 40, tzinfo=UTC)
        runpod_emulator.clock = lambda: start.timestamp() + 7200  # type: ignore[method-assign]
        _ledger_pod(runpod_emulator, start, start + timedelta(minutes=10))
        key = SecretStr(runpod_emulator.api_key)
        bill = fetch_pod_bill(key, POD, start, start + timedelta(minutes=10))
        assert bill is not None and bill.api == "v2" and bill.usd == pytest.approx(0.06)
        asked = [r for r in runpod_emulator.requests if r["operation"] == "listPodBilling"]
        assert len(asked) == 1

    def test_no_record_while_billing_lags(self, runpod_emulator: RunPodEmulator) -> None:
        now = datetime.now(UTC)
        _ledger_pod(runpod_emulator, now - timedelta(minutes=5), now - timedelta(minutes=1))
        runpod_emulator.ledger.lag_seconds = 3600
        key = SecretStr(runpod_emulator.api_key)
        assert fetch_pod_bill(key, POD, now - timedelta(minutes=5), now) is None

    def test_a_refused_key_and_a_silent_api(self, runpod_emulator: RunPodEmulator, monkeypatch):  # type: ignore[no-untyped-def]
        now = datetime.now(UTC)
        with pytest.raises(ProviderAuthError, match="refused the API key"):
            fetch_pod_bill(SecretStr("rpa_" + "n" * 24), POD, now, now)
        from tests.fixtures.prefect_server import free_port

        monkeypatch.setenv("RUNPOD_API_BASE_URL", f"http://127.0.0.1:{free_port()}")
        with pytest.raises(ProviderTransientError, match="cost RUN_ID --reconcile"):
            fetch_pod_bill(SecretStr(runpod_emulator.api_key), POD, now, now)


def test_v1_answering_410_does_not_break_reconciling(
    runpod_emulator: RunPodEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23's example: RunPod's REST v1 answers 410 Gone; a block saved with the old
    ``rest_base_url`` and the old ``RUNPOD_REST_BASE_URL`` both point at it — the bill
    still comes, from v2, and v1 is never asked."""
    from prefect_runpod.blocks.runpod.blocks import RunPodPodSpec
    from prefect_runpod.blocks.runpod.provider import RunPodProvider
    from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey
    from prefect_runpod.flows.run.cost_record import CostRecord
    from prefect_runpod.flows.run.provider_bill import fetch_provider_bill

    gone = requests.get(f"{runpod_emulator.rest_base_url}/billing/pods", timeout=30)
    assert gone.status_code == 410
    before = len(runpod_emulator.requests)
    monkeypatch.setenv("RUNPOD_REST_BASE_URL", runpod_emulator.rest_base_url)
    now = datetime.now(UTC)
    _ledger_pod(runpod_emulator, now - timedelta(minutes=30), now - timedelta(minutes=20))
    with pytest.warns(DeprecationWarning, match="rest_base_url is obsolete"):
        credentials = RunPodCredentials(
            api_key=runpod_emulator.api_key, rest_base_url=runpod_emulator.rest_base_url
        )
    provider = RunPodProvider(credentials, RunPodPodSpec(), RunPodSSHKey.generate())
    record = CostRecord(
        flow_run_id=str(uuid.uuid4()),
        pod_id=POD,
        provider="runpod",
        created_at=now - timedelta(minutes=30),
        usd=0.07,
    )
    with pytest.warns(DeprecationWarning, match="RUNPOD_REST_BASE_URL is obsolete"):
        fetch_provider_bill(provider, record)
    assert record.runpod_usd == pytest.approx(0.06) and record.billing_note.startswith(
        "RunPod REST v2"
    )
    assert record.difference_usd == pytest.approx(0.01)
    paths = [r["path"] for r in runpod_emulator.requests[before:]]
    assert "/v2/billing/pods" in paths and not [p for p in paths if p.startswith("/v1")]


@pytest.mark.slow
@pytest.mark.parametrize("runpod_api", ["graphql", "v2"], indirect=True)
def test_a_real_pods_bill_equals_the_ledger(  # type: ignore[no-untyped-def]
    runpod_emulator, runpod_blocks, runpod_provider
) -> None:
    """Whichever API rents the pod, its bill is REST v2's, to the ledger's 1e-8 USD."""
    provider = runpod_provider()
    handle = provider.create(
        PodRequest(public_key=runpod_blocks[2].get_public_key()), f"prft-{uuid.uuid4()}"
    )
    time.sleep(0.3)  # a pod that lived a while: a bill that is not zero
    result = provider.terminate(handle.pod_id)
    returned = datetime.now(UTC)
    bill = runpod_blocks[0].fetch_pod_bill(handle.pod_id, handle.created_at, result.confirmed_at)
    assert bill is not None and bill.api == "v2"
    assert bill.usd == pytest.approx(runpod_emulator.ledger.usd(handle.pod_id), abs=1e-8)
    # Our create -> confirmed-terminate window sits on the emulator's own record of the
    # pod's life, compared on one clock (an order of events, no tolerance to exceed).
    assert runpod_emulator.ledger.entries[handle.pod_id].ended == (
        runpod_emulator.ended[handle.pod_id].at
    )
    assert_billed_as_the_ledger(
        runpod_emulator, handle.pod_id, handle.created_at, result.confirmed_at, ended_by=returned
    )
