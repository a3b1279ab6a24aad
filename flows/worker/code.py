"""Where a deployment's code comes from and what the pod runs, for the ``runpod``
worker (docs/worker.md#what-run-does): a deployment whose code is on this machine is
uploaded, any other keeps its pull steps, which run on the pod."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

__all__ = [
    "PREFECT_DEFAULT_COMMAND",
    "checked_requirements",
    "local_code_dir",
    "install_requirements",
    "pod_command",
    "requirement_files",
]

PREFECT_DEFAULT_COMMAND = "prefect flow-run execute"
"""Prefect's own command for a flow run (``BaseJobConfiguration``'s default)."""

_SET_WORKING_DIRECTORY = {
    "prefect.deployments.steps.set_working_directory",
    "prefect.deployments.steps.pull.set_working_directory",
}
_PIP_INSTALL_REQUIREMENTS = {
    "prefect.deployments.steps.pip_install_requirements",
    "prefect.deployments.steps.utility.pip_install_requirements",
}


def local_code_dir(deployment: Any) -> Path | None:
    """The folder of a deployment whose code is on this machine, which the worker
    uploads: pull steps that only set the working directory to a folder that exists
    here (what ``flow.from_source(LOCAL_DIR, …)`` and ``prefect deploy`` from a project
    write), possibly with ``pip_install_requirements`` steps (``requirement_files``), or
    no pull steps and an absolute ``path``. None for code the pod fetches
    itself (``git_clone`` and other pull steps, which run on the pod) or no deployment."""
    if deployment is None:
        return None
    steps = list(getattr(deployment, "pull_steps", None) or [])
    if steps:
        folder = None
        for step in steps:
            (name, args), *more = step.items()
            if name in _PIP_INSTALL_REQUIREMENTS and not more:
                continue  # installed on the pod from the uploaded folder (requirement_files)
            if more or name not in _SET_WORKING_DIRECTORY:
                return None
            folder = (args or {}).get("directory")
        candidate = Path(str(folder)) if folder else None
    else:
        path = getattr(deployment, "path", None)
        candidate = (
            Path(path) if path and not getattr(deployment, "storage_document_id", None) else None
        )
    if candidate is None or not candidate.is_absolute() or not candidate.is_dir():
        return None
    return candidate


def pod_command(command: str | None, python: str, *, code_uploaded: bool) -> str:
    """The command the launcher starts on the pod.

    Prefect's default (``prefect flow-run execute``) runs the deployment's pull steps on
    the pod; for code the worker uploaded it is Prefect's engine run in that folder
    (``python -m prefect.engine``, the entrypoint in ``PREFECT__FLOW_ENTRYPOINT``), as
    the pull steps name a folder of this machine. A command that starts with
    ``prefect`` runs with the pod's venv Python (``python -m prefect …``).
    """
    command = (command or PREFECT_DEFAULT_COMMAND).strip()
    q = shlex.quote(python)
    if command == PREFECT_DEFAULT_COMMAND and code_uploaded:
        return f"{q} -m prefect.engine"
    if command == "prefect" or command.startswith("prefect "):
        return f"{q} -m {command}"
    return command


def requirement_files(deployment: Any) -> list[str]:
    """The requirements files of a deployment's ``pip_install_requirements`` pull steps
    (``requirements_file``, ``requirements.txt`` by default), relative to its uploaded
    folder, in order; the pod installs them from there when the worker uploads the code
    (``local_code_dir``). Empty for no deployment or no such step."""
    files = []
    for step in list(getattr(deployment, "pull_steps", None) or []):
        for name, args in step.items():
            if name in _PIP_INSTALL_REQUIREMENTS:
                files.append(str((args or {}).get("requirements_file") or "requirements.txt"))
    return files


def checked_requirements(requirements: list[str]) -> list[str]:
    """The ``requirements`` job variable, each a pip requirement specifier
    (``pandas>=2``, ``name @ URL``), checked before any pod is rented; blank entries
    dropped.

    Raises:
        SpecError: one is not a specifier, with packaging's reason and how to write it.
    """
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.validation import check_requirement

    checked = []
    for text in requirements:
        if not str(text).strip():
            continue
        try:
            checked.append(check_requirement(str(text).strip()))
        except ValueError as exc:
            raise SpecError(f"job variable requirements: {exc}; no pod was rented") from None
    return checked


def install_requirements(
    console: Any, python: str, cwd: str, requirements: list[str], files: list[str], *, pod_id: str
) -> list[str]:
    """Install ``requirements`` (job-variable specifiers, checked again) and each of
    ``files`` (``-r FILE``, relative to ``cwd``) on the pod with ``python -m pip``, in
    ``cwd`` (a subshell), through ``console`` (the pod's connected console).

    Returns:
        What was asked for (specifiers, then files); empty when nothing was.

    Raises:
        SpecError: a specifier does not parse, or pip failed (its last lines quoted).
    """
    from prefect_runpod.blocks.exceptions import SpecError

    wanted = checked_requirements(requirements)
    if not wanted and not files:
        return []
    args = [*wanted, *(part for name in files for part in ("-r", name))]
    command = (
        f"(cd {shlex.quote(cwd)} && {shlex.quote(python)} -m pip install "
        "--disable-pip-version-check --no-input --progress-bar off "
        + " ".join(shlex.quote(a) for a in args)
        + ")"
    )  # a subshell: the console's shell keeps its own working directory
    done = console.run(command, timeout_seconds=900.0)
    if done.exit_code != 0:
        tail = " / ".join((done.output or "").strip().splitlines()[-3:])[-300:]
        raise SpecError(
            f"pod {pod_id} could not install the flow's requirements (pip exited "
            f"{done.exit_code}: {tail}); fix the requirements or their index and run again"
        )
    return [*wanted, *files]
