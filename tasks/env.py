"""The ``env`` stage: probe the pod, plan the fix, apply it with the right Python, and
prove it by probing again (docs/architecture.md#env-fix-and-hugging-face-diagnosis).

The failure it exists for: an image ships ``torch 2.1.0+cu118`` and the
job needs a newer transformers, which silently runs without torch
(``Disabling PyTorch because PyTorch >= X is required but found …``). The plan raises
torch to transformers' floor from the highest PyTorch wheel index the driver allows
(``nvidia-smi``'s ``CUDA Version`` is the driver's ceiling), installs into a pod venv
(``--system-site-packages``, so the image's packages stay visible; when the image's
Python is itself a venv, a ``.pth`` file makes the new venv see that venv's packages
too, which ``--system-site-packages`` alone does not) and never touches the machine
the flow runs on. The re-probe imports every package the job needs with the pod
venv's Python; one that does not import fails the stage.

:func:`plan_env` and :func:`verify_env` are pure, in :mod:`prefect_runpod.tasks.env_plan`;
:func:`probe_env`, :func:`apply_env_plan` and :func:`fix_env` take any console with
``run(cmd, timeout_seconds=, check=)``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import SecretStr

from prefect_runpod.blocks.console import ConsoleLike
from prefect_runpod.blocks.console.reconnect import ReconnectPolicy, resuming
from prefect_runpod.blocks.console.terminal_text import last_json_object
from prefect_runpod.blocks.exceptions import EnvError
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.tasks.env_plan import TORCH_INDEX_BASE, plan_env, verify_env
from prefect_runpod.tasks.models import EnvPlan, EnvReport
from prefect_runpod.tasks.pod_io import retry_unless_final

__all__ = [
    "apply_env_plan",
    "env",
    "fix_env",
    "parse_probe_output",
    "probe_env",
]


def parse_probe_output(output: str) -> EnvReport:
    """The ``EnvReport`` from ``probe.py``'s output (its last ``env_probe`` JSON line).

    Raises:
        EnvError: when no such line is present.
    """
    data = last_json_object(output, lambda obj: obj.get("kind") == "env_probe")
    if data is not None:
        return EnvReport.model_validate(data)
    tail = "\n".join(output.strip().splitlines()[-5:])
    raise EnvError(f"the env probe printed no report; its output ended with:\n{tail}")


def probe_env(
    console: ConsoleLike,
    probe_path: str,
    *,
    runner: str = "python3",
    pythons: Sequence[str] = (),
    disk_path: str | None = None,
    timeout_seconds: float = 300.0,
    require: Sequence[str] = (),
) -> EnvReport:
    """Run ``probe.py`` on the pod and parse its report.

    Args:
        console: runs commands on the pod.
        probe_path: where ``probe.py`` lies on the pod.
        runner: the interpreter that runs the probe itself (any Python ≥ 3.8).
        pythons: interpreters to probe first (e.g. the pod venv's).
        disk_path: the folder whose free bytes to report.
        timeout_seconds: deadline for the whole probe.
        require: distributions every probed Python is asked to import.

    Raises:
        EnvError: when the probe prints no report.
    """
    parts = [runner, probe_path, "--timeout-seconds", str(max(10.0, timeout_seconds / 3))]
    for p in pythons:
        parts += ["--python", p]
    if disk_path:
        parts += ["--disk-path", disk_path]
    for name in require:
        parts += ["--require", name]
    result = console.run(
        " ".join(shlex.quote(p) for p in parts), timeout_seconds=timeout_seconds, check=False
    )
    return parse_probe_output(result.output)


def apply_env_plan(
    console: ConsoleLike, plan: EnvPlan, *, timeout_seconds: float = 1800.0
) -> EnvPlan:
    """Run the plan's commands in order on the pod.

    Raises:
        EnvError: at the first command that exits non-zero (with its output tail).
    """
    for command in plan.commands:
        result = console.run(command, timeout_seconds=timeout_seconds, check=False)
        if result.exit_code != 0:
            tail = "\n".join(result.output.strip().splitlines()[-12:])
            raise EnvError(
                f"env fix failed (exit {result.exit_code}) at: {command}\n{tail}\n"
                "Fix the requirement or the index and rerun; nothing after this ran."
            )
    return plan


def fix_env(  # noqa: PLR0913
    console: ConsoleLike,
    requirements: Sequence[str],
    probe_path: str,
    *,
    venv: str,
    runner: str = "python3",
    python: str | None = None,
    disk_path: str | None = None,
    torch_index_base: str = TORCH_INDEX_BASE,
    pip_index_url: str | None = None,
    require_torch: bool | None = None,
    install_timeout_seconds: float = 1800.0,
) -> EnvPlan:
    """Probe → plan → apply → re-probe → verify, on one console.

    Returns:
        The verified :class:`EnvPlan` (``before``/``after`` filled in).

    Raises:
        EnvError: from planning (before installing anything), applying, or verifying.
    """
    before = probe_env(console, probe_path, runner=runner, disk_path=disk_path)
    plan = plan_env(
        before,
        requirements,
        python=python,
        venv=venv,
        torch_index_base=torch_index_base,
        pip_index_url=pip_index_url,
        require_torch=require_torch,
    )
    if not plan.commands:
        return plan.model_copy(update={"after": before, "verified": True})
    apply_env_plan(console, plan, timeout_seconds=install_timeout_seconds)
    after = probe_env(
        console,
        probe_path,
        runner=runner,
        pythons=[plan.python or ""],
        disk_path=disk_path,
        require=plan.must_import,
    )
    return verify_env(plan, after)


@task(
    name="env",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_final,
)
def env(
    handle: PodHandle,
    private_key: SecretStr,
    requirements: Sequence[str],
    tools_dir: str,
    *,
    venv: str | None = None,
    torch_index_base: str = TORCH_INDEX_BASE,
    pip_index_url: str | None = None,
    publish_kind: str | None = None,
    reconnect: ReconnectPolicy | None = None,
) -> EnvPlan:
    """Make the pod's Python fit the bundle and prove it.

    A gateway that refuses or drops connections is waited out (``reconnect``), and the
    step that was cut off (a probe, one install command) runs again: each is safe to
    repeat, so the stage resumes where it was.

    Args:
        handle: the pod.
        private_key: the SSH key for its console.
        requirements: the bundle's pip requirements.
        tools_dir: the pod folder holding ``probe.py``.
        venv: the pod venv path (default ``<tools_dir>/venv``).
        torch_index_base / pip_index_url: package sources (test indexes in rehearsals).
        publish_kind: the publish kind (``hf``, ``s3``) when the run publishes from the pod: the
            publisher's Python and client are made ready too (``tasks/publish_env.py``).
        reconnect: the run's reconnect policy (budget, backoff, provider status).

    Returns:
        The verified :class:`EnvPlan` (``publish_python`` set when publishing).

    Raises:
        EnvError: the plan is impossible (nothing installed), an install failed, the
            re-probe did not prove the fix, or the pod's Python is too old to publish.
            The message names the pod.
        ConsoleConnectError, PodGoneError: the pod's SSH did not come back in time, or
            the pod is gone.
    """
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.tasks.publish_env import prepare_publish_tools

    logger = get_run_logger()
    tools = tools_dir.rstrip("/")
    with PodConsole.for_pod(handle, private_key, reconnect=reconnect) as console:
        try:
            plan = fix_env(
                resuming(console),
                list(requirements),
                f"{tools}/probe.py",
                venv=venv or f"{tools}/venv",
                disk_path=handle.workdir,
                torch_index_base=torch_index_base,
                pip_index_url=pip_index_url,
            )
            if publish_kind is not None:
                plan = prepare_publish_tools(
                    resuming(console),
                    plan,
                    publish_kind,
                    provider=handle.provider,
                    venv=f"{tools}/publish-venv",
                    probe_path=f"{tools}/probe.py",
                    pip_index_url=pip_index_url,
                )
        except EnvError as exc:
            raise EnvError(f"{handle.pod_id}: {exc}", pod_id=handle.pod_id, stage="env") from exc
    if plan.notes:  # one record: what was found and decided
        logger.info("%s: env: %s", handle.pod_id, "; ".join(plan.notes))
    for command in plan.commands:
        logger.info("%s: env ran: %s", handle.pod_id, command)
    return plan
