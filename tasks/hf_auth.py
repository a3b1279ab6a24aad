"""The ``hf_auth`` stage: why Hugging Face access fails, decided from evidence (docs/architecture.md#env-fix-and-hugging-face-diagnosis).

One decision table, used for both places a download can run — locally in preflight
(through ``huggingface_hub``) and on the pod (through the stdlib script
``blocks/pod_side/hf_check.py``, because a token that works here may not be exported
in the pod's shell). Both produce the same evidence dict; :func:`diagnose_evidence`
turns it into an :class:`HFDiagnosis` with :func:`classify_hf_access`. The table, and
the one for publishing (:func:`classify_write_access`), are pure and live in
:mod:`prefect_runpod.tasks.hf_classify`; this module collects the evidence and runs the
stage.
"""

from __future__ import annotations

import shlex
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, State
from pydantic import SecretStr

from prefect_runpod.blocks.console import ConsoleLike
from prefect_runpod.blocks.console.reconnect import ReconnectPolicy, resuming
from prefect_runpod.blocks.console.terminal_text import last_json_object
from prefect_runpod.blocks.exceptions import HFAuthError
from prefect_runpod.blocks.huggingface import collect_access_evidence
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.secret_mask import redact, register
from prefect_runpod.tasks.hf_classify import (
    classify_hf_access,
    classify_write_access,
    diagnose_evidence,
    place_words,
)
from prefect_runpod.tasks.models import HFCause, HFDiagnosis

__all__ = [
    "diagnose_local",
    "diagnose_on_pod",
    "diagnose_write_local",
    "hf_auth",
    "hub_answer",
    "parse_hf_check_output",
    "raise_if_blocking",
    "skip_reason",
]


def diagnose_local(
    repo_id: str,
    token: SecretStr | None,
    endpoint: str | None = None,
    *,
    repo_type: str = "model",
    revision: str = "main",
    filename: str | None = "config.json",
) -> HFDiagnosis:
    """Diagnose access from this machine with the real ``huggingface_hub`` client.

    Args:
        repo_id: ``namespace/name``.
        token: the token to test; None means none is configured (no saved-login fallback).
        endpoint: the Hub base URL (default ``https://huggingface.co``); passed explicitly
            because huggingface_hub reads ``HF_ENDPOINT`` only at import.
        repo_type / revision / filename: what to probe.

    Returns:
        An :class:`HFDiagnosis` with ``where="local"``.
    """
    evidence = collect_access_evidence(
        repo_id,
        token=token,
        endpoint=endpoint,
        repo_type=repo_type,
        revision=revision,
        filename=filename,
    )
    return diagnose_evidence(evidence, where="local")


def parse_hf_check_output(output: str) -> dict[str, Any] | None:
    """Find the evidence line ``hf_check.py`` printed (the last JSON object with
    ``"kind": "hf_check"``) in console output; None when there is none."""
    return last_json_object(output, lambda obj: obj.get("kind") == "hf_check")


def diagnose_on_pod(
    console: ConsoleLike,
    repo_id: str,
    token: SecretStr | None,
    endpoint: str | None,
    python: str,
    *,
    script_path: str,
    repo_type: str = "model",
    revision: str = "main",
    filename: str | None = "config.json",
    timeout_seconds: float = 60.0,
) -> HFDiagnosis:
    """Diagnose access from the pod, where the download really runs.

    Runs the pod-side ``hf_check.py`` (already on the pod at ``script_path``) with the
    given Python. The token travels only as ``HF_TOKEN`` set through
    ``console.set_secret_env`` (echo off, never in a command line); with ``token=None``
    the script sees whatever the pod's shell already has.

    Args:
        console: the pod's console (``run`` and ``set_secret_env`` are used).
        repo_id / token / endpoint: as for :func:`diagnose_local`.
        python: the interpreter on the pod (e.g. the one the env stage chose).
        script_path: where ``hf_check.py`` lies on the pod.
        timeout_seconds: deadline for the check command.

    Returns:
        An :class:`HFDiagnosis` with ``where="pod"``; ``unknown`` when the script printed
        no evidence (the output tail is kept as the server message).

    Raises:
        CommandTimeoutError: from the console, when the check passes its deadline.
    """
    if token is not None:
        console.set_secret_env("HF_TOKEN", token)
    parts = [
        python,
        script_path,
        "--repo-id",
        repo_id,
        "--repo-type",
        repo_type,
        "--revision",
        revision,
        "--filename",
        filename or "",
    ]
    if endpoint:
        parts += ["--endpoint", endpoint]
    parts += ["--timeout-seconds", str(max(1.0, timeout_seconds / 4))]
    command = " ".join(shlex.quote(p) for p in parts)
    result = console.run(command, timeout_seconds=timeout_seconds, check=False)
    evidence = parse_hf_check_output(result.output)
    if evidence is None:
        register(token)
        tail = redact("\n".join(result.output.strip().splitlines()[-5:]))
        return classify_hf_access(
            repo_id=repo_id,
            status=None,
            message=f"hf_check printed no evidence (exit {result.exit_code}): {tail}",
            token_present=token is not None,
            where="pod",
            endpoint=endpoint,
        )
    return diagnose_evidence(evidence, where="pod")


