"""The run's cost record as its ``finetune-costs`` table holds it: it reads back whole,
two writers' ends merge into the truthful one, and a pod whose end is not confirmed is
billed until now and says so (#14). Plain functions, no Prefect."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from prefect_runpod.blocks.provider import EndedBy, PodEnd
from prefect_runpod.flows.run.cost_record import CostRecord, merge_end

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def _record(**kw: object) -> CostRecord:
    base: dict[str, object] = {
        "flow_run_id": "0b6e2f0e-5f43-4f7c-9b0e-8d5c1c1b2a3f",
        "pod_id": "50qynxzilsxoey",
        "pod_name": "prefect-runpod-0b6e2f0e",
        "provider": "runpod",
        "cost_per_hr": 0.22,
        "created_at": T0,
    }
    base.update(kw)
    return CostRecord(**base)  # type: ignore[arg-type]


def test_a_record_reads_back_whole_from_its_table() -> None:
    end = PodEnd(
        pod_id="50qynxzilsxoey",
        ended_by=EndedBy.DEADMAN,
        confirmed=True,
        ended_at=T0 + timedelta(seconds=90),
        layer="podTerminate with the pod's key",
        cause="host_lost",
        detail="runpodctl failed (x509)",
    )
    record = _record(
        end=end,
        runpod_usd=0.0055,
        runpod_billed_seconds=90.0,
        published_bytes=12_345,
        published_to="hf:demo/tiny-classifier",
        stage_seconds={"train": 41.5},
        recorded_by="reaper",
    )
    record.settle()
    back = CostRecord.from_rows(record.to_rows())
    assert back.model_dump(exclude={"recorded_at", "end"}) == record.model_dump(
        exclude={"recorded_at", "end"}
    )
    assert back.end is not None
    assert back.end.model_dump(exclude={"recorded_at"}) == end.model_dump(exclude={"recorded_at"})
    assert back.published_bytes == 12_345 and back.published_to == "hf:demo/tiny-classifier"
    # The end keeps when it was recorded, not when it was read back.
    assert back.end.recorded_at == record.recorded_at
    assert CostRecord.from_rows(record.to_rows()).end.recorded_at == record.recorded_at


def test_a_run_that_did_not_publish_reads_back_without_published_bytes() -> None:
    back = CostRecord.from_rows(_record().to_rows())
    assert back.published_bytes is None and back.published_to == ""


def test_a_record_an_older_release_wrote_with_its_lease_still_reads() -> None:
    """Records written before the lease was dropped carry a ``lease`` column and may say
    a pod was ended by ``lease``: both still read (the column is ignored)."""
    end = PodEnd(pod_id="50qynxzilsxoey", ended_by=EndedBy.LEASE, confirmed=True,
                 ended_at=T0 + timedelta(seconds=60), layer="terminateAfter")  # fmt: skip
    rows = _record(end=end).to_rows()
    assert "lease" not in rows[0]
    rows[0]["lease"] = "terminateAfter 2026-12-01T12:01:00Z"
    back = CostRecord.from_rows(rows)
    assert back.end is not None and back.end.ended_by is EndedBy.LEASE
    assert "lease" not in back.model_dump() and back.state_line().startswith("ended by lease")


def test_a_pod_whose_end_is_not_confirmed_bills_until_now_and_says_how_to_end_it() -> None:
    record = _record(end=PodEnd(pod_id="50qynxzilsxoey", ended_by=EndedBy.FLOW, confirmed=False))
    record.settle(now=T0 + timedelta(hours=1))
    assert record.may_still_bill
    assert record.billed_seconds == 3600.0 and record.usd == 0.22
    assert record.state_line() == (
        "pod 50qynxzilsxoey may still be billing: end it with "
        "`prefect-runpod terminate --provider runpod 50qynxzilsxoey`"
    )


def test_a_lost_pod_is_billed_until_its_confirmed_end_not_until_the_run_gave_up() -> None:
    end = PodEnd(
        pod_id="50qynxzilsxoey",
        ended_by=EndedBy.CLI,
        confirmed=True,
        ended_at=T0 + timedelta(seconds=24),
    )
    record = _record(end=end, runpod_usd=0.0015)
    record.settle(now=T0 + timedelta(seconds=629.9))
    assert record.billed_seconds == 24.0
    assert record.usd == pytest.approx(0.22 * 24 / 3600, abs=1e-8)
    assert record.difference_usd == pytest.approx(0.22 * 24 / 3600 - 0.0015, abs=1e-8)
    assert not record.may_still_bill


def test_a_confirmed_end_wins_over_an_unconfirmed_one_whichever_comes_first() -> None:
    unconfirmed = PodEnd(pod_id="p", ended_by=EndedBy.FLOW, confirmed=False)
    confirmed = PodEnd(pod_id="p", ended_by=EndedBy.REAPER, confirmed=True, ended_at=T0)
    assert merge_end(unconfirmed, confirmed) == confirmed
    assert merge_end(confirmed, unconfirmed) == confirmed


def test_two_confirmed_ends_keep_the_earlier_time_and_the_writer_that_knows_who() -> None:
    outside = PodEnd(
        pod_id="p",
        ended_by=EndedBy.OUTSIDE,
        confirmed=True,
        ended_at=T0,
        cause="terminated_outside",
    )
    cli = PodEnd(
        pod_id="p", ended_by=EndedBy.CLI, confirmed=True, ended_at=T0 + timedelta(seconds=5)
    )
    merged = merge_end(outside, cli)
    assert merged is not None
    assert (merged.ended_by, merged.ended_at, merged.cause) == (
        EndedBy.CLI,
        T0,
        "terminated_outside",
    )


def test_the_table_is_one_row_whose_numbers_are_numbers_with_units_in_the_headers() -> None:
    """The UI sorts a table by its columns: one row per run, numeric facts as numbers
    (never "0.04 s" strings), the unit in each column's name (#16)."""
    record = _record(runpod_usd=0.0055, published_bytes=12_345, stage_seconds={"train": 41.5})
    record.settle(now=T0 + timedelta(seconds=90))
    (row,) = record.to_rows()
    numeric = {
        "cost_per_hr_usd_per_h": 0.22,
        "billed_s": 90.0,
        "usd": record.usd,
        "runpod_usd": 0.0055,
        "difference_usd": record.difference_usd,
        "published_bytes": 12_345,
        "stage_train_s": 41.5,
    }
    for column, value in numeric.items():
        assert isinstance(row[column], int | float) and not isinstance(row[column], bool)
        assert row[column] == value, column
    assert row["runpod_billed_s"] is None and row["max_cost_usd"] is None  # unknown: null
    assert row["created_at_utc"] == T0.isoformat() and row["end_confirmed"] is False
    assert not any(isinstance(v, str) and v.endswith((" s", " USD")) for v in row.values())


def test_a_table_that_is_not_one_cost_row_is_refused() -> None:
    with pytest.raises(ValueError, match="not a cost record"):
        CostRecord.from_rows([{"item": "flow_run_id", "value": "x"}])
    with pytest.raises(ValueError, match="not a cost record"):
        CostRecord.from_rows(_record().to_rows() * 2)
