"""The ``pty`` transfer method: files through a PodConsole tty, framed and acknowledged
(docs/architecture.md#the-pty-framing).

Works wherever a shell works, including RunPod's PTY-only gateway (no exec, no SFTP).
The flow side of the protocol whose pod side is
:mod:`prefect_runpod.blocks.pod_side.receiver`:

* the receiver puts its tty in raw mode, then a probe (every byte value, both ways)
  decides the framing: raw frames when the path carries bytes unchanged, base64 lines
  under the tty's 4096-byte limit otherwise (``PtyOptions.framing``);
* each chunk (default 256 KiB) carries a CRC-32 bound to its file and offset, and is
  zlib-compressed only when a sample of its file shrinks;
* chunks are pipelined in a window of at least twice the bandwidth-delay product
  (round trip measured at the start), never stop-and-wait; a bad or missing chunk
  sends the sender back to the receiver's verified offset (go-back-N with epochs);
* every file is verified whole (sha256) before it takes its name; a mismatch retries
  the file once, then raises :class:`ChecksumMismatchError` naming it;
* a dropped connection reconnects and resumes from the verified offset, kept on disk
  as ``<name>.part`` (+ ``.part.json`` sidecar);
* ``PtyOptions.streams`` > 1 stripes large files over that many SSH sessions.

The halves live in :mod:`.upload` and :mod:`.download`, the session and its
handshake in :mod:`.session`, the sessions' plan in :mod:`.lanes`, what they
share in :mod:`.run`. ``PtyMethod`` is the ``TransferMethod`` that runs them over
``PodConsole.open_stream`` (a ``PtyStream``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from prefect_runpod.blocks.transfer.base import (
    MethodConfig,
    PodLink,
    ProgressCallback,
    TransferHooks,
)
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult
from prefect_runpod.blocks.transfer.pty.download import pty_download
from prefect_runpod.blocks.transfer.pty.lanes import Lane
from prefect_runpod.blocks.transfer.pty.options import FRAMING_CHOICES, PtyOptions
from prefect_runpod.blocks.transfer.pty.session import ByteStream
from prefect_runpod.blocks.transfer.pty.upload import pty_upload

if TYPE_CHECKING:
    from prefect_runpod.blocks.pod_handle import PodHandle

__all__ = [
    "FRAMING_CHOICES",
    "ByteStream",
    "Lane",
    "PtyMethod",
    "PtyOptions",
    "pty_download",
    "pty_upload",
]


class PtyMethod:
    """The ``pty`` ``TransferMethod``: the framed protocol through the console's tty.

    Works wherever a shell works, so it is always available and the last choice of
    ``auto``.

    Args:
        options: tuning; default ``PtyOptions()``.
        hooks: fault points; default none.
        follow_links: downloads read links that leave the tree through.
        private_key: the SSH key, to open the extra sessions of ``options.streams`` > 1.
    """

    auto_priority: int | None = 10

    def __init__(
        self,
        options: PtyOptions | None = None,
        hooks: TransferHooks | None = None,
        *,
        follow_links: bool = False,
        private_key: SecretStr | None = None,
    ):
        self.options = options or PtyOptions()
        self.hooks = hooks
        self.follow_links = follow_links
        self.private_key = private_key

    @classmethod
    def from_config(cls, config: MethodConfig) -> PtyMethod:
        """The method with the caller's ``PtyOptions`` (if any), hooks, link choice and key."""
        return cls(
            config.options_for(PtyOptions),
            config.hooks,
            follow_links=config.follow_links,
            private_key=config.private_key,
        )

    def unavailable(self, handle: PodHandle) -> str | None:
        """None (a console is all it needs), unless several streams are asked for
        without the SSH key that opens them."""
        if self.options.streams > 1 and self.private_key is None:
            return (
                f"pty transfers over {self.options.streams} streams open more SSH sessions "
                f"to pod {handle.pod_id} and need the private key; pass private_key, or "
                "use one stream"
            )
        return None

    def pod_unavailable(self, pod: PodLink) -> str | None:
        """Always None: the receiver is one of the pod tools, already installed."""
        return None

    def _more_lanes(self, pod: PodLink) -> Callable[[], Lane] | None:
        """Makes one more session to the pod per extra stream (its own SSH connection,
        with the host key the console pinned and its reconnect policy)."""
        if self.options.streams <= 1 or self.private_key is None or pod.handle.ssh is None:
            return None
        from prefect_runpod.blocks.console.session import PodConsole

        key, console = self.private_key, pod.console
        endpoint = pod.handle.ssh.model_copy(
            update={"host_key": console.host_key or pod.handle.ssh.host_key}
        )

        def make() -> Lane:
            extra = PodConsole(endpoint, key, pod_id=pod.pod_id, reconnect=console.reconnect_policy)
            return Lane(extra.open_stream, extra.reconnect, extra.close)

        return make

    def upload(
        self,
        pod: PodLink,
        local_root: Path,
        remote_root: str,
        source: Manifest,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """``pty_upload`` over ``pod.console``, reconnecting it after a drop."""
        return pty_upload(
            pod.console.open_stream,
            pod.tools_dir,
            local_root,
            remote_root,
            source,
            reconnect=pod.console.reconnect,
            options=self.options,
            hooks=self.hooks,
            on_progress=on_progress,
            pod=pod.pod_id,
            more_lanes=self._more_lanes(pod),
        )

    def download(
        self,
        pod: PodLink,
        remote_root: str,
        local_root: Path,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """``pty_download`` over ``pod.console``, reconnecting it after a drop."""
        return pty_download(
            pod.console.open_stream,
            pod.tools_dir,
            remote_root,
            local_root,
            reconnect=pod.console.reconnect,
            options=self.options,
            hooks=self.hooks,
            on_progress=on_progress,
            pod=pod.pod_id,
            follow_links=self.follow_links,
            more_lanes=self._more_lanes(pod),
        )
