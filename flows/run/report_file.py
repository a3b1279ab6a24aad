"""``<output_dir>/run-report.json`` seen from outside the run (a hook, the reaper,
``prefect-runpod cost --reconcile``): the confirmed pod ends it keeps taken into a cost
record (the run wrote them there when the Prefect API could not take its record), and the
report brought in line with a record once it is complete
(docs/architecture.md#what-a-run-cost)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect_runpod.flows.run.cost_record import CostRecord, merge_end
from prefect_runpod.flows.run.report import RunReport

__all__ = ["merge_report_ends", "rewrite_report"]


def merge_report_ends(record: CostRecord) -> bool:
    """Take into ``record`` the pod ends ``<output_dir>/run-report.json`` confirms (the
    run wrote them there when the Prefect API could not take its record), pod by pod
    (``merge_end``: a confirmed end wins over an unconfirmed one); True when one was
    taken. A report that cannot be read, or is another run's, changes nothing."""
    if not record.output_dir:
        return False
    try:
        report = RunReport.model_validate_json(
            (Path(record.output_dir) / "run-report.json").read_text()
        )
    except (OSError, ValueError):
        return False
    if report.flow_run_id != record.flow_run_id:
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
    if not record.output_dir:
        return False
    path = Path(record.output_dir) / "run-report.json"
    try:
        report = RunReport.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return False
    if report.flow_run_id and report.flow_run_id != record.flow_run_id:
        return False
    report.apply_cost_record(record)
    try:
        path.write_text(json.dumps(report.to_json_dict(), indent=2))
    except OSError:
        return False
    return True
