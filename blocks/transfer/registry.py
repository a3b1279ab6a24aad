"""Which transfer methods exist, by name: the one registry ``upload_dir``,
``download_dir``, ``pick_method`` and the parameter schema ask
(docs/architecture.md#transfers-and-integrity).

A name maps to a factory of a ``TransferMethod`` (:mod:`.base`). The built-in ones are
imported only when a transfer first builds one, so listing the names (``--help``, the
``transfer_method`` choices) loads neither the dispatcher nor paramiko nor boto3.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from prefect_runpod.blocks.defaults import BUILT_IN_TRANSFER_METHODS

if TYPE_CHECKING:
    from prefect_runpod.blocks.transfer.base import MethodConfig, MethodFactory, TransferMethod

__all__ = ["METHOD_REGISTRY", "method_names", "register_method"]


def _built_in(module: str, class_name: str) -> MethodFactory:
    """The factory of a method class in ``prefect_runpod.blocks.transfer.<module>``,
    imported on first use (``s3`` pulls in Prefect's blocks, ``sftp`` paramiko's SFTP)."""

    def build(config: MethodConfig) -> TransferMethod:
        cls = getattr(importlib.import_module(f"{__package__}.{module}"), class_name)
        method: TransferMethod = cls.from_config(config)
        return method

    return build


METHOD_REGISTRY: dict[str, MethodFactory] = {
    name: _built_in(name, class_name)
    for name, class_name in zip(
        BUILT_IN_TRANSFER_METHODS,
        ("PtyMethod", "SftpMethod", "RsyncMethod", "S3Method", "RunpodctlMethod"),
        strict=True,
    )
}
"""Every transfer method by name, in the order error messages list them."""


def method_names() -> tuple[str, ...]:
    """The registered method names (``pty``, ``sftp``, ``rsync``, ``s3``, ``runpodctl``, …)."""
    return tuple(METHOD_REGISTRY)


def register_method(name: str, factory: MethodFactory, *, replace: bool = False) -> None:
    """Make ``factory`` the method called ``name`` for ``upload_dir`` / ``download_dir``.

    Args:
        name: the name callers pass as ``method`` and ``TransferReport.method`` shows.
        factory: builds the method from the caller's ``MethodConfig`` (a class's
            ``from_config``, or the class itself when its constructor takes the config).
        replace: allow replacing a method already registered under ``name``.

    Raises:
        ValueError: ``name`` is ``auto`` or empty, or already taken and not ``replace``.
    """
    if not name or name == "auto":
        raise ValueError(f"{name!r} cannot name a transfer method")
    if name in METHOD_REGISTRY and not replace:
        raise ValueError(f"transfer method {name!r} is already registered; pass replace=True")
    METHOD_REGISTRY[name] = factory
