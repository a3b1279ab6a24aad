"""Stage records shared by several stages (docs/architecture.md#data-that-moves).

Plain pydantic models: JSON-serialisable, safe to persist as Prefect results, and
readable by another pipeline without our classes. Units are in the field names.
Later work may add fields; it never renames or removes one.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

# Transfer records live with the transfer code in blocks/ (blocks never import tasks/).
from prefect_runpod.blocks.publish.base import PublishTarget
from prefect_runpod.blocks.transfer.models import Manifest, ManifestEntry, TransferReport

__all__ = [
    "STAGES",
    "CostReport",
    "EnvPlan",
    "EnvReport",
    "HFCause",
    "HFDiagnosis",
    "Manifest",
    "ManifestEntry",
    "ParityRecordDiff",
    "ParityReport",
    "PublishReport",
    "PublishTarget",
    "PublishedFile",
    "PythonProbe",
    "StageRecord",
    "StageState",
    "TrainReport",
    "TransferReport",
    "VerificationRecord",
]

STAGES: tuple[str, ...] = (
    "provision",
    "env",
    "hf_auth",
    "upload",
    "train",
    "eval_parity",
    "publish",
    "download",
    "checksum",
    "terminate",
)
"""The stage names, in run order; used everywhere (RunReport, artifacts, logs, CLI)."""


class StageState(StrEnum):
    """A stage's outcome. ``Skipped`` counts as passed but always carries a reason."""

    PENDING = "Pending"
    RUNNING = "Running"
    COMPLETED = "Completed"
    SKIPPED = "Skipped"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class StageRecord(BaseModel):
    """One stage of a run: name, state, start/end (UTC), seconds, a reason when Skipped
    or Failed, and the pod attempt it ran in (``attempt``: 1 for the first pod; None for
    a stage of the run itself, ``preflight``). A stage runs once per attempt."""

    name: str
    state: StageState = StageState.PENDING
    started_at: datetime | None = None
    ended_at: datetime | None = None
    seconds: float = 0.0
    reason: str | None = None
    attempt: int | None = None

    @property
    def passed(self) -> bool:
        """True for Completed, or Skipped with a recorded reason."""
        return self.state == StageState.COMPLETED or (
            self.state == StageState.SKIPPED and bool(self.reason)
        )


class PythonProbe(BaseModel):
    """One Python interpreter found on the pod and what it can import.

    Attributes:
        in_venv: the interpreter is a virtualenv's (``sys.prefix != sys.base_prefix``).
        site_packages: its site-packages folders (``site.getsitepackages()``), so a pod
            venv made from it can inherit them.
        imports: distribution → version for every package the probe was asked to
            import (``--require``), None when the import failed.
        import_errors: distribution → why its import failed.
    """

    path: str
    version: str | None = None
    in_venv: bool | None = None
    site_packages: list[str] = Field(default_factory=list)
    imports: dict[str, str | None] = Field(default_factory=dict)
    import_errors: dict[str, str] = Field(default_factory=dict)
    torch: str | None = None
    torch_cuda: str | None = None  # CUDA build of torch, e.g. "11.8"; None for CPU builds
    cuda_available: bool | None = None
    transformers: str | None = None
    peft: str | None = None
    trl: str | None = None
    accelerate: str | None = None
    transformers_torch_ok: bool | None = None  # False when transformers disabled torch
    huggingface_hub: str | None = None  # the publish stage's Hub client
    boto3: str | None = None  # the publish stage's S3 client


class EnvReport(BaseModel):
    """What the env probe found on the pod (docs/architecture.md#env-fix-and-hugging-face-diagnosis).

    Attributes:
        pythons: every interpreter candidate probed.
        driver_version: ``nvidia-smi`` driver version, None without a GPU.
        driver_cuda: the highest CUDA the driver supports (``CUDA Version: X.Y``).
        gpu_name / vram_mib: the first GPU's name and memory in MiB.
        free_disk_bytes: free bytes in the pod's workdir.
    """

    pythons: list[PythonProbe] = Field(default_factory=list)
    driver_version: str | None = None
    driver_cuda: str | None = None
    gpu_name: str | None = None
    vram_mib: int | None = None
    free_disk_bytes: int | None = None


