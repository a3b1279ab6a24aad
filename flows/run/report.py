"""The RunReport: everything one fine-tune run did, as one JSON document (docs/architecture.md#data-that-moves).

It is the flow's persisted result and the CLI's ``--json`` output; another pipeline
reads it through ``run_deployment(...).state.result()`` without our classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import OWN_LAYERS, Capability, PodEnd, end_command
from prefect_runpod.blocks.provider_registry import provider_class, provider_supports
from prefect_runpod.blocks.secret_mask import redact, redact_data
from prefect_runpod.blocks.sizes import human_bytes
from prefect_runpod.blocks.validation.parameters import DEFAULT_PROVIDER
from prefect_runpod.flows.run.attempts import (
    AttemptField,
    LastAttemptView,
    PodAttempt,
    attempt_line,
)
from prefect_runpod.flows.run.checkpoints import CheckpointRecord
from prefect_runpod.flows.run.kept import fetch_command
from prefect_runpod.tasks.models import (
    STAGES,
    CostReport,
    EnvPlan,
    HFDiagnosis,
    Manifest,
    ParityReport,
    PublishReport,
    StageRecord,
    StageState,
    TrainReport,
    TransferReport,
    VerificationRecord,
)

if TYPE_CHECKING:
    from prefect_runpod.flows.run.cost_record import CostRecord

__all__ = ["RunReport", "render_summary"]


class RunReport(LastAttemptView):
    """One run, stage by stage, pod attempt by pod attempt.

    Attributes:
        flow_run_id: the Prefect flow run id ("" outside a run).
        pod_name: ``<prefix>-<flow_run_id>``.
        provider: the provider's name (``local``, ``runpod``…).
        flow_run_url: the run's page in the Prefect UI, when a UI address is known.
        stages: one record per stage, in stage order (preflight first); a stage that ran
            in more than one attempt keeps its latest run here.
        earlier_stages: the runs of stages that ran again in a later attempt, oldest first.
        attempts: every pod the run rented (``PodAttempt``), in order.
        provision_attempts: every create attempt (GPU type/cloud → outcome).
        cost: the cost record's figures (USD/h, billed seconds, USD, the provider's bill).
        env / hf / upload / train / parity / publish / download: the stage records.
        manifest: the verified manifest of the downloaded outputs (None when nothing
            was downloaded).
        verified: each place the outputs were verified (local download, Hub, S3).
        download_choice: ``all``, ``eval`` or ``none`` (``--download``).
        output_dir: where the downloaded outputs and this report lie locally.
        error: the first failure, one line, when the run failed.
        checkpoints: each checkpoint copied off a pod and verified here, in order
            (``CheckpointRecord``: step, bytes sent, the copy's lag).
        carried_from: the run this one continues (``--resume-from RUN_ID``): its pods
            are this run's first attempts, carried (see ``CostRecord``); else None.
        continued_by: the run that continued this one, once one did.

    Views of the last attempt (``PodAttempt``): ``pod_id``, ``pod`` (its handle),
    ``pod_end`` and ``ssh_command``; and ``terminated``: True only when the
    provider confirmed every pod of the run gone (the same as its ``finetune-costs``
    record).
    """

    pod_id = AttemptField[str | None]("pod_id", None)
    pod = AttemptField[PodHandle | None]("handle", None)
    pod_end = AttemptField[PodEnd | None]("end", None)
    ssh_command = AttemptField[str | None]("ssh_command", None)

    flow_run_id: str = ""
    pod_name: str = ""
    provider: str = DEFAULT_PROVIDER
    flow_run_url: str | None = None
    stages: list[StageRecord] = Field(
        default_factory=lambda: [StageRecord(name=n) for n in ("preflight", *STAGES)]
    )
    earlier_stages: list[StageRecord] = Field(default_factory=list)
    provision_attempts: list[str] = Field(default_factory=list)
    cost: CostReport = Field(default_factory=CostReport)
    env: EnvPlan | None = None
    hf: list[HFDiagnosis] = Field(default_factory=list)
    upload: TransferReport | None = None
    train: TrainReport | None = None
    parity: ParityReport | None = None
    publish: PublishReport | None = None
    download: TransferReport | None = None
    manifest: Manifest | None = None
    verified: list[VerificationRecord] = Field(default_factory=list)
    download_choice: str = "all"
    output_dir: str | None = None
    error: str | None = None
    checkpoints: list[CheckpointRecord] = Field(default_factory=list)
    carried_from: str | None = None
    continued_by: str | None = None

    @classmethod
    def _run_fields(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A report written before attempts: its pod's name, provider and handle's
        figures, and ``terminated`` as a confirmed end when it names no end."""
        handle = data.get("pod")
        if isinstance(handle, dict):
            handle = PodHandle.model_validate(handle)
        fields: dict[str, Any] = {
            "pod_name": data.get("pod_name") or "",
            "provider": data.get("provider") or DEFAULT_PROVIDER,
        }
        if handle is not None:
            fields |= {
                "gpu_type": handle.gpu_type,
                "cost_per_hr": handle.cost_per_hr,
                "created_at": handle.created_at,
            }
        if data.get("terminated") and not data.get("pod_end") and data.get("pod_id"):
            fields["end"] = PodEnd(pod_id=data["pod_id"], confirmed=True)
        return fields

    def _first_attempt(self) -> dict[str, Any]:
        return {"pod_name": self.pod_name, "provider": self.provider}

    @property
    def terminated(self) -> bool:
        """True only when the provider confirmed every pod of the run gone."""
        pods = [a for a in self.attempts if a.pod_id is not None]
        return bool(pods) and all(a.confirmed for a in pods)

    def stage(self, name: str) -> StageRecord:
        """The record of stage ``name``. Raises KeyError for an unknown stage."""
        for record in self.stages:
            if record.name == name:
                return record
        raise KeyError(name)

    @property
    def stopped_short(self) -> bool:
        """True when a stage failed or was cancelled (what ``keep_pod_on_failure`` keeps
        the pod for)."""
        return any(s.state in (StageState.FAILED, StageState.CANCELLED) for s in self.stages)

    @property
    def passed(self) -> bool:
        """True when every stage passed (Skipped with a reason counts) and the pod is
        confirmed terminated (or none was ever created)."""
        pod_gone = self.terminated or self.pod_id is None
        return pod_gone and all(s.passed for s in self.stages)

    @property
    def model_location(self) -> str | None:
        """Where the trained model is once the run ends: the verified publish
        destination (``hf://ORG/REPO@<revision>`` or the S3 URI), else the verified local
        download, else None."""
        if self.publish is not None and self.publish.verified:
            if self.publish.revision:
                return f"{self.publish.target}@{self.publish.revision}"
            return self.publish.target
        if self.manifest is not None and self.output_dir and self.download_choice == "all":
            return f"{self.output_dir}/outputs"
        return None

    def to_json_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (datetimes as ISO strings), every string redacted
        (``blocks.secret_mask``): it becomes ``run-report.json`` and the flow's result."""
        data = self.model_dump(mode="json")
        data["terminated"] = self.terminated
        data["passed"] = self.passed
        data["model_location"] = self.model_location
        return redact_data(data)

    def apply_cost_record(self, record: CostRecord) -> None:
        """Take each pod's end and cost from the run's ``finetune-costs`` record (the
        record of truth), attempt by attempt, so report and record agree; the handle,
        ssh command and ready time the report alone knows stay."""
        for kept in record.attempts:
            mine = self.attempt(kept.number)
            if mine is None:
                self.attempts.append(kept.model_copy())
                continue
            for name in PodAttempt.model_fields.keys() - {"handle", "ssh_command", "ready_at"}:
                setattr(mine, name, getattr(kept, name))
        c = self.cost  # the run's figures: every pod's time and USD, the last pod's price
        c.cost_per_hr, c.billed_seconds, c.usd = (
            record.cost_per_hr,
            record.total_billed_seconds,
            record.total_usd,
        )
        c.runpod_usd, c.runpod_billed_seconds = record.runpod_usd, record.runpod_billed_seconds
        c.difference_usd, c.billing_note = record.difference_usd, record.billing_note
        self.carried_from = self.carried_from or record.carried_from
        self.continued_by = record.continued_by or self.continued_by

    def end_line(self) -> str:
        """What happened to the pod, in one line: confirmed gone (by whom, when, how), or
        ``NO: may still be billing`` with the command that ends it."""
        if self.pod_id is None:
            return "no pod was created"
        end = self.pod_end
        if not self.terminated or end is None or not end.confirmed:
            why = "kept on purpose, billing" if end and end.detail.startswith("kept") else None
            return (
                f"NO: {why or 'may still be billing'}; end it with "
                f"`{end_command(self.provider, self.pod_id)}`"
            )
        at = end.ended_at.strftime("%H:%M:%S UTC") if end.ended_at else "?"
        cause = {
            "terminated_outside": "terminated outside this run",
            "exited": "exited",
            "host_lost": "host lost",
        }.get(end.cause or "", "")
        if end.cause == "terminated_outside" and end.ended_by.value in OWN_LAYERS:
            # one of the product's own layers ended it, not someone outside the run
            own = OWN_LAYERS[end.ended_by.value].split(" (")[0]
            how = f" ({end.layer})" if end.layer else ""
            return f"gone: ended by {own}{how} at {at}, confirmed"
        lead = f"gone: {cause}, " if cause else "yes, "
        how = f" ({end.layer})" if end.layer else ""
        return f"{lead}ended by {end.ended_by.value}{how} at {at}, confirmed"


def _attempt_lines(report: RunReport) -> list[str]:
    """A line per pod attempt when the run had more than one, and the checkpoints the
    run copied off its pods (how many, the newest, the copy's lag)."""
    lines = []
    for a in report.attempts if len(report.attempts) > 1 else []:
        lines.append(f"attempt {a.number:<4} {attempt_line(a)}")
    if report.checkpoints:
        lags = [c.lag_seconds for c in report.checkpoints]
        sent = sum(c.sent_bytes for c in report.checkpoints)
        lines.append(
            f"checkpoints  {len(lags)} verified off the pod, newest {report.checkpoints[-1].name};"
            f" copy lag max {max(lags):.1f} s, mean {sum(lags) / len(lags):.1f} s;"
            f" {human_bytes(sent)} sent"
        )
    return lines


def render_summary(report: RunReport) -> str:
    """A readable, fixed-width summary for the terminal: the error line first when the run
    failed; stage, state, seconds; the pod (and, while it still lives, the ssh line that
    gets into it); bytes moved; manifest verified; parity
    verdict; cost (``nothing billed`` when no pod was created); the result last."""
    lines = [f"error        {report.error}", ""] if report.error else []
    lines.append(f"{'stage':<12} {'state':<10} {'seconds':>8}  note")
    for s in report.stages:
        note = s.reason or ""
        lines.append(f"{s.name:<12} {s.state.value:<10} {s.seconds:>8.2f}  {note}")
    lines.append("")
    lines.append(f"pod          {report.pod_id or '-'} ({report.provider}, {report.pod_name})")
    lines.append(f"terminated   {report.end_line()}")
    if report.pod_id and report.ssh_command and not report.terminated:
        lines.append(f"get in with  {report.ssh_command}")  # the pod still lives
    lines.extend(_attempt_lines(report))
    moved = sum(t.bytes for t in (report.upload, report.download) if t is not None)
    lines.append(f"bytes moved  {human_bytes(moved)} between this machine and the pod")
    moves = [(n, t) for n, t in (("upload", report.upload), ("download", report.download)) if t]
    if moves:
        lines.append(
            "transfer     "
            + ", ".join(
                f"{n} by {t.method} ({human_bytes(t.bytes)}, {t.seconds:.1f} s)" for n, t in moves
            )
        )
    if report.publish is not None:
        sent = report.publish
        lines.append(
            f"published    {human_bytes(sent.bytes)} from the pod to {sent.target} in "
            f"{sent.seconds:.1f} s ({len(sent.files)} files, {sent.attempts} attempt(s))"
        )
    verified = (
        report.manifest is not None and report.download is not None and report.download.verified
    )
    nfiles = len(report.manifest.files) if report.manifest else 0
    shape = len(report.manifest.entries) - nfiles if report.manifest else 0
    if report.manifest is not None or report.download_choice == "all":
        more = f", {shape} dirs/links" if shape else ""
        lines.append(
            f"manifest     {'verified' if verified else 'NOT verified'} ({nfiles} files{more})"
        )
    for place in report.verified:
        extra = ""
        if place.extra:
            shown = ", ".join(place.extra[:5]) + (" …" if len(place.extra) > 5 else "")
            extra = f"; {len(place.extra)} more there not from this run: {shown}"
        lines.append(
            f"verified     {place.where}: {place.files} files at {place.location}"
            f"{'' if place.verified else ' - MISMATCH'}{extra}"
        )
    left = report.download.left_on_pod if report.download is not None else {}
    if left:
        listed = "; ".join(f"{path} ({why})" for path, why in list(left.items())[:5])
        more = f"; and {len(left) - 5} more" if len(left) > 5 else ""
        lines.append(f"left on pod  {len(left)} could not travel: {listed}{more}")
        lines.append(f"fetch with   {fetch_command(report.flow_run_id)}")
    where = report.model_location
    if where:
        url = f" ({report.publish.url})" if report.publish and report.publish.url != where else ""
        lines.append(f"model at     {where}{url}")
    elif report.download_choice != "all":
        lines.append(f"model at     nowhere verified (--download {report.download_choice})")
    if report.parity is not None:
        p = report.parity
        lines.append(
            f"eval parity  {p.verdict} (in-training {p.accuracy_train:.3f} vs standalone "
            f"{p.accuracy_eval:.3f}, gap {p.accuracy_gap:.3f}, tolerance {p.tolerance})"
        )
    c = report.cost
    if report.pod_id is None:
        lines.append(f"cost         {c.usd:.6f} USD (no pod was created: nothing billed)")
    else:
        until = "confirmed end" if report.terminated else "now, may still be billing"
        carried = [a for a in report.attempts if a.carried_from]
        over = (
            f"; the sum over all {len(report.attempts)} attempts, the {len(carried)} carried "
            f"from run {report.carried_from} included"
            if carried
            else ""
        )
        lines.append(
            f"cost         {c.usd:.6f} USD ({c.cost_per_hr:.2f} USD/h x "
            f"{c.billed_seconds:.1f} s billed, create -> {until}{over})"
        )
    if report.pod_id and provider_supports(report.provider, Capability.BILL):
        bill = f"{report.provider} bill"
        if c.runpod_usd is not None:
            diff = c.difference_usd if c.difference_usd is not None else 0.0
            theirs = provider_class(report.provider).display_name
            lines.append(f"{bill:<12} {c.runpod_usd:.6f} USD (ours - {theirs}'s: {diff:+.6f})")
        else:
            lines.append(f"{bill:<12} not known yet: {c.billing_note or 'not asked'}")
    if report.output_dir:
        lines.append(f"outputs      {report.output_dir}")
    lines.append(
        f"flow run     {report.flow_run_url or report.flow_run_id + ' (no UI address known)'}"
    )
    lines.append(f"result       {'PASSED' if report.passed else 'FAILED'}")
    return redact("\n".join(lines))
