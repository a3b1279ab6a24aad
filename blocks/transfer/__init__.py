"""Moving a directory tree to and from a pod, verified end to end by manifests.

- ``base``       the ``TransferMethod`` protocol, ``PodLink``, ``MethodConfig``, ``TransferHooks``
- ``registry``   ``METHOD_REGISTRY``, ``method_names``, ``register_method`` (imports no method)
- ``dispatch``   ``upload_dir`` / ``download_dir`` / ``pick_method`` over the registry;
  ``check_tree`` (would a transfer carry this tree?)
- ``pod_tools``  the pod tools folder: ``tools_dir``, ``bootstrap_pod_tools``, ``pod_manifest``,
  ``manifest_command`` (the one builder of ``manifest.py``'s command line)
- ``verify``     the step every method ends with: check against the manifest, resend once
- ``models``     ``Manifest``, ``MethodResult``, ``TransferReport``
- one module per method: ``pty``, ``sftp``, ``s3``, ``runpodctl``

Names load lazily (the ``s3`` method imports Prefect's blocks and boto3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_runpod.blocks import lazy_exports

if TYPE_CHECKING:  # the same names, typed (PEP 562's __getattr__ hides them)
    from prefect_runpod.blocks.transfer.base import (
        MethodConfig,
        MethodOptions,
        PodLink,
        TransferHooks,
        TransferMethod,
    )
    from prefect_runpod.blocks.transfer.dispatch import (
        check_tree,
        download_dir,
        pick_method,
        upload_dir,
    )
    from prefect_runpod.blocks.transfer.models import (
        Manifest,
        ManifestEntry,
        MethodResult,
        TransferReport,
    )
    from prefect_runpod.blocks.transfer.pod_tools import (
        POD_TOOLS_DIR,
        bootstrap_pod_tools,
        pod_manifest,
        remote_path,
        tools_dir,
    )
    from prefect_runpod.blocks.transfer.pty import PtyMethod, PtyOptions
    from prefect_runpod.blocks.transfer.registry import (
        METHOD_REGISTRY,
        method_names,
        register_method,
    )
    from prefect_runpod.blocks.transfer.runpodctl import RunpodctlMethod, RunpodctlOptions
    from prefect_runpod.blocks.transfer.s3 import S3Method, S3Target
    from prefect_runpod.blocks.transfer.sftp import SftpMethod

__all__ = [
    "METHOD_REGISTRY",
    "POD_TOOLS_DIR",
    "Manifest",
    "ManifestEntry",
    "MethodConfig",
    "MethodOptions",
    "MethodResult",
    "PodLink",
    "PtyMethod",
    "PtyOptions",
    "RunpodctlMethod",
    "RunpodctlOptions",
    "S3Method",
    "S3Target",
    "SftpMethod",
    "TransferHooks",
    "TransferMethod",
    "TransferReport",
    "bootstrap_pod_tools",
    "check_tree",
    "download_dir",
    "method_names",
    "pick_method",
    "pod_manifest",
    "register_method",
    "remote_path",
    "tools_dir",
    "upload_dir",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "METHOD_REGISTRY": f"{__name__}.registry",
        "POD_TOOLS_DIR": f"{__name__}.pod_tools",
        "Manifest": f"{__name__}.models",
        "ManifestEntry": f"{__name__}.models",
        "MethodConfig": f"{__name__}.base",
        "MethodOptions": f"{__name__}.base",
        "MethodResult": f"{__name__}.models",
        "PodLink": f"{__name__}.base",
        "PtyMethod": f"{__name__}.pty",
        "PtyOptions": f"{__name__}.pty",
        "RunpodctlMethod": f"{__name__}.runpodctl",
        "RunpodctlOptions": f"{__name__}.runpodctl",
        "S3Method": f"{__name__}.s3",
        "S3Target": f"{__name__}.s3",
        "SftpMethod": f"{__name__}.sftp",
        "TransferHooks": f"{__name__}.base",
        "TransferMethod": f"{__name__}.base",
        "TransferReport": f"{__name__}.models",
        "bootstrap_pod_tools": f"{__name__}.pod_tools",
        "check_tree": f"{__name__}.dispatch",
        "download_dir": f"{__name__}.dispatch",
        "method_names": f"{__name__}.registry",
        "pick_method": f"{__name__}.dispatch",
        "pod_manifest": f"{__name__}.pod_tools",
        "register_method": f"{__name__}.registry",
        "remote_path": f"{__name__}.pod_tools",
        "tools_dir": f"{__name__}.pod_tools",
        "upload_dir": f"{__name__}.dispatch",
    },
)
