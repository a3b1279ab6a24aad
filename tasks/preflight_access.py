"""The ``preflight`` stage's access checks, once the run's input passed
(``tasks.preflight.validate_settings``): the Hugging Face diagnosis run locally — read
access to the model, and when the run publishes, write access to the repo — or a
reachable S3 bucket (docs/architecture.md#publish-from-the-pod)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import SecretStr

from prefect_runpod.blocks.publish.base import publish_kind
from prefect_runpod.tasks.preflight import RunSettings

if TYPE_CHECKING:
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = ["preflight"]


@task(name="preflight", cache_policy=NO_CACHE)
def preflight(
    settings: RunSettings,
    hf_token: SecretStr | None,
    hf_endpoint: str | None,
    s3: S3Target | None = None,
) -> list:
    """Check access before any spend: the local Hugging Face diagnosis when the run names
    a model, and the publish target when it publishes — write access to the Hub repo
    (``classify_write_access``), or that the ``S3Target``'s bucket answers.

    Args:
        settings: the validated input.
        hf_token: the Hugging Face token (read for the model, write for publishing).
        hf_endpoint: the Hub base URL.
        s3: the loaded ``S3Target`` (required by an ``s3`` publish target).

    Returns:
        The local ``HFDiagnosis`` records (read access, then write access); empty when
        neither applies.

    Raises:
        HFAuthError: a blocking diagnosis (no token, licence not accepted, the Hub cannot
            be reached, a read-only token, a namespace that is not writable, …) with its
            remediation and URL.
        SpecError: the S3 target is missing or its bucket cannot be reached.
    """
    from prefect_runpod.tasks.hf_auth import (
        diagnose_local,
        diagnose_write_local,
        raise_if_blocking,
    )

    found = []
    if settings.model_id is not None:
        diagnosis = diagnose_local(settings.model_id, hf_token, hf_endpoint)
        raise_if_blocking(diagnosis)
        found.append(diagnosis)
    target = settings.publish
    if target is not None:
        kind = publish_kind(target.kind)
        if kind.needs_hub_write:
            writable = diagnose_write_local(str(target.repo_id), hf_token, hf_endpoint)
            raise_if_blocking(writable, action="publishing to")
            found.append(writable)
        kind.check_before_renting(target, s3=s3)
    return found
