"""Where a deployment's code comes from and what the pod runs, for the ``runpod``
worker (docs/worker.md#what-run-does): a deployment whose code is on this machine is
uploaded, any other keeps its pull steps, which run on the pod."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

__all__ = ["PREFECT_DEFAULT_COMMAND", "local_code_dir", "pod_command"]

PREFECT_DEFAULT_COMMAND = "prefect flow-run execute"
"""Prefect's own command for a flow run (``BaseJobConfiguration``'s default)."""

_SET_WORKING_DIRECTORY = {
    "prefect.deployments.steps.set_working_directory",
    "prefect.deployments.steps.pull.set_working_directory",
}


def local_code_dir(deployment: Any) -> Path | None:
    """The folder of a deployment whose code is on this machine, which the worker
    uploads: pull steps that only set the working directory to a folder that exists
    here (what ``flow.from_source(LOCAL_DIR, …)`` and ``prefect deploy`` from a project
    write), or no pull steps and an absolute ``path``. None for code the pod fetches
    itself (``git_clone`` and other pull steps, which run on the pod) or no deployment."""
    if deployment is None:
        return None
    steps = list(getattr(deployment, "pull_steps", None) or [])
    if steps:
        folder = None
        for step in steps:
            (name, args), *more = step.items()
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
