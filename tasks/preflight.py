"""Preflight: everything that can be checked before a pod exists, so a run that cannot
succeed spends nothing (docs/architecture.md#layers-and-packages)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, SecretStr

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.tasks.bundle import BundleSpec, load_bundle

__all__ = ["TRANSFER_METHODS", "RunSettings", "preflight", "validate_settings"]

TRANSFER_METHODS = ("auto", "pty", "sftp", "s3", "runpodctl")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


class RunSettings(BaseModel):
    """The validated settings of one run (the flow's parameters after preflight).

    Attributes:
        bundle: the loaded bundle spec.
        provider: ``local`` or ``runpod``.
        model_id: the Hugging Face repo to check, or None (then ``hf_auth`` is Skipped).
        transfer_method: one of ``TRANSFER_METHODS``.
        max_cost_usd: budget cap in USD, or None.
        max_runtime_seconds: the training runtime cap.
        name_prefix: pods are named ``<name_prefix>-<flow_run_id>``.
        output_dir: local directory for downloads and the run report.
    """

    bundle: BundleSpec
    provider: Literal["local", "runpod"]
    model_id: str | None
    transfer_method: str
    max_cost_usd: float | None
    max_runtime_seconds: float
    name_prefix: str
    output_dir: str


def validate_settings(
    *,
    bundle: str | Path,
    provider: str,
    model_id: str | None,
    transfer_method: str,
    max_cost_usd: float | None,
    max_runtime_seconds: float,
    name_prefix: str,
    output_dir: str | Path,
    parity_tolerance: float,
    s3_target_block: str | None = None,
) -> RunSettings:
    """Check the run's input; pure apart from reading the bundle.

    Returns:
        The ``RunSettings``; ``model_id`` falls back to the bundle's own ``model_id``.

    Raises:
        SpecError: naming the bad value and what would be accepted.
    """
    if provider not in ("local", "runpod"):
        raise SpecError(f"provider {provider!r} is not one of: local, runpod")
    if transfer_method not in TRANSFER_METHODS:
        raise SpecError(
            f"transfer method {transfer_method!r} is not one of: {', '.join(TRANSFER_METHODS)}"
        )
    if transfer_method == "s3" and not s3_target_block:
        raise SpecError(
            "transfer method 's3' needs a saved S3Target block (a bucket or a RunPod network "
            "volume's S3 endpoint): save one and pass --s3-target NAME"
        )
    if not _PREFIX_RE.match(name_prefix):
        raise SpecError(
            f"name prefix {name_prefix!r} must be 1-24 lowercase letters, digits or '-', "
            "starting with a letter (pods are found and reaped by it)"
        )
    if max_cost_usd is not None and max_cost_usd <= 0:
        raise SpecError(f"max_cost_usd must be > 0 USD, got {max_cost_usd}")
    if max_runtime_seconds <= 0:
        raise SpecError(f"max_runtime_seconds must be > 0 s, got {max_runtime_seconds}")
    if not 0 <= parity_tolerance < 1:
        raise SpecError(f"parity tolerance must be in [0, 1), got {parity_tolerance}")
    spec = load_bundle(bundle)
    repo = model_id or spec.model_id or None
    if repo is not None and not _REPO_RE.match(repo):
        raise SpecError(f"model id {repo!r} is not a Hugging Face repo id like 'org/name'")
    return RunSettings(
        bundle=spec,
        provider=provider,  # type: ignore[arg-type]
        model_id=repo,
        transfer_method=transfer_method,
        max_cost_usd=max_cost_usd,
        max_runtime_seconds=max_runtime_seconds,
        name_prefix=name_prefix,
        output_dir=str(Path(output_dir).expanduser().resolve()),
    )


@task(name="preflight", cache_policy=NO_CACHE)
def preflight(settings: RunSettings, hf_token: SecretStr | None, hf_endpoint: str | None) -> list:
    """Run the local Hugging Face diagnosis when the run names a model (no spend).

    Returns:
        A list with the local ``HFDiagnosis`` (empty when no model id).

    Raises:
        HFAuthError: when the diagnosis is blocking (no token, licence not accepted, …);
            the message carries the remediation and its URL.
    """
    if settings.model_id is None:
        return []
    from prefect_runpod.tasks.hf_auth import diagnose_local, raise_if_blocking

    diagnosis = diagnose_local(settings.model_id, hf_token, hf_endpoint)
    raise_if_blocking(diagnosis)
    return [diagnosis]
