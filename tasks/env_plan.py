"""The env stage's plan, pure (docs/architecture.md#env-fix-and-hugging-face-diagnosis):
which Python, which torch from which PyTorch wheel index, which commands; the check
that a fresh probe shows the fix held; and the CUDA floor a bundle's requirements put
on the pod to rent.

:func:`plan_env` decides from an :class:`EnvReport` (the probe) and the bundle's
requirements; :func:`verify_env` proves a plan from the probe after it ran;
:func:`cuda_floor_for_requirements` needs the requirements alone, before any pod
exists. Nothing here runs a command: :mod:`prefect_runpod.tasks.env` probes, applies
and runs the stage.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from prefect_runpod.blocks.exceptions import EnvError
from prefect_runpod.tasks.models import EnvPlan, EnvReport, PythonProbe

__all__ = [
    "CUDA_INDEXES",
    "RUNPOD_CUDA_VERSIONS",
    "TORCH_INDEX_BASE",
    "allowed_cuda_versions_for",
    "cuda_floor_for_requirements",
    "plan_env",
    "torch_floor_for_transformers",
    "verify_env",
]

TORCH_INDEX_BASE = "https://download.pytorch.org/whl"

_LATEST_TORCH_MINOR = 14
"""The newest torch 2.x minor the tables below know about: 2.14 (2.14.1 published on
PyPI; a real H200 image probed with torch 2.11.0+cu130, see tests/data)."""

CUDA_INDEXES: dict[str, tuple[str, int, int | None]] = {
    "cu118": ("11.8", 0, 7),
    "cu121": ("12.1", 1, 5),
    "cu124": ("12.4", 4, 6),
    "cu126": ("12.6", 6, None),
    "cu128": ("12.8", 7, None),
    "cu129": ("12.9", 8, 8),
    "cu130": ("13.0", 9, None),
}
"""PyTorch wheel index tag → (CUDA version, first torch 2.x minor, last minor or None
for still published). cu118 ends at torch 2.7.x. Source: pytorch.org previous-versions
and the per-release install matrices."""

RUNPOD_CUDA_VERSIONS: tuple[str, ...] = (
    "11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.7", "12.8", "12.9",
    "13.0",
)  # fmt: skip
"""Values RunPod accepts in ``allowedCudaVersions`` on create."""

_TRANSFORMERS_FLOORS: tuple[tuple[str, str | None], ...] = (
    ("4.52", None),  # below 4.52: no gate
    ("5.0", "2.1"),  # 4.52 – 4.57.x
    ("5.1", "2.2"),  # 5.0
    ("5.15", "2.4"),  # 5.1 – 5.14
    ("5.20", "2.5"),  # 5.15 – 5.19
)
"""(first version NOT in the row, torch floor of the row); 5.20+ needs 2.6.
Source: transformers ``utils/import_utils.py`` ``is_torch_available`` per release."""


def _v(text: str) -> Version:
    return Version(text)


def torch_floor_for_transformers(version: str | None) -> str | None:
    """The lowest torch a transformers release accepts before it disables torch.

    Args:
        version: a transformers version (``4.46.3``, ``5.2.0``); None = the newest.

    Returns:
        ``"2.1"`` … ``"2.6"``, or None for releases without a gate (≤ 4.51).
    """
    if version is None:
        return "2.6"
    release = _v(version)
    for upper, floor in _TRANSFORMERS_FLOORS:
        if release < _v(upper):
            return floor
    return "2.6"


def _target_transformers(req: Requirement | None, installed: str | None) -> str | None:
    """The transformers version the job will run: the installed one when it satisfies
    the requirement, else the newest the specifier admits (None = latest)."""
    if req is None:
        return installed
    if installed and req.specifier.contains(installed, prereleases=True):
        return installed
    pinned = [
        s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version
    ]
    if pinned:
        return pinned[0]
    uppers = [s for s in req.specifier if s.operator in ("<", "<=")]
    if not uppers:
        return None
    tight = min(uppers, key=lambda s: (_v(s.version), s.operator != "<"))
    if tight.operator == "<=":
        return tight.version
    return _just_below(_v(tight.version))


def _just_below(bound: Version) -> str:
    """The highest version below ``bound`` that matters for the floor table
    (``5.1`` → ``5.0.999``, ``5.0`` → ``4.999.999``)."""
    release = list(bound.release) + [0] * (3 - len(bound.release))
    for i in range(len(release) - 1, -1, -1):
        if release[i]:
            release[i] -= 1
            release[i + 1 :] = [999] * (len(release) - i - 1)
            break
    return ".".join(str(x) for x in release)


def _torch_minors(spec: SpecifierSet, floor: str | None) -> list[int]:
    """torch 2.x minors that the specifier and the floor admit (checked on .0–.9)."""
    low = _v(floor) if floor else None
    minors = []
    for minor in range(0, _LATEST_TORCH_MINOR + 1):
        versions = [f"2.{minor}.{patch}" for patch in range(10)]
        if low and _v(f"2.{minor}.99") < low:
            continue
        if any(spec.contains(v, prereleases=True) for v in versions):
            minors.append(minor)
    return minors


def _index_minors(tag: str) -> set[int]:
    _, first, last = CUDA_INDEXES[tag]
    return set(range(first, (last if last is not None else _LATEST_TORCH_MINOR) + 1))


def allowed_cuda_versions_for(torch_floor: str | None, torch_spec: str = "") -> list[str]:
    """RunPod ``allowedCudaVersions`` for a job: every CUDA at or above the lowest one
    whose wheel index has a torch the job accepts, so a host whose driver is too old
    is never rented.

    Args:
        torch_floor: e.g. ``"2.6"``; None = any torch 2.x.
        torch_spec: the job's own torch specifier (``">=2.8"``), if any.

    Returns:
        Sorted CUDA versions (``["12.6", "12.7", …]``); empty when any host will do.

    Raises:
        EnvError: when no known index has an acceptable torch.
    """
    minors = set(_torch_minors(SpecifierSet(torch_spec), torch_floor))
    cudas = [CUDA_INDEXES[t][0] for t in CUDA_INDEXES if _index_minors(t) & minors]
    if not cudas:
        raise EnvError(
            f"no PyTorch CUDA index offers torch {torch_spec or ''} >= {torch_floor}; "
            "relax the torch requirement in the bundle"
        )
    floor = min(cudas, key=_v)
    if floor == RUNPOD_CUDA_VERSIONS[0]:
        return []
    return [c for c in RUNPOD_CUDA_VERSIONS if _v(c) >= _v(floor)]


def _pick_python(report: EnvReport, python: str | None) -> PythonProbe:
    if python is not None:
        for probe in report.pythons:
            if probe.path == python:
                return probe
        return PythonProbe(path=python)
    usable = [p for p in report.pythons if p.version]
    if not usable:
        raise EnvError("the probe found no working Python on the pod; use an image with python3")
    with_torch = [p for p in usable if p.torch]
    return (with_torch or usable)[0]


def _torch_ok(probe: PythonProbe, floor: str | None, spec: SpecifierSet, gpu: bool) -> bool:
    if not probe.torch:
        return False
    try:
        installed = _v(probe.torch)
    except InvalidVersion:
        return False
    if floor and Version(installed.base_version) < _v(floor):
        return False
    if not spec.contains(installed, prereleases=True):
        return False
    return not (gpu and probe.cuda_available is False)


def plan_env(  # noqa: PLR0913 - plain planner inputs
    report: EnvReport,
    requirements: Sequence[str],
    *,
    python: str | None = None,
    venv: str | None = None,
    torch_index_base: str = TORCH_INDEX_BASE,
    pip_index_url: str | None = None,
    require_torch: bool | None = None,
) -> EnvPlan:
    """Decide what to install, with which Python, from which index. Pure.

    Args:
        report: the pod probe.
        requirements: the bundle's pip requirements (``transformers>=5.1`` …).
        python: force this interpreter; default: the first probed Python with torch.
        venv: where to make the pod venv (needed when there is anything to install).
        torch_index_base: the PyTorch index root (``…/whl``); ``/<tag>`` is appended.
        pip_index_url: ``--index-url`` for the other packages (None = pip's default).
        require_torch: force (True) or forbid (False) a torch install; None decides:
            needed when the requirements name torch, or a torch is present but below
            transformers' floor, or the pod has a GPU and no torch.

    Returns:
        An :class:`EnvPlan` with ``commands`` in order, ``python`` (the venv's when one
        is made), ``torch_floor``, ``wheel_index``, ``allowed_cuda_versions`` and notes.

    Raises:
        EnvError: before anything is installed, when a requirement cannot be parsed, no
            Python works, or the driver is too old for every index that has the needed
            torch.
    """
    try:
        reqs = [Requirement(r) for r in requirements if r.strip() and not r.strip().startswith("#")]
    except InvalidRequirement as exc:
        raise EnvError(f"bad requirement in the bundle: {exc}; fix requirements and rerun") from exc
    by_name = {r.name.lower(): r for r in reqs}
    torch_req = by_name.get("torch")
    torch_spec = torch_req.specifier if torch_req else SpecifierSet()
    base = _pick_python(report, python)
    notes: list[str] = [
        f"base python {base.path} ({base.version}, torch {base.torch or 'missing'})"
    ]

    target_tf = _target_transformers(by_name.get("transformers"), base.transformers)
    floor = (
        torch_floor_for_transformers(target_tf)
        if (target_tf or "transformers" in by_name)
        else None
    )
    if torch_req is not None:
        floor_from_spec = [s.version for s in torch_spec if s.operator in (">=", "==", "~=", ">")]
        if floor_from_spec:
            spec_floor = max(floor_from_spec, key=_v)
            if floor is None or _v(spec_floor) > _v(floor):
                floor = ".".join(spec_floor.split(".")[:2])
    notes.append(f"transformers target {target_tf or 'latest'} → torch floor {floor or 'none'}")

    gpu = report.driver_cuda is not None
    if require_torch is None:
        require_torch = torch_req is not None or bool(base.torch) or gpu
        require_torch = require_torch and not _torch_ok(base, floor, torch_spec, gpu)
    plan = EnvPlan(requirements=list(requirements), torch_floor=floor, before=report)
    try:
        plan.allowed_cuda_versions = allowed_cuda_versions_for(floor, str(torch_spec))
    except EnvError:
        plan.allowed_cuda_versions = []

    torch_install: str | None = None
    if require_torch:
        torch_install = _torch_install(report, plan, base, torch_spec, floor, notes)
    elif base.torch:
        notes.append(f"torch {base.torch} already fits")

    others = [str(r) for r in reqs if r.name.lower() != "torch"]
    plan.python = base.path
    plan.must_import = _must_import(reqs, base, bool(torch_install))
    if not requirements and not torch_install:
        notes.append("nothing to install")
        plan.notes = notes
        return plan
    if venv is None:
        raise EnvError("there is something to install but no venv path was given")
    _add_install_commands(
        plan, base, venv, torch_install, others, torch_index_base, pip_index_url, notes
    )
    plan.notes = notes
    return plan


def _torch_install(
    report: EnvReport,
    plan: EnvPlan,
    base: PythonProbe,
    torch_spec: SpecifierSet,
    floor: str | None,
    notes: list[str],
) -> str:
    """The torch requirement to install (``torch>=2.6,<2.11``) and, in ``plan``, the
    wheel index it comes from: the highest CUDA index the driver allows that has an
    acceptable torch, or the cpu wheels without a GPU.

    Raises:
        EnvError: the driver is too old for every index that has the needed torch, or
            no torch 2.x satisfies the specifier and the floor.
    """
    gpu = report.driver_cuda is not None
    minors = _torch_minors(torch_spec, floor)
    if gpu:
        ceiling = _v(report.driver_cuda or "0")
        tags = sorted(
            (t for t in CUDA_INDEXES if _v(CUDA_INDEXES[t][0]) <= ceiling),
            key=lambda t: _v(CUDA_INDEXES[t][0]),
            reverse=True,
        )
        tag = next((t for t in tags if _index_minors(t) & set(minors)), None)
        if tag is None:
            raise EnvError(
                f"the driver ({report.driver_version}, CUDA {report.driver_cuda}) is too old "
                f"for torch {torch_spec or f'>= {floor}'}: no PyTorch index up to CUDA "
                f"{report.driver_cuda} has it. Rent a host with allowedCudaVersions "
                f"{plan.allowed_cuda_versions or 'newer'}, or pin an older transformers."
            )
        usable = sorted(_index_minors(tag) & set(minors))
    else:
        tag = "cpu"
        usable = minors
    if not usable:
        raise EnvError(f"no torch 2.x satisfies {torch_spec} with floor {floor}")
    bounds = SpecifierSet(f">=2.{usable[0]},<2.{usable[-1] + 1}") & torch_spec
    torch_install = f"torch{bounds}"
    plan.wheel_index = tag
    notes.append(
        f"torch {base.torch or 'missing'} → {torch_install} from {tag}"
        + (f" (driver CUDA {report.driver_cuda})" if gpu else " (no GPU: cpu wheels)")
    )
    return torch_install


def _add_install_commands(
    plan: EnvPlan,
    base: PythonProbe,
    venv: str,
    torch_install: str | None,
    others: list[str],
    torch_index_base: str,
    pip_index_url: str | None,
    notes: list[str],
) -> None:
    """Make the pod venv from ``base`` (inheriting a parent venv's packages), then the
    pip commands: torch from its wheel index, the other requirements; ``plan.python``
    becomes the venv's."""
    venv_python = f"{venv.rstrip('/')}/bin/python"
    q = shlex.quote
    pip = (
        f"{q(venv_python)} -m pip install --disable-pip-version-check --no-input --progress-bar off"
    )
    plan.venv = venv
    plan.python = venv_python
    plan.commands.append(f"{q(base.path)} -m venv --system-site-packages --without-pip {q(venv)}")
    inherit = _inherit_parent_venv(base, venv)
    if inherit:
        plan.commands.append(inherit)
        notes.append(f"{base.path} is a venv: the pod venv inherits its site-packages")
    if torch_install:
        plan.commands.append(
            f"{pip} --index-url {q(torch_index_base.rstrip('/') + '/' + str(plan.wheel_index))} "
            f"{q(torch_install)}"
        )
    if others:
        index = f" --index-url {q(pip_index_url)}" if pip_index_url else ""
        plan.commands.append(f"{pip}{index} " + " ".join(q(o) for o in others))


_TRACKED = ("transformers", "peft", "trl", "accelerate")
"""The ML packages the probe reports per Python (``PythonProbe`` fields)."""


def _must_import(reqs: Sequence[Requirement], base: PythonProbe, torch_planned: bool) -> list[str]:
    """The distributions the fixed Python must import (see ``EnvPlan.must_import``)."""
    names: list[str] = [str(canonicalize_name(r.name)) for r in reqs]
    if torch_planned or base.torch:
        names.append("torch")
    names += [name for name in _TRACKED if getattr(base, name)]
    return list(dict.fromkeys(names))


def _inherit_parent_venv(base: PythonProbe, venv: str) -> str | None:
    """The command that makes a pod venv built from the venv Python ``base`` see that
    venv's site-packages: a ``.pth`` file whose lines run ``site.addsitedir`` on each
    (so their own ``.pth`` files count too), after the new venv's own packages. None
    when ``base`` is no venv (``--system-site-packages`` is then enough)."""
    if not base.in_venv or not base.site_packages or not base.version:
        return None
    major, minor = base.version.split(".")[:2]
    site_dir = f"{venv.rstrip('/')}/lib/python{major}.{minor}/site-packages"
    lines = "".join(f"import site; site.addsitedir({json.dumps(d)})\n" for d in base.site_packages)
    return (
        f"printf %s {shlex.quote(lines)} > {shlex.quote(site_dir + '/_prefect_runpod_parent.pth')}"
    )


def _below(version: str, floor: str) -> bool:
    return Version(_v(version).base_version) < _v(floor)


def verify_env(plan: EnvPlan, after: EnvReport) -> EnvPlan:
    """Prove the fix from a fresh probe. Pure.

    Checks, for ``plan.python``: every ``plan.must_import`` distribution imports (a pod
    venv that lost the image's packages fails here), torch imports when a torch was
    planned or present, meets ``torch_floor``, reports CUDA available exactly when the
    pod has a driver, and transformers no longer disables torch.

    Returns:
        The plan with ``after``, ``verified=True`` and a note.

    Raises:
        EnvError: naming every check that failed.
    """
    probe = next((p for p in after.pythons if p.path == plan.python), None)
    problems: list[str] = []
    if probe is None or not probe.version:
        problems.append(f"{plan.python} did not run")
    else:
        wants_torch = bool(plan.wheel_index) or any(
            p.torch for p in (plan.before.pythons if plan.before else [])
        )
        if wants_torch and not probe.torch:
            problems.append("torch does not import")
        for name in plan.must_import:
            if name == "torch" and not probe.torch:
                continue  # named just above
            if not probe.imports.get(name):
                why = probe.import_errors.get(name, "not checked by the probe")
                problems.append(f"{name} does not import with {plan.python} ({why})")
        if probe.torch and plan.torch_floor and _below(probe.torch, plan.torch_floor):
            problems.append(f"torch {probe.torch} is below the floor {plan.torch_floor}")
        if probe.torch and after.driver_cuda is not None and probe.cuda_available is not True:
            problems.append(
                f"torch {probe.torch} (CUDA build {probe.torch_cuda}) reports no CUDA although "
                f"the driver supports CUDA {after.driver_cuda}"
            )
        if probe.torch and after.driver_cuda is None and probe.cuda_available:
            problems.append("torch reports CUDA on a pod without nvidia-smi")
        if probe.transformers and probe.torch and probe.transformers_torch_ok is False:
            problems.append(f"transformers {probe.transformers} still disables torch {probe.torch}")
    if problems:
        raise EnvError(
            "the env fix did not hold: " + "; ".join(problems) + ". Inspect the pod with the "
            "probe, or pick an image whose torch/CUDA fits the bundle."
        )
    plan = plan.model_copy(update={"after": after, "verified": True})
    plan.notes = [
        *plan.notes,
        f"verified {plan.python}: torch {(probe.torch if probe else None) or 'missing'}",
    ]
    return plan


def cuda_floor_for_requirements(requirements: Sequence[str]) -> list[str]:
    """RunPod ``allowedCudaVersions`` for a bundle, from its declared requirements alone
    (before any pod exists): the torch floor transformers imposes (:data:`_TRANSFORMERS_FLOORS`) and the
    job's own torch specifier decide the lowest usable wheel index.

    Args:
        requirements: pip specifiers from ``bundle.toml`` (e.g. ``["transformers>=5.1"]``).

    Returns:
        Sorted CUDA versions, or ``[]`` when the job needs no torch or any host will do.

    Raises:
        EnvError: when no PyTorch CUDA index has a torch the job accepts.
    """
    reqs: dict[str, Requirement] = {}
    for line in requirements:
        if not line.strip() or line.strip().startswith("#"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise EnvError(f"requirement {line!r} in bundle.toml is not valid: {exc}") from exc
        reqs[canonicalize_name(req.name)] = req
    if "torch" not in reqs and "transformers" not in reqs:
        return []
    transformers = reqs.get("transformers")
    floor = (
        torch_floor_for_transformers(_target_transformers(transformers, None))
        if transformers is not None
        else None
    )
    torch_req = reqs.get("torch")
    return allowed_cuda_versions_for(floor, str(torch_req.specifier) if torch_req else "")
