"""Moving a directory tree to and from a pod, verified end to end by manifests.

- ``dispatch``   ``upload_dir`` / ``download_dir`` / ``pick_method``
- ``pod_tools``  the pod tools folder: ``tools_dir``, ``bootstrap_pod_tools``, ``pod_manifest``
- ``models``     ``Manifest``, ``TransferReport``
- one module per method: ``pty``, ``sftp``, ``s3``, ``runpodctl``

Names load lazily (the ``s3`` method imports boto3).
"""

from __future__ import annotations

from prefect_runpod.blocks import lazy_exports

__all__ = [
    "METHODS",
    "POD_TOOLS_DIR",
    "Manifest",
    "S3Target",
    "TransferReport",
    "bootstrap_pod_tools",
    "download_dir",
    "pick_method",
    "pod_manifest",
    "remote_path",
    "tools_dir",
    "upload_dir",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "METHODS": f"{__name__}.dispatch",
        "POD_TOOLS_DIR": f"{__name__}.pod_tools",
        "Manifest": f"{__name__}.models",
        "S3Target": f"{__name__}.s3",
        "TransferReport": f"{__name__}.models",
        "bootstrap_pod_tools": f"{__name__}.pod_tools",
        "download_dir": f"{__name__}.dispatch",
        "pick_method": f"{__name__}.dispatch",
        "pod_manifest": f"{__name__}.pod_tools",
        "remote_path": f"{__name__}.pod_tools",
        "tools_dir": f"{__name__}.pod_tools",
        "upload_dir": f"{__name__}.dispatch",
    },
)
