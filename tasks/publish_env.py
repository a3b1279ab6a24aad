"""The pod's publishing tools: a Python that can run ``blocks/pod_side/publisher.py``
with the client it needs (``huggingface_hub`` for the Hub, ``boto3`` for S3), made
ready by the ``env`` stage when the run publishes (docs/architecture.md#publish-from-the-pod).

- The publisher needs Python 3.10 or newer (the clients' own floor); an older pod
  Python is refused in ``env`` with that reason, before training starts.
- When the training Python already has the client (images with transformers carry
  ``huggingface_hub``), it is used as it is.
- Otherwise a separate venv ``<tools>/publish-venv`` is made (``--system-site-packages``,
  so the training venv is never changed) and
  - on a real pod (it has internet) the client is installed there with pip;
  - on the local pod — offline, a rehearsal on this machine — the venv gets a ``.pth``
    file naming this environment's ``site-packages``, so the pod's Python sees the
    very clients the flow uses. That needs the same Python minor version on both.
- A second probe of the publish Python proves the client imports.

:func:`plan_publish_tools` is pure; :func:`prepare_publish_tools` runs it on a console.
"""

from __future__ import annotations

import shlex
import sys
import sysconfig
from collections.abc import Sequence

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from prefect_runpod.blocks.console import ConsoleLike
from prefect_runpod.blocks.exceptions import EnvError
from prefect_runpod.blocks.provider_capabilities import Capability
from prefect_runpod.blocks.provider_registry import provider_supports
from prefect_runpod.blocks.publish.base import publish_kind
from prefect_runpod.tasks.models import EnvPlan, PythonProbe

__all__ = [
    "MIN_PUBLISH_PYTHON",
    "host_packages_venv",
    "host_site_dirs",
    "plan_publish_tools",
    "prepare_publish_tools",
]

MIN_PUBLISH_PYTHON = (3, 10)
"""The oldest Python the publisher runs on (huggingface_hub and boto3 dropped 3.8/3.9)."""

_PTH_NAME = "prefect-runpod-host.pth"


