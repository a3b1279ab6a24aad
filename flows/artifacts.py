"""The run's Prefect artifacts that belong to the whole run (stage artifacts are made by
their own tasks): ``finetune-costs`` (table) and the model link (docs/architecture.md#prefect-surface)."""

from __future__ import annotations

from prefect.artifacts import create_link_artifact, create_table_artifact

from prefect_runpod.flows.report import RunReport

__all__ = ["publish_cost_artifact", "publish_model_link"]


def publish_cost_artifact(report: RunReport) -> None:
    """Publish the ``finetune-costs`` table: one row per stage (seconds) and the totals
    (USD/h, billed seconds, USD, budget)."""
    c = report.cost
    rows: list[dict[str, object]] = [
        {"item": f"stage {s.name}", "value": f"{s.seconds:.2f} s", "note": s.state.value}
        for s in report.stages
    ]
    rows += [
        {"item": "pod", "value": report.pod_id or "-", "note": report.provider},
        {"item": "cost_per_hr", "value": f"{c.cost_per_hr:.4f} USD/h", "note": ""},
        {
            "item": "billed_seconds",
            "value": f"{c.billed_seconds:.1f} s",
            "note": "create → terminate confirmed"
            if report.terminated
            else "pod NOT confirmed gone",
        },
        {"item": "usd", "value": f"{c.usd:.6f} USD", "note": ""},
        {
            "item": "max_cost_usd",
            "value": "-" if c.max_cost_usd is None else f"{c.max_cost_usd:.4f} USD",
            "note": "",
        },
    ]
    create_table_artifact(
        table=rows,
        key="finetune-costs",
        description=f"Cost of run {report.flow_run_id} on pod {report.pod_id or '-'}",
    )


def publish_model_link(report: RunReport) -> None:
    """Publish a ``model-checkpoint`` link artifact to the downloaded outputs."""
    if report.output_dir and report.manifest is not None:
        create_link_artifact(
            link=f"file://{report.output_dir}/outputs",
            link_text="downloaded checkpoint (verified)",
            key="model-checkpoint",
            description=f"{len(report.manifest.entries)} files, sha256-verified",
        )
