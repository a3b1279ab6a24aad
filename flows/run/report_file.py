"""``<output_dir>/run-report.json`` seen from outside the run (a hook, the reaper,
``prefect-runpod cost --reconcile``): the confirmed pod ends it keeps taken into a cost
record (the run wrote them there when the Prefect API could not take its record), and the
report brought in line with a record once it is complete
(docs/architecture.md#what-a-run-cost), or with what ``prefect-runpod fetch`` brought home
from a kept pod."""

from __future__ import annotations

import json
from pathlib import Path

from prefect_runpod.flows.run.cost_record import CostRecord, merge_end
from prefect_runpod.flows.run.report import RunReport
from prefect_runpod.tasks.models import TransferReport

__all__ = ["merge_report_ends", "record_fetch", "rewrite_report"]


def merge_report_ends(record: CostRecord) -> bool:
    """Take into ``record`` the pod ends ``<output_dir>/run-report.json`` confirms (the
    run wrote them there when the Prefect API could not take its record), pod by pod
    (``merge_end``: a confirmed end wins over an unconfirmed one); True when one was
    taken. A report that cannot be read, or is another run's, changes nothing."""
    report = _load(record.output_dir, record.flow_run_id)
    if report is None:
        return False
    taken = False
    for attempt in record.attempts:
        seen = next((a for a in report.attempts if a.pod_id and a.pod_id == attempt.pod_id), None)
        if seen is None or seen.end is None or not seen.end.confirmed or attempt.confirmed:
            continue
        attempt.end = merge_end(attempt.end, seen.end)
        taken = True
    if taken:
        record.settle()
    return taken


def rewrite_report(record: CostRecord) -> bool:
    """Bring ``<output_dir>/run-report.json`` in line with ``record`` when it can be
    reached from here; True when it was rewritten."""
    report = _load(record.output_dir, record.flow_run_id)
    if report is None:
        return False
    report.apply_cost_record(record)
    return _save(report, record.output_dir)


def record_fetch(output_dir: str, flow_run_id: str, fetched: TransferReport) -> bool:
    """Bring ``<output_dir>/run-report.json`` in line with a verified ``prefect-runpod
    fetch`` of the run's kept pod: the download's ``left_on_pod`` becomes what still
    stayed there, the manifest the one now matched here, and the local verification
    record counts the folder as it is now (what else it holds named as ``extra``). True
    when rewritten; an unverified fetch changes nothing."""
    from prefect_runpod.tasks.checksum import extra_entries, verification_records

    report = _load(output_dir, flow_run_id)
    source = fetched.source_manifest
    if report is None or not fetched.verified or source is None or report.download is None:
        return False
    left = dict(fetched.left_on_pod)
    report.download = report.download.model_copy(
        update={"left_on_pod": left, "left_in": fetched.left_in if left else ""}
    )
    report.manifest = source
    local = Path(output_dir) / "outputs"
    here = verification_records(local, fetched.dest_manifest, None, extra_entries(local, source))
    for record in here:
        record.how += " (after `prefect-runpod fetch`)"
    places = {record.where for record in here}  # the download's; a publish's stay
    report.verified = here + [v for v in report.verified if v.where not in places]
    return _save(report, output_dir)


def _load(output_dir: str | None, flow_run_id: str) -> RunReport | None:
    """The run's report from ``<output_dir>/run-report.json``; None when it cannot be
    read or is another run's."""
    if not output_dir:
        return None
    try:
        report = RunReport.model_validate_json((Path(output_dir) / "run-report.json").read_text())
    except (OSError, ValueError):
        return None
    if report.flow_run_id and report.flow_run_id != flow_run_id:
        return None
    return report


def _save(report: RunReport, output_dir: str | None) -> bool:
    try:
        (Path(str(output_dir)) / "run-report.json").write_text(
            json.dumps(report.to_json_dict(), indent=2)
        )
    except OSError:
        return False
    return True
