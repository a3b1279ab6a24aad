"""The byte layer under ``PodConsole``: a paramiko channel read while written, and
``PtyStream``, a command that owns the raw tty (for framed file transfer).

A PTY deadlocks when a client only writes: the remote side's output fills the SSH
window, the remote stops reading input, and the client's write blocks for ever
(observed). So every write here drains what has arrived before each bounded wait for
send window. Reads block on paramiko's buffer (no polling), in large pieces: with an
8 MiB channel window a raw-mode PTY moved 80 MiB/s on loopback (docs/architecture.md#transfers-and-integrity).

Writes go out in whole packets. OpenSSH's sshd hands a PTY's input to the tty a few KiB
at a time and returns window for each piece; sending into every such sliver of window
(paramiko's own ``send`` does) split a 64 MiB upload into about 4,400 packets, half of
them under 16 KiB. Waiting for room for a whole packet (or for what is left to send)
keeps it at about 2,300.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable

import paramiko

from prefect_runpod.blocks.exceptions import (
    CommandTimeoutError,
    ConsoleConnectError,
    ConsoleError,
)

__all__ = ["ChannelIO", "PtyStream"]

_RECV_BYTES = 1 << 20
_PACKET_HEADER_BYTES = 64
"""What paramiko keeps of the peer's maximum packet for the packet's own fields: a
packet carries at most ``out_max_packet_size`` less this (32,704 bytes with OpenSSH)."""
_SEND_WAIT_SECONDS = 0.05


class ChannelIO:
    """Blocking reads and draining writes on one paramiko channel.

    Args:
        channel: an open session channel (PTY shell).
        on_drop: builds the exception to raise when the channel or connection is gone
            (given the low-level exception, or None at end of stream).
    """

    def __init__(
        self,
        channel: paramiko.Channel,
        on_drop: Callable[[BaseException | None], ConsoleConnectError],
    ) -> None:
        self._channel = channel
        self._on_drop = on_drop
        # The window the peer granted at the start, halved: waiting for more room than
        # that would wait on a peer that returns window once half of it is used.
        self._enough_window_bytes = max(1, channel.out_window_size // 2)

    def recv(self, timeout_seconds: float) -> bytes:
        """Wait up to ``timeout_seconds`` for bytes; b"" when none came.

        Raises:
            ConsoleConnectError: the channel closed (end of stream) or the link failed.
        """
        channel = self._channel
        channel.settimeout(max(timeout_seconds, 0.001))
        try:
            data = channel.recv(_RECV_BYTES)
        except TimeoutError:
            return b""
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self._on_drop(exc) from exc
        if not data:
            raise self._on_drop(None)
        return data

    def drain(self, sink: Callable[[bytes], None]) -> None:
        """Hand everything already received to ``sink`` without waiting."""
        channel = self._channel
        while channel.recv_ready():
            data = channel.recv(_RECV_BYTES)
            if not data:
                return
            sink(data)

    def send(
        self, data: bytes, sink: Callable[[bytes], None], timeout_seconds: float = 60.0
    ) -> None:
        """Send all of ``data``, handing arriving bytes to ``sink`` meanwhile.

        Raises:
            ConsoleError: no byte could be sent for ``timeout_seconds`` (the remote
                side is not reading its input).
            ConsoleConnectError: the channel closed or the link failed.
        """
        channel = self._channel
        packet_bytes = max(1, channel.out_max_packet_size - _PACKET_HEADER_BYTES)
        offset = 0
        stalled_since = time.monotonic()
        while offset < len(data):
            self.drain(sink)
            sent: int | None = None
            if self._window_for(min(len(data) - offset, packet_bytes)):
                channel.settimeout(_SEND_WAIT_SECONDS)
                try:
                    sent = channel.send(data[offset : offset + packet_bytes])
                except TimeoutError:
                    pass
                except (OSError, EOFError, paramiko.SSHException) as exc:
                    raise self._on_drop(exc) from exc
            if sent is None:
                self._check_stall(stalled_since, timeout_seconds)
                continue
            if sent <= 0:
                raise self._on_drop(None)
            offset += sent
            stalled_since = time.monotonic()
        self.drain(sink)

    def _window_for(self, size_bytes: int) -> bool:
        """Wait up to ``_SEND_WAIT_SECONDS`` for the peer's window to hold ``size_bytes``
        (at most ``_enough_window_bytes``). True once it does, once the channel closed
        (the send then reports the drop), or once a whole wait passed with no window
        returned: a peer that returns window only when all of it is used must be sent
        the sliver that is left."""
        channel = self._channel
        want = min(size_bytes, self._enough_window_bytes)
        if channel.out_window_size >= want:
            return True
        with channel.lock:
            if (
                channel.out_window_size < want
                and not channel.closed
                and not channel.out_buffer_cv.wait(_SEND_WAIT_SECONDS)
            ):
                return True
            return channel.out_window_size >= want or channel.closed

    @staticmethod
    def _check_stall(stalled_since: float, timeout_seconds: float) -> None:
        if time.monotonic() - stalled_since > timeout_seconds:
            raise ConsoleError(
                f"the pod's shell accepted no input for {timeout_seconds:g} s; the "
                "command is not reading what is sent. Next: check the command; the "
                "next command opens a fresh session"
            )

    def close(self) -> None:
        """Close the channel (idempotent)."""
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self._channel.close()


class PtyStream:
    """A command that owns the tty, as a byte stream (``PodConsole.open_stream``).

    The command's output is returned exactly as sent (raw tty: no ``\\r\\n``
    translation). The end is known from the console's sentinel prompt, which is never
    returned as data; a trailing piece of output that could be the start of that
    sentinel (at most ~24 bytes) is held back until more bytes arrive.

    Attributes:
        exit_code: the command's exit code once it has ended, else None.
    """

    def __init__(
        self,
        io: ChannelIO,
        marker: bytes,
        on_end: Callable[[bytes, int | None], None],
        *,
        pod_id: str | None = None,
    ) -> None:
        self._io = io
        self._head = marker + b":"
        # \r* : a gateway path that turns every LF into CR LF makes a sane tty's
        # CR LF arrive as CR CR LF.
        self._full = re.compile(re.escape(self._head) + rb"(\d+)\r*\n")
        self._partial = re.compile(rb"\d*\r*\Z")
        self._on_end = on_end
        self._pod_id = pod_id
        self._buf = bytearray()
        self._avail = 0  # bytes at the start of _buf that are command output for sure
        self._scanned = 0
        self._rest = b""  # bytes after the sentinel (back to the console)
        self.exit_code: int | None = None
        self._finished = False

    @property
    def ended(self) -> bool:
        """True once the command has exited (its remaining output may still be read)."""
        return self.exit_code is not None

    def write(self, data: bytes, *, timeout_seconds: float = 60.0) -> None:
        """Send ``data`` to the command's stdin, reading its output meanwhile (so
        neither side's window can fill up and deadlock).

        Raises:
            ConsoleError: the command already ended, or accepted nothing for
                ``timeout_seconds``.
            ConsoleConnectError: the connection dropped.
        """
        if self.ended or self._finished:
            raise ConsoleError(
                f"pod {self._pod_id}: the stream's command has ended; nothing can be written",
                pod_id=self._pod_id,
            )
        self._io.send(data, self._feed, timeout_seconds)

    def read(self, max_bytes: int = 65536, timeout_seconds: float = 1.0) -> bytes:
        """Up to ``max_bytes`` of output, waiting up to ``timeout_seconds`` for some.

        Returns:
            The bytes; b"" on timeout or once all output has been read (see ``ended``).

        Raises:
            ConsoleConnectError: the connection dropped.
        """
        if self._avail == 0 and not self.ended:
            deadline = time.monotonic() + timeout_seconds
            while self._avail == 0 and not self.ended:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._feed(self._io.recv(remaining))
        return self._take(min(max_bytes, self._avail))

    def read_until(self, marker: bytes, timeout_seconds: float) -> bytes:
        """Output up to and including the first ``marker``.

        Raises:
            CommandTimeoutError: no ``marker`` within ``timeout_seconds`` (the bytes
                read so far stay buffered).
            ConsoleError: the command ended without printing ``marker``.
            ConsoleConnectError: the connection dropped.
        """
        deadline = time.monotonic() + timeout_seconds
        pos = 0
        while True:
            idx = self._buf.find(marker, pos, self._avail)
            if idx >= 0:
                return self._take(idx + len(marker))
            pos = max(0, self._avail - len(marker) + 1)
            if self.ended:
                raise ConsoleError(
                    f"pod {self._pod_id}: the stream's command exited ({self.exit_code}) "
                    f"before printing {marker!r}",
                    pod_id=self._pod_id,
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeoutError(
                    f"pod {self._pod_id}: no {marker!r} from the stream within "
                    f"{timeout_seconds:g} s",
                    timeout_seconds=timeout_seconds,
                    pod_id=self._pod_id,
                )
            self._feed(self._io.recv(remaining))

    def finish(self, timeout_seconds: float = 30.0) -> int:
        """Wait for the command to exit (unread output is discarded); the tty is back
        in sane mode with echo off and the console at its prompt.

        Returns:
            The command's exit code.

        Raises:
            CommandTimeoutError: it did not exit in time (a raw tty ignores Ctrl-C: the
                console resyncs, or opens a fresh session, before its next command).
            ConsoleConnectError: the connection dropped.
        """
        if self._finished:
            assert self.exit_code is not None
            return self.exit_code
        deadline = time.monotonic() + timeout_seconds
        while not self.ended:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._finished = True
                self._on_end(b"", None)
                raise CommandTimeoutError(
                    f"pod {self._pod_id}: the stream's command did not exit within "
                    f"{timeout_seconds:g} s; the console resyncs before its next command "
                    "(opening a fresh session if the command still holds the tty)",
                    timeout_seconds=timeout_seconds,
                    pod_id=self._pod_id,
                )
            self._feed(self._io.recv(remaining))
        self._finished = True
        self._buf.clear()
        self._avail = 0
        self._on_end(self._rest, self.exit_code)
        assert self.exit_code is not None
        return self.exit_code

    def _take(self, n: int) -> bytes:
        if n <= 0:
            return b""
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self._avail -= n
        self._scanned = max(0, self._scanned - n)
        return out

    def _feed(self, data: bytes) -> None:
        if self.ended:
            self._rest += data
            return
        self._buf += data
        buf, head = self._buf, self._head
        pos = max(0, self._scanned - len(head))
        while True:
            idx = buf.find(head, pos)
            if idx < 0:
                break
            match = self._full.match(buf, idx)
            if match is not None:
                self.exit_code = int(match.group(1))
                self._rest = bytes(buf[match.end() :])
                del buf[idx:]
                self._avail = self._scanned = len(buf)
                return
            if self._partial.match(buf, idx + len(head)):
                self._avail = self._scanned = idx  # may still become the sentinel
                return
            pos = idx + 1
        hold = 0
        for k in range(min(len(head) - 1, len(buf)), 0, -1):
            if buf.endswith(head[:k]):
                hold = k
                break
        self._avail = len(buf) - hold
        self._scanned = len(buf)
