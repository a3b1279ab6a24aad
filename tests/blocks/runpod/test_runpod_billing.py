"""RunPod's own bill beside ours (issue 14): the REST v1 and v2 billing shapes parsed,
and fetched from the emulator's ledger through a configurable REST base URL."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import ProviderAuthError, ProviderTransientError
from prefect_runpod.blocks.provider import PodRequest
from prefect_runpod.blocks.runpod.billing import (
    fetch_pod_bill,
    parse_v1_records,
    parse_v2_records,
    rest_endpoints,
    summarise,
)

V1 = [
    {"time": "2026-04-15T10:00:00Z", "amount": 0.11, "timeBilledMs": 1_800_000, "diskSpaceBilledGb": 20, "podId": "abc", "gpuTypeId": "NVIDIA GeForce RTX 3090"},
    {"time": "2026-04-15T11:00:00Z", "amount": 0.055, "timeBilledMs": 900_000, "diskSpaceBilledGb": 20, "podId": "abc", "gpuTypeId": "NVIDIA GeForce RTX 3090"},
    {"time": "2026-04-15T11:00:00Z", "amount": 9.0, "timeBilledMs": 1, "podId": "other"},
]  # fmt: skip
V2 = {
    "records": [
        {"startTime": "2026-04-15T10:00:00Z", "endTime": "2026-04-15T11:00:00Z", "podId": "abc", "totalAmount": 0.11, "gpuAmount": 0.1, "cpuAmount": 0, "diskAmount": 0.01},
        {"startTime": "2026-04-15T10:00:00Z", "endTime": "2026-04-15T11:00:00Z", "podId": "zzz", "totalAmount": 3.0},
    ],
    "metadata": {"totals": {"totalAmount": 3.11}},
}  # fmt: skip


def test_v1_records_of_one_pod_sum_with_their_billed_time() -> None:
    bill = summarise(parse_v1_records(V1, "abc"), "abc", "v1")
    assert bill.usd == pytest.approx(0.165) and bill.billed_seconds == 2700.0
    assert [r.start for r in bill.records] == [
        datetime(2026, 4, 15, 10, tzinfo=UTC),
        datetime(2026, 4, 15, 11, tzinfo=UTC),
    ]


def test_v2_records_have_no_billed_time() -> None:
    bill = summarise(parse_v2_records(V2, "abc"), "abc", "v2")
    assert bill.usd == pytest.approx(0.11) and bill.billed_seconds is None
    assert bill.records[0].end == datetime(2026, 4, 15, 11, tzinfo=UTC)


@pytest.mark.parametrize("junk", [None, {}, [], "x", [1, "a"], {"records": "x"}])
def test_unexpected_shapes_are_no_records(junk) -> None:  # type: ignore[no-untyped-def]
    assert parse_v1_records(junk, "abc") == [] and parse_v2_records(junk, "abc") == []


def test_the_rest_base_url_is_configurable_beside_the_sdks(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("RUNPOD_REST_BASE_URL", raising=False)
    monkeypatch.delenv("RUNPOD_API_BASE_URL", raising=False)
    assert rest_endpoints() == ("https://rest.runpod.io/v1", "https://api.runpod.io/v2")
    monkeypatch.setenv("RUNPOD_REST_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("RUNPOD_API_BASE_URL", "http://127.0.0.1:8")
    assert rest_endpoints() == ("http://127.0.0.1:9/v1", "http://127.0.0.1:8/v2")
    assert rest_endpoints("http://10.0.0.1/v1")[0] == "http://10.0.0.1/v1"


@pytest.mark.slow
class TestAgainstTheEmulator:
    @pytest.fixture
    def ended_pod(self, runpod_emulator, runpod_blocks, runpod_provider, monkeypatch):  # type: ignore[no-untyped-def]
        monkeypatch.setenv("RUNPOD_REST_BASE_URL", runpod_emulator.rest_base_url)
        provider = runpod_provider()
        handle = provider.create(
            PodRequest(public_key=runpod_blocks[2].get_public_key()), f"prft-{uuid.uuid4()}"
        )
        time.sleep(0.3)
        result = provider.terminate(handle.pod_id)
        return handle, result

    @pytest.mark.parametrize("api", ["v1", "v2", "auto"])
    def test_the_bill_equals_the_ledger(self, runpod_emulator, ended_pod, api) -> None:  # type: ignore[no-untyped-def]
        handle, result = ended_pod
        bill = fetch_pod_bill(
            SecretStr(runpod_emulator.api_key),
            handle.pod_id,
            handle.created_at,
            result.confirmed_at,
            api=api,
        )
        assert bill is not None and bill.api == ("v1" if api == "auto" else api)
        assert bill.usd == pytest.approx(runpod_emulator.ledger.usd(handle.pod_id), abs=1e-8)
        ours = (result.confirmed_at - handle.created_at).total_seconds()
        if bill.billed_seconds is not None:
            assert bill.billed_seconds == pytest.approx(ours, rel=0.01, abs=0.2)

    def test_no_record_while_billing_lags(self, runpod_emulator, ended_pod) -> None:  # type: ignore[no-untyped-def]
        handle, result = ended_pod
        runpod_emulator.ledger.lag_seconds = 3600
        key = SecretStr(runpod_emulator.api_key)
        assert fetch_pod_bill(key, handle.pod_id, handle.created_at, result.confirmed_at) is None

    def test_a_refused_key_and_a_silent_api(self, runpod_emulator, ended_pod, monkeypatch) -> None:  # type: ignore[no-untyped-def]
        handle, result = ended_pod
        with pytest.raises(ProviderAuthError, match="refused the API key"):
            fetch_pod_bill(
                SecretStr("rpa_" + "n" * 24), handle.pod_id, handle.created_at, result.confirmed_at
            )
        from tests.fixtures.prefect_server import free_port

        monkeypatch.setenv("RUNPOD_REST_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")
        monkeypatch.setenv("RUNPOD_API_BASE_URL", f"http://127.0.0.1:{free_port()}")
        with pytest.raises(ProviderTransientError, match="cost RUN_ID --reconcile"):
            fetch_pod_bill(
                SecretStr(runpod_emulator.api_key),
                handle.pod_id,
                handle.created_at,
                result.confirmed_at,
            )
