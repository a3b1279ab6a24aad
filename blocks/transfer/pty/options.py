"""``PtyOptions``: the tuning of the ``pty`` transfer method (docs/architecture.md#the-pty-framing).

Checked when made, through the project's validation layer (``blocks.validation``), so
the flow, the CLI and a Python caller get the same one-sentence errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prefect_runpod.blocks import validation as v
from prefect_runpod.blocks.defaults import PTY_FRAMING_CHOICES
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.pod_side.frame_codec import DEFAULT_CHUNK_BYTES, DEFAULT_LINE_CHARS
from prefect_runpod.blocks.transfer.base import MethodOptions

__all__ = ["FRAMING_CHOICES", "PtyOptions"]

FRAMING_CHOICES = PTY_FRAMING_CHOICES
"""What ``framing`` accepts (``blocks.defaults.PTY_FRAMING_CHOICES``)."""

DEFAULT_MIN_WINDOW_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_WINDOW_BYTES = 64 * 1024 * 1024


@dataclass
class PtyOptions(MethodOptions):
    """Tuning of the ``pty`` method.

    Attributes:
        chunk_bytes: payload bytes per frame.
        window_bytes: payload bytes in flight before waiting for acknowledgements;
            None (the default) sizes the window to the path: at least twice the
            bandwidth-delay product (round trip measured at the start, bandwidth from
            the acknowledgements), between ``min_window_bytes`` and ``max_window_bytes``.
        min_window_bytes / max_window_bytes: the bounds of a window sized to the path.
        line_chars: base64 characters per line (under the tty's 4096-byte limit).
        compress: ``auto`` (default) zlib-compresses the chunks of a file when a
            64 KiB sample of it shrinks below 90 % (text, JSON), never random or
            already-compressed data (safetensors weights); True compresses every chunk
            that gets smaller; False never compresses.
        framing: ``auto``, ``raw`` or ``base64`` (``FRAMING_CHOICES``).
        streams: PTY sessions a transfer stripes large files over (1 to 16); more than
            one opens that many SSH connections, for gateways that cap each session's
            bandwidth.
        stall_seconds: seconds of silence while waiting before asking the receiver
            where it is.
        ready_timeout_seconds: seconds the receiver may take to start.
        max_reconnects: dropped connections survived before giving up (per session).
        python: the pod's interpreter.
        shell_prefix: shell text run before the receiver in the same subshell
            (e.g. ``ulimit -f 64;``); never secrets.

    Raises:
        SpecError: a framing that is not one of ``FRAMING_CHOICES``, a stream count
            outside 1–16, or a size that is not positive.
    """

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    window_bytes: int | None = None
    min_window_bytes: int = DEFAULT_MIN_WINDOW_BYTES
    max_window_bytes: int = DEFAULT_MAX_WINDOW_BYTES
    line_chars: int = DEFAULT_LINE_CHARS
    compress: bool | Literal["auto"] = "auto"
    framing: str = "auto"
    streams: int = 1
    stall_seconds: float = 15.0
    ready_timeout_seconds: float = 60.0
    max_reconnects: int = 5
    python: str = "python3"
    shell_prefix: str = ""

    def __post_init__(self) -> None:
        v.check_choice("pty_framing", self.framing, FRAMING_CHOICES)
        streams = v.check_number("pty_streams", self.streams)
        assert streams is not None
        self.streams = int(streams)
        if self.compress not in (True, False, "auto"):
            raise SpecError(
                f"PtyOptions.compress must be auto, True or False, not {self.compress!r}"
            )
        sizes = {
            "chunk_bytes": self.chunk_bytes,
            "min_window_bytes": self.min_window_bytes,
            "max_window_bytes": self.max_window_bytes,
            "line_chars": self.line_chars,
        }
        if self.window_bytes is not None:
            sizes["window_bytes"] = self.window_bytes
        for name, size in sizes.items():
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise SpecError(
                    f"PtyOptions.{name} must be a positive number of bytes, not {size!r}"
                )
