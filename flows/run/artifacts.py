"""The run's Prefect artifacts that belong to the whole run (stage artifacts are made by
their own tasks): the model links — ``model-checkpoint`` to the verified local download,
``published-model`` to the Hub commit (or the S3 URI) the pod published
(docs/architecture.md#prefect-surface). The ``finetune-costs`` record is
``flows/run/cost_record.py``'s. Both are held through an outage of the Prefect API
(``blocks.api_outbox``)."""

from __future__ import annotations

from prefect_runpod.blocks.held_artifacts import hold_artifact
from prefect_runpod.flows.run.report import RunReport

__all__ = ["publish_model_link"]


def publish_model_link(report: RunReport) -> None:
    """Publish the checkpoint's link artifacts: ``published-model`` and
    ``model-checkpoint`` to the Hub commit (or the S3 URI) when the pod published it,
    verified; else ``model-checkpoint`` to the downloaded outputs (when the whole model
    was downloaded)."""
    p = report.publish
    if p is not None and p.verified:
        for key in ("published-model", "model-checkpoint"):
            text = f"{p.target}@{p.revision}" if p.revision else p.target
            hold_artifact(
                key,
                "markdown",
                _link(p.url or p.target, text),
                f"{len(p.files)} files, {p.bytes} bytes, verified at the destination",
            )
        return
    if report.output_dir and report.manifest is not None and report.download_choice == "all":
        hold_artifact(
            "model-checkpoint",
            "markdown",
            _link(f"file://{report.output_dir}/outputs", "downloaded checkpoint (verified)"),
            f"{len(report.manifest.entries)} files, sha256-verified",
        )


def _link(url: str, text: str) -> str:
    """A link artifact's data, as Prefect's ``create_link_artifact`` writes it."""
    return f"[{text}]({url})"