class EnvPlan(BaseModel):
    """What the env stage decided and proved.

    Attributes:
        python: the interpreter that will run training.
        requirements: the bundle's declared requirements (pip specifiers).
        torch_floor: the lowest torch the requirements admit (e.g. "2.4" for transformers>=5.1).
        wheel_index: the PyTorch index chosen from the driver's CUDA (``cu118`` …), or None.
        allowed_cuda_versions: the CUDA floor fed to RunPod's ``allowedCudaVersions``.
        commands: exact commands applied, in order.
        venv: the pod venv path when one was made.
        must_import: distributions ``python`` must import once the fix is applied: the
            bundle's requirements, torch when one is planned or was there, and the ML
            packages the chosen base Python had (a pod venv must not lose them).
        verified: True once the re-probe proved the fix.
        before / after: the probes around the apply.
        notes: human-readable reasons.
        publish_python: the interpreter that runs the pod-side publisher (it has
            ``huggingface_hub`` or ``boto3``); None when the run publishes nothing.
    """

    python: str | None = None
    requirements: list[str] = Field(default_factory=list)
    torch_floor: str | None = None
    wheel_index: str | None = None
    allowed_cuda_versions: list[str] = Field(default_factory=list)
    commands: list[str] = Field(default_factory=list)
    venv: str | None = None
    must_import: list[str] = Field(default_factory=list)
    verified: bool = False
    before: EnvReport | None = None
    after: EnvReport | None = None
    notes: list[str] = Field(default_factory=list)
    publish_python: str | None = None


class HFCause(StrEnum):
    """Why Hugging Face access fails (docs/architecture.md#env-fix-and-hugging-face-diagnosis), or ``ok``."""

    OK = "ok"
    NO_TOKEN = "no_token"
    INVALID_TOKEN = "invalid_token"
    LICENCE_NOT_ACCEPTED = "licence_not_accepted"
    TOKEN_SCOPE = "token_scope"
    ACCESS_PENDING = "access_pending"
    ACCESS_REJECTED = "access_rejected"
    REPO_NOT_FOUND = "repo_not_found"
    NO_WRITE_ACCESS = "no_write_access"
    UNKNOWN = "unknown"


class HFDiagnosis(BaseModel):
    """One Hugging Face access diagnosis with its evidence and one remediation.

    Attributes:
        repo_id: the model/dataset repo checked.
        cause: the decided cause.
        where: ``local`` (preflight) or ``pod``.
        http_status: the HTTP status seen, if any.
        error_code: the ``X-Error-Code`` header, if any.
        server_message: the server's message (``X-Error-Message`` or body ``error``).
        recognised: False when the fallback rule (401→licence, 403→scope) decided.
        remediation: one sentence saying what to do.
        remediation_url: where to do it.
    """

    repo_id: str | None = None
    cause: HFCause
    where: Literal["local", "pod"] = "local"
    http_status: int | None = None
    error_code: str | None = None
    server_message: str | None = None
    recognised: bool = True
    remediation: str = ""
    remediation_url: str | None = None

    @property
    def blocking(self) -> bool:
        """True when the run cannot succeed with this access."""
        return self.cause != HFCause.OK


class TrainReport(BaseModel):
    """The training run on the pod.

    Attributes:
        command: what was launched (no secrets).
        run_dir: the pod-side run directory (log, pid and exit-code files).
        exit_code: the process's exit code; None if it never ended.
        seconds: wall time from launch to exit.
        last_log_lines: the tail of the log.
        metrics: last value of each metric seen in the log (name → float).
        log_bytes: bytes of log streamed.
        reconnects: console reconnects during the run.
    """

    command: str
    run_dir: str
    exit_code: int | None = None
    seconds: float = 0.0
    last_log_lines: list[str] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    log_bytes: int = 0
    reconnects: int = 0


class ParityRecordDiff(BaseModel):
    """One record where the two eval paths diverge, side by side."""

    id: str
    kinds: list[str] = Field(
        default_factory=list
    )  # input_drift, parse_drift, format_violation, prediction
    train_model_input: str | None = None
    eval_model_input: str | None = None
    input_diff: str | None = None
    train_raw_output: str | None = None
    eval_raw_output: str | None = None
    train_prediction: str | None = None
    eval_prediction: str | None = None
    expected_parse: str | None = None
    label: str | None = None


