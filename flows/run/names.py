"""What a run is known by, in a module that imports nothing heavy (the cockpit's look-ups
read it without loading the flow engine): its pod's name and the run id read back from
one, the files it keeps in its output dir, and the Prefect states after which it is done.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

if TYPE_CHECKING:
    from pydantic import SecretStr

__all__ = [
    "FINISHED_STATE_TYPES",
    "KEPT_TAG_PREFIX",
    "POD_KEY_FILE",
    "TRAIN_LOG",
    "flow_run_id_from_pod_name",
    "flow_run_url",
    "forget_pod_access",
    "pod_name_for",
    "attempt_pod_name",
]

FINISHED_STATE_TYPES: frozenset[str] = frozenset({"COMPLETED", "FAILED", "CRASHED", "CANCELLED"})
"""Prefect state types after which a run never touches its pod again."""

KEPT_TAG_PREFIX = "kept-pod:"
"""A flow run tag ``kept-pod:<pod_id>``: the run kept that pod on purpose (outputs that
could not travel are on it); the reaper spares it until its TTL, the dead-man until its
lifetime."""

TRAIN_LOG = "train.log"
"""The training log as the run followed it, kept in the output dir whatever is downloaded."""

POD_KEY_FILE = "pod-ssh-key"
"""A local pod's per-run private key in the output dir (mode 0600), kept while the pod
lives so the printed ssh command works, deleted once the pod is confirmed gone."""

_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ATTEMPT_RE = re.compile(r"(?<=[0-9a-fA-F])-a[1-9][0-9]*$")


def pod_name_for(name_prefix: str, flow_run_id: str) -> str:
    """The pod name hooks and the reaper find a run's pod by: ``<prefix>-<flow_run_id>``."""
    return f"{name_prefix}-{flow_run_id}"


def attempt_pod_name(run_pod_name: str, number: int) -> str:
    """The name of a run's pod attempt ``number``: the run's pod name for the first,
    ``<prefix>-<flow_run_id>-a<n>`` for the pods it resumed on."""
    return run_pod_name if number <= 1 else f"{run_pod_name}-a{number}"


def flow_run_id_from_pod_name(name: str, name_prefix: str | None) -> UUID | None:
    """The flow run id in a pod name ``<name_prefix>-<flow_run_id>``, or None when the
    name has another prefix or its rest is not a UUID. With ``name_prefix`` None, any
    prefix (a pod found by its id, whatever prefix its run used). A pod attempt's
    ``-a<n>`` suffix (``attempt_pod_name``) names the same flow run."""
    name = _ATTEMPT_RE.sub("", name)
    if name_prefix is None:
        head, dash, rest = name[:-36], name[-37:-36], name[-36:].lower()
        if not head or dash != "-" or not _UUID_RE.fullmatch(rest):
            return None
        return UUID(rest)
    head = f"{name_prefix}-"
    if not name.startswith(head):
        return None
    rest = name[len(head) :].lower()
    if not _UUID_RE.fullmatch(rest):
        return None
    return UUID(rest)


def save_pod_key(key: SecretStr, out: Path) -> str:
    """Keep the pod's private key (mode 0600) at ``<out>/pod-ssh-key`` while the pod lives,
    so the printed ``ssh`` command works: a local pod's throwaway per-run key, or the key
    of a saved RunPodSSHKey block (a provider that reaches pods with the user's own key
    file, ``Capability.USER_KEY``, names that file instead). ``forget_pod_access``
    deletes it once the pod is confirmed gone.

    Returns:
        The key file's path.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / POD_KEY_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key.get_secret_value())
    return str(path)


def forget_pod_access(output_dir: str | Path | None, pod_id: str | None) -> list[Path]:
    """Delete what reached a pod that is confirmed gone: the private key kept beside the
    run's outputs (``<output_dir>/pod-ssh-key``) and the file that pinned its host key.
    Call it only once the provider confirmed the end (a live pod keeps its way in).

    Returns:
        The files deleted (none when there were none).
    """
    from prefect_runpod.blocks.pod_handle import known_hosts_file

    files = [Path(output_dir) / POD_KEY_FILE] if output_dir else []
    if pod_id:
        files.append(known_hosts_file(pod_id))
    gone = []
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            gone.append(path)
    return gone


def flow_run_url(flow_run_id: str) -> str | None:
    """The run's page in the Prefect UI (``<PREFECT_UI_URL>/runs/flow-run/<id>``), or None
    when no UI address is configured (Prefect's own ``url_for``)."""
    from prefect.utilities.urls import url_for

    try:
        return url_for("flow-run", obj_id=flow_run_id)
    except Exception:  # no UI configured, or an API URL it cannot derive one from
        return None
