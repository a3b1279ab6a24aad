"""Moving a directory tree to and from a pod, verified end to end by manifests.

- ``dispatch``  ``upload_dir`` / ``download_dir`` / ``pick_method``
- ``models``    ``Manifest``, ``TransferReport``
- one module per method: ``pty``, ``sftp``, ``s3``, ``runpodctl``

Names load lazily (the ``s3`` method imports boto3).
"""

from __future__ import annotations

from prefect_runpod.blocks import lazy_exports

__all__ = [
    "METHODS",
    "Manifest",
    "S3Target",
    "TransferReport",
    "download_dir",
    "pick_method",
    "upload_dir",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "METHODS": f"{__name__}.dispatch",
        "Manifest": f"{__name__}.models",
        "S3Target": f"{__name__}.s3",
        "TransferReport": f"{__name__}.models",
        "download_dir": f"{__name__}.dispatch",
        "pick_method": f"{__name__}.dispatch",
        "upload_dir": f"{__name__}.dispatch",
    },
)
