"""prefect-runpod blocks: connections to the outside world and their clients.

Four subsystems, each a package that names its public surface in ``__init__``:

- ``runpod``     RunPod blocks, the SDK client, the error map, the pod lifecycle, the provider
- ``local_pod``  the embedded default pod: provider, daemon, registry
- ``console``    ``PodConsole``, commands through a PTY-only SSH gateway
- ``transfer``   moving files to and from a pod, verified by manifests

plus ``pod_side`` (stdlib scripts that run on the pod) and, at this level, what they
share: exceptions, the provider protocol, the pod handle, keys, Hugging Face access,
fault points, costs. See ``docs/architecture.md``.

``prefect block register -m prefect_runpod.blocks`` registers every block listed in
``__all__``. Names load lazily (PEP 562), so a light process that imports one module
of this package (the local pod's daemon, say) does not pay for Prefect, boto3 and the
RunPod SDK.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, typed (PEP 562's __getattr__ hides them)
    from prefect_runpod.blocks.huggingface import HuggingFaceCredentials
    from prefect_runpod.blocks.local_pod.provider import LocalPod
    from prefect_runpod.blocks.runpod.blocks import RunPodCredentials, RunPodPodSpec
    from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = [
    "HuggingFaceCredentials",
    "LocalPod",
    "RunPodCredentials",
    "RunPodPodSpec",
    "RunPodSSHKey",
    "S3Target",
]

_BLOCKS = {
    "HuggingFaceCredentials": "prefect_runpod.blocks.huggingface",
    "LocalPod": "prefect_runpod.blocks.local_pod.provider",
    "RunPodCredentials": "prefect_runpod.blocks.runpod.blocks",
    "RunPodPodSpec": "prefect_runpod.blocks.runpod.blocks",
    "RunPodSSHKey": "prefect_runpod.blocks.runpod.ssh_key",
    "S3Target": "prefect_runpod.blocks.transfer.s3",
}


def lazy_exports(
    package: str, exports: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """PEP 562 ``__getattr__`` and ``__dir__`` for a package whose public names live in
    its submodules: a name is imported from its module on first access.

    Args:
        package: the package's ``__name__`` (named in the AttributeError).
        exports: public name -> the module (full dotted path) that defines it.

    Returns:
        ``(__getattr__, __dir__)`` to assign at the package's top level.
    """

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def dir_() -> list[str]:
        return sorted(set(exports) | set(importlib.import_module(package).__dict__))

    return getattr_, dir_


__getattr__, __dir__ = lazy_exports(__name__, _BLOCKS)
