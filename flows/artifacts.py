"""The run's Prefect artifacts that belong to the whole run (stage artifacts are made by
their own tasks): ``finetune-costs`` (table) and the model links — ``model-checkpoint``
to the verified local download, ``published-model`` to the Hub commit (or the S3 URI)
the pod published (docs/architecture.md#prefect-surface)."""

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
    if report.publish is not None:
        p = report.publish
        rows.append(
            {
                "item": "published_bytes",
                "value": f"{p.bytes} bytes",
                "note": f"from the pod to {p.target} (not through the gateway)",
            }
        )
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
    """Publish a ``model-checkpoint`` link artifact to the downloaded outputs (when the
    whole model was downloaded) and a ``published-model`` link to the Hub commit (or
    the S3 URI) when the pod published it, verified."""
    p = report.publish
    if p is not None and p.verified:
        create_link_artifact(
            link=p.url or p.target,
            link_text=f"{p.target}@{p.revision}" if p.revision else p.target,
            key="published-model",
            description=f"{len(p.files)} files, {p.bytes} bytes, verified at the destination",
        )
    if report.output_dir and report.manifest is not None and report.download_choice == "all":
        create_link_artifact(
            link=f"file://{report.output_dir}/outputs",
            link_text="downloaded checkpoint (verified)",
            key="model-checkpoint",
            description=f"{len(report.manifest.entries)} files, sha256-verified",
        )