def diagnose_write_local(
    repo_id: str, token: SecretStr | None, endpoint: str | None = None
) -> HFDiagnosis:
    """Whether ``token`` may publish to ``repo_id``, asked from this machine before any
    spend (``collect_write_evidence`` then :func:`classify_write_access`).

    Returns:
        The :class:`HFDiagnosis` (``ok`` or why not).
    """
    from prefect_runpod.blocks.huggingface import collect_write_evidence

    return classify_write_access(collect_write_evidence(repo_id, token=token, endpoint=endpoint))


def skip_reason(repo_id: str | None) -> str | None:
    """Why the stage is skipped, or None when it must run (no model id → skipped)."""
    if not repo_id or not repo_id.strip():
        return "no Hugging Face model id in the run spec; nothing to download"
    return None


def hub_answer(diagnosis: HFDiagnosis) -> str:
    """What the Hub answered, in words: ``HTTP 403, GatedRepo`` (the ``X-Error-Code`` only
    when it sent one), or ``no HTTP answer``; never a literal None."""
    if diagnosis.http_status is None:
        return "no HTTP answer"
    code = f", {diagnosis.error_code}" if diagnosis.error_code else ""
    return f"HTTP {diagnosis.http_status}{code}"


def raise_if_blocking(
    diagnosis: HFDiagnosis, *, pod_id: str | None = None, action: str = "access to"
) -> None:
    """Raise when the diagnosis says the download (or, with ``action="publishing to"``,
    the publish) will fail.

    Raises:
        HFAuthError: carrying the diagnosis; the message names the pod (if any), the
            cause, the remediation and its URL.
    """
    if not diagnosis.blocking:
        return
    prefix = f"{pod_id}: " if pod_id else ""
    flag = "" if diagnosis.recognised else " (unrecognised answer)"
    finding = (
        f"will fail on {place_words(diagnosis.where)}: {diagnosis.cause.value}{flag}, "
        f"{hub_answer(diagnosis)}"
    )
    if diagnosis.cause == HFCause.UNKNOWN and diagnosis.http_status is None:
        finding = f"cannot be checked on {place_words(diagnosis.where)}, the Hub gave no answer"
    raise HFAuthError(
        f"{prefix}Hugging Face {action} {diagnosis.repo_id} {finding}. "
        f"{diagnosis.remediation} {diagnosis.remediation_url or ''}".rstrip(),
        diagnosis=diagnosis,
        pod_id=pod_id,
        stage="hf_auth",
    )


def _retry_only_unknown(task: Any, task_run: Any, state: State) -> bool:
    """Retry a Hub hiccup (5xx, unreachable → ``unknown``), never a definite answer."""
    try:
        state.result()
    except HFAuthError as exc:
        return getattr(exc.diagnosis, "cause", None) == HFCause.UNKNOWN
    except Exception:  # noqa: BLE001 - a console drop is worth one more try
        return True
    return False


@task(
    name="hf_auth",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_only_unknown,
)
def hf_auth(
    handle: PodHandle,
    private_key: SecretStr,
    repo_id: str | None,
    token: SecretStr | None,
    endpoint: str | None,
    tools_dir: str,
    python: str = "python3",
    *,
    revision: str = "main",
    filename: str | None = "config.json",
    timeout_seconds: float = 60.0,
    reconnect: ReconnectPolicy | None = None,
) -> HFDiagnosis | State:
    """Diagnose Hugging Face access on the pod, where the download really runs; a
    gateway outage is waited out (``reconnect``) and the check runs again.

    Args:
        handle: the pod.
        private_key: the SSH key for its console.
        repo_id: the model repo; empty/None skips the stage with a recorded reason.
        token: the HF token (reaches the pod only as ``HF_TOKEN`` in the console session).
        endpoint: the Hub base URL (None → ``https://huggingface.co``).
        tools_dir: the pod folder holding the pod-side scripts (``hf_check.py``).
        python: the pod interpreter (the env stage's choice).
        revision / filename: the file a download would fetch first.
        timeout_seconds: deadline for the check command.
        reconnect: the run's reconnect policy (budget, backoff, provider status).

    Returns:
        The :class:`HFDiagnosis`, or a ``Completed`` state named ``Skipped`` whose message
        is the reason when there is no model id.

    Raises:
        HFAuthError: when access will fail (retried only when the cause is ``unknown``).
    """
    from prefect_runpod.blocks.console.session import PodConsole

    logger = get_run_logger()
    reason = skip_reason(repo_id)
    if reason is not None:
        logger.info("%s: hf_auth skipped: %s", handle.pod_id, reason)
        return Completed(name="Skipped", message=reason)
    assert repo_id is not None
    with PodConsole.for_pod(handle, private_key, reconnect=reconnect) as console:
        diagnosis = diagnose_on_pod(
            resuming(console),
            repo_id,
            token,
            endpoint,
            python,
            script_path=f"{tools_dir.rstrip('/')}/hf_check.py",
            revision=revision,
            filename=filename,
            timeout_seconds=timeout_seconds,
        )
    logger.info(
        "%s: hf_auth %s for %s (%s)%s: %s",
        handle.pod_id,
        diagnosis.cause.value,
        repo_id,
        hub_answer(diagnosis),
        "" if diagnosis.recognised else " [unrecognised answer]",
        diagnosis.remediation,
    )
    raise_if_blocking(diagnosis, pod_id=handle.pod_id)
    return diagnosis