def host_site_dirs() -> list[str]:
    """This environment's ``site-packages`` folders (purelib, platlib), for the local
    pod's rehearsal ``.pth``."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def host_packages_venv(python: str, venv: str, host_dirs: Sequence[str]) -> list[str]:
    """The pod commands that make ``venv`` (from the pod's ``python``, with the image's
    own packages visible: ``--system-site-packages``) and give it a ``.pth`` that adds
    each of ``host_dirs`` as a site dir (their own ``.pth`` files run, an editable
    install's finder among them), so a pod on this machine imports this environment's
    packages without installing anything. The venv's Python is ``<venv>/bin/python``; it needs the same
    minor version as this one (the caller checks)."""
    q = shlex.quote
    venv_python = f"{venv.rstrip('/')}/bin/python"
    # Each folder is added as a site dir (an ``import`` line of the .pth), so the .pth
    # files in it run too: an editable install's import finder among them.
    write_pth = (
        "import site, sys; "
        f"open(site.getsitepackages()[0] + '/{_PTH_NAME}', 'w').write(''.join("
        "'import site; site.addsitedir(%r)' % d + chr(10) for d in sys.argv[1:]))"
    )
    return [
        f"{q(python)} -m venv --system-site-packages --without-pip {q(venv)}",
        f"{q(venv_python)} -c {q(write_pth)} " + " ".join(q(d) for d in host_dirs),
    ]


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def plan_publish_tools(
    probe: PythonProbe,
    kind: str,
    *,
    provider: str,
    venv: str,
    host_dirs: Sequence[str] = (),
    host_version: tuple[int, int] | None = None,
    pip_index_url: str | None = None,
) -> tuple[str, list[str], list[str]]:
    """Decide which Python runs the publisher and what to run to make it fit. Pure.

    Args:
        probe: the training Python as the env probe saw it.
        kind: the publish kind (``hf``, ``s3``); its ``client_requirement`` is what the
            publisher imports (none: the training Python publishes as it is).
        provider: the pod's provider; one on this machine (the local pod, an offline
            rehearsal: ``Capability.ON_THIS_MACHINE``) lends the pod this environment's
            packages, any other installs the client with pip.
        venv: where to make the publish venv when one is needed.
        host_dirs: on this machine: this environment's site-packages folders.
        host_version: on this machine: this Python's ``(major, minor)``.
        pip_index_url: ``--index-url`` for pip on a real pod (None: pip's default).

    Returns:
        ``(publish_python, commands, notes)``; no commands when ``probe`` already fits.

    Raises:
        EnvError: the pod's Python is older than 3.10 (or unusable), or a local pod's
            Python differs from this one's minor version.
    """
    target = publish_kind(kind)
    if target.client_requirement is None or target.client_module is None:
        return probe.path, [], [f"publish with {probe.path} (the {kind} target needs no client)"]
    requirement = Requirement(target.client_requirement)
    version = _version(probe.version)
    if version is None:
        raise EnvError(
            f"the pod's Python {probe.path} did not run, so nothing can publish from the "
            "pod; use an image with python3 3.10+"
        )
    if (version.major, version.minor) < MIN_PUBLISH_PYTHON:
        raise EnvError(
            f"the pod's Python {probe.path} is {probe.version}, older than the 3.10 that "
            f"the pod-side publisher ({requirement.name}) needs: choose an image with Python "
            "3.10 or newer, or drop --publish and download the model instead"
        )
    have = getattr(probe, target.client_module)
    if have and requirement.specifier.contains(have, prereleases=True):
        return probe.path, [], [f"publish with {probe.path} ({requirement.name} {have})"]
    q = shlex.quote
    venv_python = f"{venv.rstrip('/')}/bin/python"
    if provider_supports(provider, Capability.ON_THIS_MACHINE):
        if host_version is not None and (version.major, version.minor) != host_version:
            raise EnvError(
                f"the local pod's Python is {probe.version} but this one is "
                f"{host_version[0]}.{host_version[1]}: the rehearsal lends the pod this "
                "environment's packages, which needs the same minor version"
            )
        commands = host_packages_venv(probe.path, venv, host_dirs)
        note = f"local pod: {venv} sees this machine's site-packages (a rehearsal, offline)"
    else:
        commands = [f"{q(probe.path)} -m venv --system-site-packages --without-pip {q(venv)}"]
        index = f" --index-url {q(pip_index_url)}" if pip_index_url else ""
        commands.append(
            f"{q(venv_python)} -m pip install --disable-pip-version-check --no-input "
            f"--progress-bar off{index} {q(str(requirement))}"
        )
        note = f"install {requirement} into {venv} for the publisher"
    return venv_python, commands, [note]


def prepare_publish_tools(
    console: ConsoleLike,
    plan: EnvPlan,
    kind: str,
    *,
    provider: str,
    venv: str,
    probe_path: str,
    pip_index_url: str | None = None,
    timeout_seconds: float = 900.0,
) -> EnvPlan:
    """Make the publish Python ready on the pod and prove it with a probe.

    Args:
        console: the pod's console.
        plan: the env stage's verified plan (its ``python`` and probes).
        kind: the publish kind (``hf``, ``s3``).
        provider: the handle's provider (see :func:`plan_publish_tools`).
        venv: the publish venv path.
        probe_path: ``probe.py`` on the pod.
        pip_index_url: pip's index on a real pod.
        timeout_seconds: deadline per command.

    Returns:
        ``plan`` with ``publish_python`` set and the commands and notes appended.

    Raises:
        EnvError: as :func:`plan_publish_tools`, a command failed, or the probe after it
            does not show the client.
    """
    from prefect_runpod.tasks.env import apply_env_plan, probe_env

    seen = plan.after or plan.before
    probe = next((p for p in (seen.pythons if seen else []) if p.path == plan.python), None)
    if probe is None:
        report = probe_env(console, probe_path, pythons=[plan.python or "python3"])
        probe = next((p for p in report.pythons if p.path == plan.python), None)
        if probe is None:
            raise EnvError(f"the probe did not see {plan.python}; nothing can publish from the pod")
    here = provider_supports(provider, Capability.ON_THIS_MACHINE)
    python, commands, notes = plan_publish_tools(
        probe,
        kind,
        provider=provider,
        venv=venv,
        host_dirs=host_site_dirs() if here else (),
        host_version=sys.version_info[:2] if here else None,
        pip_index_url=pip_index_url,
    )
    if commands:
        apply_env_plan(console, EnvPlan(commands=commands), timeout_seconds=timeout_seconds)
        after = probe_env(console, probe_path, pythons=[python])
        ready = next((p for p in after.pythons if p.path == python), None)
        field = str(publish_kind(kind).client_module)
        if ready is None or not getattr(ready, field):
            raise EnvError(
                f"{python} still cannot import {field} after: {'; '.join(commands)}. "
                "Check the pod's network and pip index, or drop --publish"
            )
        notes = [*notes, f"verified {python}: {field} {getattr(ready, field)}"]
    return plan.model_copy(
        update={
            "publish_python": python,
            "commands": [*plan.commands, *commands],
            "notes": [*plan.notes, *notes],
        }
    )
