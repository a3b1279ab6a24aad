"""Which torch device and dtype the job uses, decided without needing torch to decide.

A model that builds a ``float64`` tensor runs on CUDA and CPU but fails on Apple's MPS
backend (``Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't
support float64``). So the choice is made in one pure place: the ``DEVICE``
environment variable, then an explicit request, then a config value, then auto-detect
(cuda > mps > cpu); a device that is not there falls back to CPU with a warning, and
MPS never gets ``float64``.

Standard library only (it ships in the bundle and runs on the pod's Python, 3.8 or
newer); ``modeling.py`` passes in what torch reports, and tests pass in what they like.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEVICES = ("cuda", "mps", "cpu")
"""Device kinds handed out, in auto-detect preference order."""

_AUTO_WORDS = frozenset({"", "auto"})


@dataclass(frozen=True)
class ResolvedDevice:
    """The outcome of :func:`resolve_device`.

    Attributes:
        device: ``cuda``, ``cuda:N``, ``mps`` or ``cpu``.
        reason: where the choice came from (``env DEVICE=…``, ``config=…``, ``auto-detect``).
        warning: set when the requested device was not available and CPU was used instead.
    """

    device: str
    reason: str
    warning: str | None = None

    @property
    def kind(self) -> str:
        """The device without its index (``cuda:1`` -> ``cuda``)."""
        return self.device.split(":", 1)[0]


def _normalise(value: str) -> str:
    return value.strip().lower()


def _available(kind: str, cuda_available: bool, mps_available: bool) -> bool:
    return kind == "cpu" or (kind == "cuda" and cuda_available) or (kind == "mps" and mps_available)


def _probe_torch() -> tuple[bool, bool]:
    """Ask torch, when it imports, which accelerators exist; (False, False) otherwise."""
    try:
        import torch
    except Exception:
        return False, False
    cuda = bool(torch.cuda.is_available())
    mps_backend = getattr(getattr(torch, "backends", None), "mps", None)
    mps = bool(mps_backend is not None and mps_backend.is_available())
    return cuda, mps


def resolve_device(
    requested: str | None = None,
    *,
    env_var: str = "DEVICE",
    config: str | Mapping[str, object] | None = None,
    cuda_available: bool | None = None,
    mps_available: bool | None = None,
    environ: Mapping[str, str] | None = None,
) -> ResolvedDevice:
    """Pick the torch device: env var, then explicit request, then config, then auto-detect.

    The env var wins so that ``DEVICE=cpu python -u train.py`` overrides everything.
    ``auto`` (or empty) anywhere means "keep looking". An unavailable device (``cuda``
    on a Mac, ``mps`` on a pod) falls back to CPU with a warning instead of failing
    later inside the model.

    Args:
        requested: the caller's choice (``auto``/``cuda``/``cuda:N``/``mps``/``cpu``), or None.
        env_var: the environment variable consulted first.
        config: a device string, or a mapping with a ``device`` key (a job config).
        cuda_available / mps_available: what the machine has; when both are None
            torch is imported (if installed) to find out.
        environ: the environment to read (defaults to ``os.environ``).

    Returns:
        A :class:`ResolvedDevice`.

    Raises:
        ValueError: when a device name is not one of cuda/cuda:N/mps/cpu/auto.
    """
    env = os.environ if environ is None else environ
    if cuda_available is None and mps_available is None:
        cuda_available, mps_available = _probe_torch()
    cuda_ok = bool(cuda_available)
    mps_ok = bool(mps_available)

    config_value = config.get("device") if isinstance(config, Mapping) else config
    candidates: list[tuple[str, str | None]] = [
        (f"env {env_var}", env.get(env_var)),
        ("requested", requested),
        ("config", config_value if isinstance(config_value, str) else None),
    ]
    for source, raw in candidates:
        if raw is None or _normalise(raw) in _AUTO_WORDS:
            continue
        device = _normalise(raw)
        kind, _, index = device.partition(":")
        if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
            raise ValueError(
                f"unknown device {raw!r} from {source}; use auto, cuda, cuda:N, mps or cpu"
            )
        if _available(kind, cuda_ok, mps_ok):
            return ResolvedDevice(device=device, reason=f"{source}={device}")
        return ResolvedDevice(
            device="cpu",
            reason=f"{source}={device}",
            warning=f"{device} was requested ({source}) but is not available here; using cpu "
            "(expect it to be about 10x slower)",
        )
    for kind in DEVICES:
        if _available(kind, cuda_ok, mps_ok):
            return ResolvedDevice(device=kind, reason="auto-detect")
    raise AssertionError("unreachable: cpu is always available")  # pragma: no cover


def dtype_name(device: str, wanted: str | None = None) -> str:
    """The floating dtype name to use on ``device`` (pass it to ``getattr(torch, name)``).

    Without ``wanted``: ``bfloat16`` on CUDA (half the memory of float32; a 1B model
    with LoRA fits a 24 GB card), ``float32`` elsewhere. With ``wanted``: that dtype,
    except that ``float64`` becomes ``float32`` on MPS, which has no float64.

    Args:
        device: a device string such as ``mps``, ``cuda:0`` or ``cpu``.
        wanted: the dtype name the code would like (``float64``, ``float32``, ``bfloat16``…).

    Returns:
        A torch dtype name.
    """
    kind = device.split(":", 1)[0].lower()
    if wanted is None:
        return "bfloat16" if kind == "cuda" else "float32"
    if kind == "mps" and wanted in ("float64", "double"):
        return "float32"
    return wanted
