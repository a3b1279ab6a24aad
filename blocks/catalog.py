"""Every Prefect block prefect-runpod defines, imported eagerly.

This is the ``prefect.collections`` entry point: Prefect imports it so that slug
lookups such as ``Block.load("runpod-credentials/default")`` find our classes without
the caller importing them first.
"""

from __future__ import annotations

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
