"""Image profiles of the local pod: the login environment of the images people rent
(docs/local-pod-images.md).

A RunPod pod is a container started from an image, and what a login shell meets there
comes from that image: rc files that print a banner and ``cd /workspace``, an image
Python first on ``PATH`` (and a system ``python`` without torch behind it), conda's
``(base)`` prompt, prompt frameworks that redraw the prompt, set titles and query the
terminal, images whose Python is a virtualenv. Every stage is tested against these,
because they are what breaks naive consoles.

A profile is data: the full text of the pod user's ``~/.bashrc``, environment
variables, the folders put in front of ``PATH``, and an optional image Python (a venv
made from the host's base interpreter, holding stand-in packages from
:mod:`prefect_runpod.blocks.local_pod.tiny_wheels`). Placeholders in the text are
filled per pod: ``@POD_ID@``, ``@WORKSPACE@`` (the pod's ``/workspace``), ``@HOME@``
and ``@IMAGE@`` (the image folder). Add a profile with :func:`register_profile`.

Image folders are built once per pod home (``<home>/images/<name>-<digest>/``) and
shared by every pod of that profile, as a container runtime shares an image.
Standard library only (pip does the installing).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prefect_runpod.blocks.exceptions import ProviderError, SpecError
from prefect_runpod.blocks.local_pod.tiny_wheels import stand_in_wheel

__all__ = [
    "DEFAULT_PROFILE",
    "ImageProfile",
    "PodImage",
    "get_profile",
    "prepare_image",
    "profile_names",
    "register_profile",
]

DEFAULT_PROFILE = "plain"
_BUILD_TIMEOUT_SECONDS = 300.0
_COMPLETE = ".complete"


@dataclass(frozen=True)
class ImageProfile:
    """One image's login environment.

    Attributes:
        name: what ``LocalPodProvider(image=...)`` and ``--local-image`` take.
        description: one line for ``--help`` and the docs.
        bashrc: the whole ``~/.bashrc`` of the pod user, placeholders allowed.
        env: environment variables every pod process gets (values may hold
            placeholders); the run's own pod env wins on a clash.
        path_first: folders put in front of the pod's ``PATH`` (placeholders allowed),
            as an image's ``ENV PATH=…`` does.
        image_packages: ``(distribution, version)`` pairs installed into the image
            Python; a torch version carries its index label (``2.1.0+cu118``).
        image_python: whether the profile has an image Python at ``@IMAGE@/bin``.
        hide_python_name: leave ``@IMAGE@/bin/python`` out, so ``python`` finds the
            system interpreter further down ``PATH`` (RunPod's PyTorch images: the
            image's ``python3`` has torch, ``python`` is the system one without it).
    """

    name: str
    description: str
    bashrc: str
    env: Mapping[str, str] = field(default_factory=dict)
    path_first: tuple[str, ...] = ()
    image_packages: tuple[tuple[str, str], ...] = ()
    image_python: bool = False
    hide_python_name: bool = False


@dataclass(frozen=True)
class PodImage:
    """A profile filled in for one pod: what the provider writes into the pod.

    Attributes:
        profile: the profile's name.
        bashrc: the rc text with placeholders filled in.
        env: environment variables, filled in.
        path_first: folders in front of ``PATH``, filled in.
        image_dir: the shared image folder, or None when the profile has no image Python.
    """

    profile: str
    bashrc: str
    env: dict[str, str]
    path_first: list[str]
    image_dir: str | None


_PLAIN_RC = r"""# ~/.bashrc of local pod @POD_ID@ (profile: plain).
# A coloured user@pod:path# prompt, as a RunPod pod's default shell shows.
PS1='\[\e[01;32m\]\u@@POD_ID@\[\e[00m\]:\[\e[01;34m\]\w\[\e[00m\]\$ '
"""

_RUNPOD_PYTORCH_RC = r"""# ~/.bashrc of local pod @POD_ID@ (profile: runpod-pytorch), shaped like the shell of
# RunPod's PyTorch images (runpod/pytorch:2.1.0-py3.10-cuda11.8.0-devel-ubuntu22.04).
[ -z "$PS1" ] && return

cat <<'BANNER'

-------------------------------------------------------------------------------
  RunPod PyTorch 2.1.0 · Python 3 · CUDA 11.8 · Ubuntu 22.04
  local pod @POD_ID@ (a rehearsal on this machine: no GPU)
  Your files live in /workspace; everything else is lost when the pod ends.
  Docs: https://docs.runpod.io/pods/overview
-------------------------------------------------------------------------------

BANNER

# The image's Python (with torch) is first on PATH; `python` is the system one.
cd @WORKSPACE@
export HISTCONTROL=ignoreboth
shopt -s histappend checkwinsize
PS1='\[\e]0;\u@\h: \w\a\]${debian_chroot:+($debian_chroot)}\[\e[01;32m\]\u@\h\[\e[00m\]:\[\e[01;34m\]\w\[\e[00m\]\$ '
alias ls='ls --color=auto'
alias ll='ls -alF'
"""

_CONDA_RC = r"""# ~/.bashrc of local pod @POD_ID@ (profile: conda), shaped like an image whose
# ~/.bashrc went through `conda init bash`: the base environment is active and its
# name is put in front of the prompt before every prompt.
PS1='\u@\h:\w\$ '

# >>> conda initialize >>>
__conda_prompt() {
    PS1="(base) ${PS1#(base) }"
}
PROMPT_COMMAND="__conda_prompt${PROMPT_COMMAND:+;$PROMPT_COMMAND}"
# <<< conda initialize <<<
"""

_FANCY_RC = r"""# ~/.bashrc of local pod @POD_ID@ (profile: fancy), shaped like a prompt framework:
# the prompt is rebuilt before every prompt (colours by exit status, a window-title
# escape), bracketed paste is on, and start-up asks the terminal where the cursor is.
bind 'set enable-bracketed-paste on' 2>/dev/null

# Cursor-position query (ESC[6n): the answer arrives as typed input, read up to its R.
printf '\033[6n'; IFS= read -rs -d R -t 5 _p

__fancy_prompt() {
    local rc=$? colour=32
    [ "$rc" -eq 0 ] || colour=31
    PS1="\[\e]0;\u@\h: \w\a\]\[\e[1;${colour}m\]➜ \[\e[0;36m\]\w \[\e[2m\][${rc}]\[\e[0m\] "
}
PROMPT_COMMAND=__fancy_prompt
"""

_VENV_PYTHON_RC = r"""# ~/.bashrc of local pod @POD_ID@ (profile: venv-python), shaped like an image whose
# Python is a virtualenv (python -m venv /opt/venv; PATH=/opt/venv/bin:$PATH), which
# the rc activates, so the prompt carries the venv's name.
PS1='\u@\h:\w\$ '
. @IMAGE@/bin/activate
"""

_PROFILES: dict[str, ImageProfile] = {}


def register_profile(profile: ImageProfile, *, replace: bool = False) -> None:
    """Make ``profile`` available to ``LocalPodProvider(image=profile.name)``.

    Raises:
        ValueError: the name is taken (and not ``replace``) or is not a simple name.
    """
    name = profile.name
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"image profile name {name!r}: use letters, digits, '-', '_', '.'")
    if name in _PROFILES and not replace:
        raise ValueError(f"image profile {name!r} is already registered; pass replace=True")
    _PROFILES[name] = profile


for _profile in (
    ImageProfile(
        name="plain",
        description="a bare login shell with a coloured prompt (no rc surprises)",
        bashrc=_PLAIN_RC,
    ),
    ImageProfile(
        name="runpod-pytorch",
        description=(
            "RunPod's PyTorch image: a banner, cd /workspace, the image python3 (torch "
            "2.1.0+cu118, transformers 4.46.3) first on PATH, a system python without torch"
        ),
        bashrc=_RUNPOD_PYTORCH_RC,
        env={"PYTORCH_VERSION": "2.1.0", "CUDA_VERSION": "11.8.0"},
        path_first=("@IMAGE@/bin",),
        image_packages=(("torch", "2.1.0+cu118"), ("transformers", "4.46.3")),
        image_python=True,
        hide_python_name=True,
    ),
    ImageProfile(
        name="conda",
        description="conda's base environment: '(base) ' put before the prompt by PROMPT_COMMAND",
        bashrc=_CONDA_RC,
        env={
            "CONDA_PREFIX": "@IMAGE@",
            "CONDA_DEFAULT_ENV": "base",
            "CONDA_SHLVL": "1",
            "CONDA_PROMPT_MODIFIER": "(base) ",
        },
        path_first=("@IMAGE@/bin",),
        image_python=True,
    ),
    ImageProfile(
        name="fancy",
        description=(
            "a prompt framework: prompt rebuilt every time with colours and title escapes, "
            "bracketed paste, a cursor-position query at login"
        ),
        bashrc=_FANCY_RC,
    ),
    ImageProfile(
        name="venv-python",
        description=(
            "the image Python is a virtualenv (torch 2.5.1+cpu, transformers 4.57.1), "
            "activated by the rc"
        ),
        bashrc=_VENV_PYTHON_RC,
        env={"VIRTUAL_ENV": "@IMAGE@"},
        path_first=("@IMAGE@/bin",),
        image_packages=(("torch", "2.5.1+cpu"), ("transformers", "4.57.1")),
        image_python=True,
    ),
):
    register_profile(_profile)


def profile_names() -> tuple[str, ...]:
    """The registered profile names (``plain`` first)."""
    return tuple(_PROFILES)


def get_profile(name: str) -> ImageProfile:
    """The profile called ``name``.

    Raises:
        SpecError: no such profile (the message lists the known ones).
    """
    try:
        return _PROFILES[name]
    except KeyError:
        raise SpecError(
            f"unknown local pod image {name!r}; use one of: {', '.join(_PROFILES)}"
        ) from None


def _fill(text: str, values: Mapping[str, str]) -> str:
    for token, value in values.items():
        text = text.replace(f"@{token}@", value)
    return text


def prepare_image(
    home: Path,
    profile: ImageProfile,
    *,
    python: Path,
    pod_id: str,
    workspace: Path,
    pod_home: Path,
) -> PodImage:
    """Fill ``profile`` in for one pod, building its shared image folder when needed.

    Args:
        home: the pod home (images live in ``<home>/images``).
        profile: the profile.
        python: the base interpreter the image Python is made from (never a venv's).
        pod_id: the pod's id (``@POD_ID@``).
        workspace: the pod's workspace (``@WORKSPACE@``).
        pod_home: the pod user's home (``@HOME@``).

    Returns:
        The filled-in ``PodImage``.

    Raises:
        ProviderError: the image Python could not be built (the output tail is named).
    """
    image_dir = _ensure_image(home, profile, python) if profile.image_python else None
    values = {
        "POD_ID": pod_id,
        "WORKSPACE": str(workspace),
        "HOME": str(pod_home),
        "IMAGE": str(image_dir) if image_dir else "",
    }
    return PodImage(
        profile=profile.name,
        bashrc=_fill(profile.bashrc, values),
        env={k: _fill(v, values) for k, v in profile.env.items()},
        path_first=[_fill(p, values) for p in profile.path_first],
        image_dir=str(image_dir) if image_dir else None,
    )


def _digest(profile: ImageProfile, python: Path) -> str:
    spec = {
        "packages": sorted(profile.image_packages),
        "hide_python_name": profile.hide_python_name,
        "python": str(python),
        "version": list(sys.version_info[:3]),
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ensure_image(home: Path, profile: ImageProfile, python: Path) -> Path:
    """The image folder of ``profile`` under ``home``, built once (under a lock, so two
    pods created at once build it once)."""
    target = home / "images" / f"{profile.name}-{_digest(profile, python)}"
    with _locked(target.with_name(target.name + ".lock")):
        if (target / _COMPLETE).is_file():
            return target
        shutil.rmtree(target, ignore_errors=True)
        try:
            _build(target, profile, python)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        (target / _COMPLETE).write_text(profile.name + "\n")
    return target


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=_BUILD_TIMEOUT_SECONDS,
            env={k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProviderError(f"building the local pod image failed at {what}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip()[-800:]
        raise ProviderError(
            f"building the local pod image failed at {what} (exit {done.returncode}): {tail}"
        )


def _build(target: Path, profile: ImageProfile, python: Path) -> None:
    """Make the image Python: a venv of the base interpreter holding the profile's
    stand-in packages (installed by pip from wheel files, no index, no network)."""
    _run(
        [str(python), "-m", "venv", "--without-pip", "--prompt", "venv", str(target)],
        "python -m venv",
    )
    if profile.image_packages:
        major, minor = sys.version_info[:2]
        site = target / "lib" / f"python{major}.{minor}" / "site-packages"
        with tempfile.TemporaryDirectory(prefix="pod-image-wheels-") as tmp:
            wheels = []
            for name, version in profile.image_packages:
                filename, data = stand_in_wheel(name, version)
                (Path(tmp) / filename).write_bytes(data)
                wheels.append(str(Path(tmp) / filename))
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-index",
                    "--no-deps",
                    "--target",
                    str(site),
                    *wheels,
                ],
                "pip install of the stand-in packages",
            )
    if profile.hide_python_name:
        # venv links python3 and python3.X to `python`: point them at the base
        # interpreter directly, then drop `python` so PATH finds the system one.
        bin_dir = target / "bin"
        for link in bin_dir.iterdir():
            if link.name.startswith("python3"):
                link.unlink()
                link.symlink_to(python)
        (bin_dir / "python").unlink()