class ParityReport(BaseModel):
    """In-training eval vs the standalone eval (docs/architecture.md#eval-parity).

    Attributes:
        n_records: records present on both sides.
        missing_in_eval / missing_in_train: ids present on one side only.
        input_drift: records whose model_input differs.
        parse_drift: records whose prediction ≠ the format's parse of raw_output.
        format_violations: records whose raw_output does not match the output format.
        accuracy_train / accuracy_eval: accuracy of each path (0..1).
        accuracy_gap: |train − eval|.
        tolerance: the allowed gap.
        verdict: ``pass`` or ``fail``.
        reasons: the named drifts behind a fail.
        first_divergent: the first divergent records side by side.
    """

    n_records: int = 0
    missing_in_eval: list[str] = Field(default_factory=list)
    missing_in_train: list[str] = Field(default_factory=list)
    input_drift: int = 0
    parse_drift: int = 0
    format_violations: int = 0
    accuracy_train: float = 0.0
    accuracy_eval: float = 0.0
    accuracy_gap: float = 0.0
    tolerance: float = 0.02
    verdict: Literal["pass", "fail"] = "fail"
    reasons: list[str] = Field(default_factory=list)
    first_divergent: list[ParityRecordDiff] = Field(default_factory=list)
    # Added for the eval-parity artifact: the per-side split of ``format_violations``
    # and the regex the records were judged against.
    format_violations_train: int = 0
    format_violations_eval: int = 0
    output_format: str = ""


class CostReport(BaseModel):
    """What the run cost.

    Attributes:
        cost_per_hr: USD/h of the run's last pod (RunPod's ``costPerHr``).
        billed_seconds: create → terminate confirmed (until now for a pod that may
            still be billing), to the millisecond, over every pod of the run.
        usd: cost_per_hr × billed_seconds / 3600, to 1e-8 USD (``blocks/costs.py``
            ``settle`` computes both).
        max_cost_usd: the budget cap, if any.
        stage_seconds: seconds per stage.
        runpod_usd / runpod_billed_seconds: RunPod's own bill (REST billing), once its
            records appear; None before (or for a local pod).
        difference_usd: ``usd - runpod_usd`` once RunPod's bill is known.
        billing_note: where RunPod's bill came from, or why it is missing.
    """

    cost_per_hr: float = 0.0
    billed_seconds: float = 0.0
    usd: float = 0.0
    max_cost_usd: float | None = None
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    runpod_usd: float | None = None
    runpod_billed_seconds: float | None = None
    difference_usd: float | None = None
    billing_note: str = ""


class PublishedFile(BaseModel):
    """One published file and how its copy at the destination was checked.

    Attributes:
        path: relative POSIX path (in the repo, or under the S3 prefix).
        size_bytes: its size, from the pod-side manifest.
        sha256 / git_sha1: the pod-side manifest's digests.
        storage: how the destination stores it: ``lfs`` or ``regular`` on the Hub,
            ``s3`` in a bucket (the publish kind's ``check_record``).
        remote_id: what the destination reported: the LFS sha256 or the git blob id on
            the Hub, the sha256 metadata of the object on S3.
        verified: True when the destination's record equals the pod's manifest.
    """

    path: str
    size_bytes: int = Field(ge=0)
    sha256: str
    git_sha1: str | None = None
    storage: str
    remote_id: str | None = None
    verified: bool = False


class PublishReport(BaseModel):
    """What the publish stage shipped from the pod and what the destination confirmed.

    Attributes:
        target: the destination as a URI: ``hf://ORG/REPO`` or ``s3://BUCKET/PREFIX``
            (also the key of the Prefect asset materialised for the model).
        kind: the publish kind (``hf``, ``s3``: ``blocks.publish``).
        revision: the Hub commit id the files were verified at (None for S3).
        branch: the branch committed to (Hub only).
        url: the commit's web page on the Hub, or the S3 URI.
        files: every file, with the destination's record of it.
        bytes: total bytes published (from the pod-side manifest).
        verified: True only when every file matched the pod-side manifest.
        seconds: wall time of the stage's work on the pod and the read-back, in seconds.
        attempts: upload attempts the pod-side publisher needed (1 when nothing dropped).
    """

    target: str
    kind: str
    revision: str | None = None
    branch: str | None = None
    url: str | None = None
    files: list[PublishedFile] = Field(default_factory=list)
    bytes: int = 0
    verified: bool = False
    seconds: float = 0.0
    attempts: int = 0


class VerificationRecord(BaseModel):
    """One place where the run's outputs were checked against the pod-side manifest.

    Attributes:
        where: ``local`` (the downloaded copy), or the publish kind's place (``hub``,
            ``s3``).
        location: the local folder, ``hf://ORG/REPO@<revision>`` or the S3 URI.
        files: files checked there.
        bytes: their total size in bytes.
        verified: True when every one of them matched.
        how: what was compared (e.g. ``sha256 re-hashed locally``).
        extra: entries in the local folder the run did not bring (an earlier run's,
            kept with ``overwrite``), relative paths: named, never counted as verified.
    """

    where: str
    location: str
    files: int = 0
    bytes: int = 0
    verified: bool = False
    how: str = ""
    extra: list[str] = Field(default_factory=list)
