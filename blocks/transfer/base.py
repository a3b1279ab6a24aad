"""The ``TransferMethod`` protocol: one way of moving a tree between here and a pod
(docs/architecture.md#transfers-and-integrity).

Modelled on httpx's transports: ``upload_dir`` / ``download_dir``
(:mod:`prefect_runpod.blocks.transfer.dispatch`) do what every transfer shares — pick a
method, compute the source manifest, install the pod tools, time the transfer and
compare the two manifests — and hand the moving of bytes to a ``TransferMethod`` looked
up by name in a registry. A method moves files, verifies what landed, and answers with
one typed ``MethodResult``; it knows nothing of the other methods.

Adding a method is one module with a class that implements ``TransferMethod`` (and a
``from_config`` factory), plus one entry in ``registry.METHOD_REGISTRY`` — or
``registry.register_method`` at run time. A method may also define
``connecting(handle, console)``, a context manager that dispatch enters before it checks
the pod's tools and hashes the local tree and leaves after the transfer: what it starts
there (the rsync method's login) overlaps that work. Dispatch keeps that same method
object for the transfer when ``auto`` confirms it once the pod's end is known.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import DiskFullError
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult

if TYPE_CHECKING:
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.pod_handle import PodHandle
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = [
    "is_disk_full",
    "local_disk_full",
    "MethodConfig",
    "MethodFactory",
    "MethodOptions",
    "PodLink",
    "ProgressCallback",
    "TransferHooks",
    "TransferMethod",
]

ProgressCallback = Callable[[int, int], None]
"""``on_progress(done_bytes, total_bytes)``, called as payload bytes are confirmed."""


class TransferHooks:
    """Named fault points of a transfer. The default does nothing; fault tests override.

    ``frame_out(fid, offset, data) -> bytes`` sees each data frame before it is
    written; ``data_in(data) -> bytes`` sees what was read; ``progress(done_bytes)``
    runs after each acknowledged chunk (a test may drop the connection there). The
    ``pty`` method honours them; methods without frames ignore them.
    """

    def frame_out(self, fid: str, offset: int, data: bytes) -> bytes:
        return data

    def data_in(self, data: bytes) -> bytes:
        return data

    def progress(self, done_bytes: int) -> None:
        return None


class MethodOptions:
    """Base class of a method's own tuning (``PtyOptions``, ``RunpodctlOptions``).

    ``upload_dir`` / ``download_dir`` take one ``options`` object; the chosen method
    uses it when it is an instance of that method's options class and its own
    defaults otherwise (see ``MethodConfig.options_for``).
    """


_Options = TypeVar("_Options", bound=MethodOptions)


@dataclass(frozen=True)
class MethodConfig:
    """What the caller of ``upload_dir`` / ``download_dir`` gave; each method's factory
    takes the part it needs.

    Attributes:
        private_key: the SSH key, for a method that opens its own connection (``sftp``).
        s3: the bucket or network volume (``s3``).
        options: one method's options; read them with ``options_for``.
        hooks: fault points (``TransferHooks``), or None for none.
        follow_links: links that leave the tree are read through (their target's files
            travel in their place) instead of refused; in-tree relative links always
            travel as links.
    """

    private_key: SecretStr | None = None
    s3: S3Target | None = None
    options: MethodOptions | None = None
    hooks: TransferHooks | None = None
    follow_links: bool = False

    def options_for(self, kind: type[_Options]) -> _Options:
        """``options`` when it is a ``kind``, else ``kind()`` (that method's defaults)."""
        return self.options if isinstance(self.options, kind) else kind()


@dataclass(frozen=True)
class PodLink:
    """The pod end of one transfer, as dispatch hands it to a method.

    Attributes:
        handle: the pod (its id names it in errors; ``sftp`` reads its direct endpoint).
        console: an open console to the pod (``pty`` streams through it; the others run
            ``manifest.py`` and their own commands in it).
        tools_dir: the pod folder holding the pod-side scripts, already installed.
    """

    handle: PodHandle
    console: PodConsole
    tools_dir: str

    @property
    def pod_id(self) -> str:
        """The pod's id, for messages and errors."""
        return self.handle.pod_id


class TransferMethod(Protocol):
    """One way of moving a directory tree (or one file) to and from a pod.

    Attributes:
        auto_priority: rank for ``method="auto"``: of the methods that are available,
            the highest rank wins; None for a method used only when asked for by name.
    """

    auto_priority: int | None

    def unavailable(self, handle: PodHandle) -> str | None:
        """Why this method, as configured, cannot work for ``handle`` (a message that
        names the fix), or None when it can. Must not touch the network: it is asked
        before renting too, with a handle that describes the pod to be rented, so it
        checks this machine's end (a tool on the PATH, a target configured) and what the
        handle's endpoints offer."""
        ...

    def pod_unavailable(self, pod: PodLink) -> str | None:
        """Why this method cannot work with the pod as it is now that it runs (asked
        through its console, before any byte moves: a tool missing on the pod, say), or
        None when it can."""
        ...

    def upload(
        self,
        pod: PodLink,
        local_root: Path,
        remote_root: str,
        source: Manifest,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """Move the tree of ``source`` (the manifest of ``local_root``: files, empty
        directories, in-tree links) to the absolute pod folder ``remote_root``, then
        verify it on the pod. The caller's shell is left as it was (working directory,
        environment).

        Returns:
            ``MethodResult`` whose ``dest_manifest`` was computed on the pod from what
            is on its disk, and whose ``source_manifest`` is ``source``.

        Raises:
            ChecksumMismatchError: a file still differs after the method's retry (named).
            TransferError: the pod refused a write, or the connection was lost for good.
            SpecError: the method cannot run with what it was given.
        """
        ...

    def download(
        self,
        pod: PodLink,
        remote_root: str,
        local_root: Path,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """Move the tree at the absolute pod path ``remote_root`` (files, empty
        directories, in-tree links) into ``local_root``. A tree whose links leave it or
        dangle is refused before any byte moves (unless the method was configured with
        ``follow_links``).

        Returns:
            ``MethodResult`` whose ``source_manifest`` was computed on the pod and whose
            ``dest_manifest`` was re-read from the local disk.

        Raises:
            ChecksumMismatchError, TransferError, SpecError: as ``upload``.
        """
        ...


MethodFactory = Callable[[MethodConfig], TransferMethod]
"""Builds a method from the caller's ``MethodConfig``; the registry holds these."""


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write refused for want of space (``ENOSPC``, ``EDQUOT``) on
    this machine: no dropped connection, so never retried as one."""
    return isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS


def local_disk_full(local_root: Path, exc: OSError, pod: str) -> DiskFullError:
    """The one sentence for a download that filled this machine's disk: the side (this
    machine), the folder, its free and total space, and the way out.

    Args:
        local_root: the folder the download writes into.
        exc: the refused write (``is_disk_full``).
        pod: the pod id the download came from.
    """
    where = Path(local_root)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        usage = shutil.disk_usage(where)
        space = f"{_mib(usage.free)} free of {_mib(usage.total)}"
    except OSError:
        space = "free space unknown"
    return DiskFullError(
        f"the local disk is full: the download from pod {pod} into {local_root} stopped "
        f"({exc.strerror or exc}; {space} there). Free space on this machine or choose "
        "another output folder, then download again",
        pod_id=pod,
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
