"""prefect-runpod blocks: connections to the outside world and their clients.

``prefect block register -m prefect_runpod.blocks`` registers every block listed in
``__all__``. They load lazily (PEP 562), so a light process that imports one module
of this package (the local pod's daemon, say) does not pay for Prefect, boto3 and the
RunPod SDK.
"""

from __future__ import annotations

import importlib
from typing import Any

_BLOCKS = {
    "HuggingFaceCredentials": "prefect_runpod.blocks.huggingface",
    "LocalPod": "prefect_runpod.blocks.local_pod",
    "RunPodCredentials": "prefect_runpod.blocks.runpod_blocks",
    "RunPodPodSpec": "prefect_runpod.blocks.runpod_blocks",
    "RunPodSSHKey": "prefect_runpod.blocks.ssh_key",
    "S3Target": "prefect_runpod.blocks.transfer_s3",
}

__all__ = sorted(_BLOCKS)


def __getattr__(name: str) -> Any:
    module = _BLOCKS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_BLOCKS))
