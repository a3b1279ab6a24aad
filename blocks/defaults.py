"""Choices and defaults the CLI's ``--help`` shows that are not a run parameter's (those
are declared in ``blocks.validation.parameters``), in a module that imports nothing:
``prefect-runpod --help`` reads them without loading the transfer methods, paramiko or
Prefect. Each is re-exported where it belongs (``blocks.provider``,
``blocks.transfer.pty.options``, ``blocks.transfer.dispatch``)."""

from __future__ import annotations

__all__ = ["BUILT_IN_TRANSFER_METHODS", "PTY_FRAMING_CHOICES", "REAPER_TTL_GRACE_SECONDS"]

REAPER_TTL_GRACE_SECONDS = 600.0
"""What the reaper adds to a pod's recorded lifetime for its default TTL (10 min): the
dead-man acts first, the reaper after it, however fresh the heartbeat."""

PTY_FRAMING_CHOICES = ("auto", "raw", "base64")
"""``auto``: raw frames when the probe finds that every byte value survives the path,
base64 otherwise; ``raw``: raw frames or a clear error when the probe fails;
``base64``: base64 frames without a probe."""

BUILT_IN_TRANSFER_METHODS = ("pty", "sftp", "rsync", "s3", "runpodctl")
"""The transfer methods that ship with prefect-runpod, in the order messages list them
(``blocks.transfer.registry.METHOD_REGISTRY`` registers them under these names)."""
