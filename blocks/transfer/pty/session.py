"""One receiver behind one PTY stream, and the handshake that decides how bytes travel
(docs/architecture.md#the-pty-framing).

A ``Session`` writes control lines and frames to the pod's receiver and parses what it
answers. ``Session.handshake`` hears the receiver's ``#READY`` and settles, once per
transfer, what every session of it will use (``LinkState``): the protocol (this side's,
or a receiver one version older), the framing (raw frames only when the probe carried
every byte value both ways unchanged, after the receiver put its tty in raw mode), and
the round trip, which sizes the window (``PathWindow``). ``resilient`` runs a session's
work again after a dropped connection, from what the receiver kept.
"""

from __future__ import annotations

import json
import logging
import secrets
import shlex
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from prefect_runpod.blocks.exceptions import ConsoleError, TransferError
from prefect_runpod.blocks.pod_side import frame_codec as codec
from prefect_runpod.blocks.pod_side.receiver import PROTOCOL_VERSION
from prefect_runpod.blocks.transfer.base import TransferHooks, is_disk_full
from prefect_runpod.blocks.transfer.pty.options import PtyOptions

__all__ = [
    "OLDEST_RECEIVER",
    "ByteStream",
    "Dropped",
    "LinkState",
    "PathWindow",
    "Session",
    "receiver_command",
    "resilient",
]

log = logging.getLogger("prefect_runpod.transfer.pty")

OLDEST_RECEIVER = 3
"""The oldest receiver protocol this side still speaks (base64 frames, one session)."""
_PROBE_TIMEOUT_SECONDS = 15.0
_STATS_TIMEOUT_SECONDS = 5.0
_BLOB_TRIES = 3
_R = TypeVar("_R")


class ByteStream(Protocol):
    """The byte pipe the protocol runs over (``PtyStream`` satisfies it)."""

    def write(self, data: bytes) -> None: ...

    def read(self, max_bytes: int = 65536, timeout_seconds: float = 1.0) -> bytes: ...

    def finish(self, timeout_seconds: float = 30.0) -> int: ...


class Dropped(Exception):
    """The stream died or went silent; reconnect and resume."""


DROP_ERRORS: tuple[type[BaseException], ...] = (ConsoleError, OSError, EOFError)
try:  # paramiko's errors when a channel dies under us
    import paramiko

    DROP_ERRORS = (*DROP_ERRORS, paramiko.SSHException)
except ImportError:  # pragma: no cover
    pass


@dataclass
class LinkState:
    """What the first session's handshake settled, shared by every session of a transfer.

    Attributes:
        protocol: the receiver's protocol version (``PROTOCOL_VERSION``, or one older).
        framing: ``raw`` or ``base64``.
        probe: ``passed``, ``failed`` or ``skipped``; None until a handshake ran.
        probe_detail: what the probe saw each way, or why it did not run.
        rtt_seconds: the shortest round trip measured (``#PING``), None before.
        pod_peak_rss_bytes: the largest peak RSS a receiver reported at its end.
    """

    protocol: int = 0
    framing: str = "base64"
    probe: str | None = None
    probe_detail: str = ""
    rtt_seconds: float | None = None
    pod_peak_rss_bytes: int = 0


class PathWindow:
    """Payload bytes one session may keep in flight: at least twice the bandwidth-delay
    product, bandwidth being the acknowledged rate over the last few round trips and
    delay the shortest round trip seen, kept within ``[floor, cap]``; or a fixed size.

    Args:
        rtt_seconds: the round trip measured at the start (None: unknown yet).
        options: ``window_bytes`` (fixed when set), ``min_window_bytes``,
            ``max_window_bytes``.
    """

    def __init__(self, rtt_seconds: float | None, options: PtyOptions) -> None:
        self.fixed = options.window_bytes
        self.floor = options.min_window_bytes
        self.cap = max(options.min_window_bytes, options.max_window_bytes)
        self.rtt = rtt_seconds
        self.bytes = self.fixed or self.floor
        self.peak = self.bytes
        self._samples: deque[tuple[float, int]] = deque()

    def on_rtt(self, seconds: float) -> None:
        """A round trip seen (a ping, or a chunk's time to its acknowledgement)."""
        if seconds > 0 and (self.rtt is None or seconds < self.rtt):
            self.rtt = seconds

    def on_acked(self, acked_total: int, now: float | None = None) -> int:
        """Account ``acked_total`` bytes acknowledged so far; returns the window."""
        if self.fixed:
            return self.fixed
        now = time.monotonic() if now is None else now
        samples = self._samples
        samples.append((now, acked_total))
        span = max(0.25, 4 * (self.rtt or 0.0))
        while len(samples) > 2 and now - samples[1][0] >= span:
            samples.popleft()
        t0, b0 = samples[0]
        if self.rtt is not None and now - t0 >= span / 2:
            rate = (acked_total - b0) / (now - t0)
            self.bytes = int(min(self.cap, max(self.floor, 2 * rate * self.rtt)))
            self.peak = max(self.peak, self.bytes)
        return self.bytes


def receiver_command(tools_dir: str, remote_root: str, opts: PtyOptions, window: int) -> str:
    """The shell command that starts the receiver (in a subshell, so a prefix such as
    ``ulimit`` does not stick to the console's shell). Its arguments are the ones every
    receiver since protocol 3 takes, so an older one still starts and names its version."""
    cmd = (
        f"{shlex.quote(opts.python)} -u {shlex.quote(tools_dir + '/receiver.py')} "
        f"--root {shlex.quote(remote_root)} --chunk-bytes {opts.chunk_bytes} "
        f"--window-bytes {window} --line-chars {opts.line_chars}"
    )
    return f"({opts.shell_prefix} exec {cmd})" if opts.shell_prefix else cmd


class Session:
    """One receiver process behind one stream.

    Args:
        stream: the receiver's stream (its command already started).
        hooks: fault points.
        opts: the method's options.
        pod: the pod id, for messages.
    """

    def __init__(self, stream: ByteStream, hooks: TransferHooks, opts: PtyOptions, pod: str):
        self.stream, self.hooks, self.opts, self.pod = stream, hooks, opts, pod
        self.parser = codec.FrameParser()
        self.last_rx = time.monotonic()
        self.link = LinkState()
        self.backlog: list[tuple[str, Any]] = []

    @property
    def framing(self) -> str:
        """The framing this session sends data frames in."""
        return self.link.framing

    @property
    def modern(self) -> bool:
        """True when the receiver speaks this side's protocol (segments, ranges, ``#W``)."""
        return self.link.protocol >= int(PROTOCOL_VERSION)

    def write(self, data: bytes) -> None:
        try:
            self.stream.write(data)
        except DROP_ERRORS as exc:
            raise Dropped(str(exc)) from exc

    def line(self, *fields: object) -> None:
        self.write((" ".join(str(f) for f in fields) + "\n").encode("ascii"))

    def poll(self, timeout_seconds: float) -> list[tuple[str, Any]]:
        """The events that arrive within ``timeout_seconds`` (those a wait set aside
        first)."""
        if self.backlog:
            events, self.backlog = self.backlog, []
            return events
        try:
            data = self.stream.read(1 << 20, timeout_seconds)
        except DROP_ERRORS as exc:
            raise Dropped(str(exc)) from exc
        if not data:
            if getattr(self.stream, "ended", False):
                code = getattr(self.stream, "exit_code", "?")
                raise Dropped(f"the receiver exited (code {code})")
            return []
        self.last_rx = time.monotonic()
        return self.parser.feed(self.hooks.data_in(data))

    def wait_for(
        self, want: Callable[[str, Any], bool], timeout_seconds: float, what: str
    ) -> tuple[str, Any]:
        """The first event ``want`` accepts; the others stay queued for ``poll``.

        Raises:
            Dropped: none within ``timeout_seconds``, or the stream ended.
        """
        deadline = time.monotonic() + timeout_seconds
        kept: list[tuple[str, Any]] = []
        try:
            while time.monotonic() < deadline:
                events = self.poll(0.5)
                for i, (kind, ev) in enumerate(events):
                    if want(kind, ev):
                        kept.extend(events[i + 1 :])
                        return kind, ev
                    kept.append((kind, ev))
            raise Dropped(f"no {what} within {timeout_seconds:.0f} s")
        finally:
            self.backlog = kept + self.backlog

    # -- the handshake -----------------------------------------------------------------

    def handshake(self, link: LinkState, first: bool) -> None:
        """Hear ``#READY`` and settle how this session talks: the first session of a
        transfer measures the round trip and probes the path (``link`` is filled in),
        later ones take what it settled.

        Raises:
            TransferError: the receiver did not start, speaks a protocol this side
                cannot (both versions named), or ``framing="raw"`` was asked for and
                the probe failed.
            Dropped: the stream died or stayed silent.
        """
        try:
            _, ready = self.wait_for(
                lambda k, e: k == "line" and e[0] == "#READY",
                self.opts.ready_timeout_seconds,
                "#READY from the pod's receiver",
            )
        except Dropped as exc:
            if getattr(self.stream, "ended", False):
                raise TransferError(
                    f"pod {self.pod}: the receiver did not start ({exc}); check that "
                    f"`{self.opts.python}` runs on the pod and the tools are installed",
                    pod_id=self.pod,
                ) from exc
            raise
        version = self._version(ready)
        if first:
            link.protocol = version
        self.link = link
        if version < int(PROTOCOL_VERSION):
            if self.opts.framing == "raw":
                raise TransferError(
                    f"pod {self.pod}: raw frames were asked for, but the pod's receiver "
                    f"speaks protocol {version} and this side {PROTOCOL_VERSION}; raw "
                    "frames need protocol 4: rerun so the pod tools are copied again, or "
                    "use framing auto or base64 (--pty-framing)",
                    pod_id=self.pod,
                )
            if first:
                link.framing, link.probe = "base64", "skipped"
                link.probe_detail = (
                    f"the pod's receiver speaks protocol {version}, this side "
                    f"{PROTOCOL_VERSION}: protocol {version} has base64 frames only"
                )
                log.warning(
                    "pod %s: the receiver speaks protocol %s and this side %s; continuing "
                    "with protocol %s (base64 frames, one stream). A rerun copies the "
                    "current pod tools.",
                    self.pod,
                    version,
                    PROTOCOL_VERSION,
                    version,
                )
            return
        input_kind = ready[2] if len(ready) > 2 else "cooked"
        if first:
            self._first_contact(link, input_kind)
        self.line("#FRAMING", link.framing)
        auto = self.opts.compress == "auto"
        self.line("#Z", "auto" if auto else int(bool(self.opts.compress)))

    def _version(self, ready: list[str]) -> int:
        text = ready[1] if len(ready) > 1 else "?"
        version = int(text) if text.isdigit() else -1
        if OLDEST_RECEIVER <= version <= int(PROTOCOL_VERSION):
            return version
        newer = version > int(PROTOCOL_VERSION)
        raise TransferError(
            f"pod {self.pod}: the receiver speaks protocol {text} and this side speaks "
            f"{PROTOCOL_VERSION} (and {OLDEST_RECEIVER} and later); "
            + (
                "update prefect-runpod here, or "
                if newer
                else "the pod holds old tools (a shared or persistent tools folder?): "
            )
            + "rerun so the pod tools are copied again",
            pod_id=self.pod,
        )

    def _first_contact(self, link: LinkState, input_kind: str) -> None:
        """Measure the round trip (one ``#PING``) and, unless base64 was asked for or
        the tty stayed cooked, probe the path in the same flight; settle the framing."""
        asked = self.opts.framing
        detail = ""
        if asked == "base64":
            detail = "base64 asked for"
        elif input_kind not in ("raw", "pipe"):
            detail = f"the pod's tty could not be put in raw mode ({input_kind})"
            self._refuse_raw(asked, detail)
        token = secrets.token_hex(8)
        if detail:
            self._ping(link, token)
            link.framing, link.probe, link.probe_detail = "base64", "skipped", detail
            return
        try:
            self._ping(link, token, probe=True)
            ok, detail = self._probe_answers(token)
        except Dropped:
            if asked == "auto":  # a path that breaks on some byte value: base64 from now on
                link.framing, link.probe = "base64", "failed"
                link.probe_detail = "the session dropped during the probe"
            raise
        link.probe, link.probe_detail = ("passed" if ok else "failed"), detail
        if not ok:
            self._refuse_raw(asked, detail)
        link.framing = "raw" if ok else "base64"

    def _ping(self, link: LinkState, token: str, probe: bool = False) -> None:
        """Send ``#PING`` (and the probe right after it, in the same flight); note the
        round trip once ``#PONG`` is back."""
        sent = time.monotonic()
        self.line("#PING", token)
        if probe:
            self.write(codec.probe_block(token))
        self.wait_for(
            lambda k, e: k == "line" and e[:2] == ["#PONG", token],
            self.opts.stall_seconds,
            "answer to #PING",
        )
        link.rtt_seconds = time.monotonic() - sent

    def _refuse_raw(self, asked: str, detail: str) -> None:
        if asked == "raw":
            raise TransferError(
                f"pod {self.pod}: raw frames were asked for, but the path does not carry "
                f"every byte value unchanged ({detail}); use framing auto or base64 "
                "(--pty-framing)",
                pod_id=self.pod,
            )

    def _probe_answers(self, token: str) -> tuple[bool, str]:
        """The verdicts of the probe sent with ``token`` (the receiver's tty is raw
        already): ``(ok, what each direction saw)``. A path that drops the session on
        the probe's bytes raises ``Dropped``; the caller then settles for base64."""
        _, answer = self.wait_for(
            lambda k, e: k == "line" and e[:2] == ["#PROBED", token],
            _PROBE_TIMEOUT_SECONDS,
            "probe verdict",
        )
        up_ok = answer[2:3] == ["ok"]
        try:
            up_detail = codec.unb64text(answer[3])
        except (IndexError, ValueError):
            up_detail = "no detail"
        _, echo = self.wait_for(
            lambda k, e: k == "probe" and e[0] == token, _PROBE_TIMEOUT_SECONDS, "probe back"
        )
        down_ok, down_detail = codec.probe_verdict(echo[1])
        detail = f"flow→pod: {up_detail}; pod→flow: {down_detail}"
        return up_ok and down_ok, detail

    # -- blobs and the end -------------------------------------------------------------

    def blob(self, request: dict[str, Any], timeout_seconds: float) -> dict[str, Any]:
        """Send a JSON request in an ``M`` frame and return the receiver's JSON answer
        (asked again, twice at most, when the answer arrives damaged).

        Raises:
            Dropped: no answer within ``timeout_seconds``, or only damaged ones.
        """
        body = json.dumps(request).encode()
        for _ in range(_BLOB_TRIES):
            self.write(codec.encode_frame("M", 0, 0, body, True, self.opts.line_chars))
            _, frame = self.wait_for(
                lambda k, e: k == "frame" and e.fid == "M", timeout_seconds, "manifest answer"
            )
            if frame.raw is not None:
                result: dict[str, Any] = json.loads(frame.raw)
                return result
        raise Dropped(f"manifest answer garbled {_BLOB_TRIES} times ({frame.error})")

    def close(self) -> None:
        """End the receiver (``#BYE``), noting the peak memory it reports."""
        try:
            self.line("#BYE")
            if self.modern:
                _, stats = self.wait_for(
                    lambda k, e: k == "line" and e[0] == "#STATS",
                    _STATS_TIMEOUT_SECONDS,
                    "#STATS",
                )
                if len(stats) > 1 and stats[1].isdigit():
                    rss = int(stats[1]) * 1024
                    self.link.pod_peak_rss_bytes = max(self.link.pod_peak_rss_bytes, rss)
            self.stream.finish(30.0)
        except (Dropped, *DROP_ERRORS):  # type: ignore[misc]
            pass


def resilient(
    work: Callable[[Session], _R],
    open_stream: Callable[[str], ByteStream],
    command: str,
    reconnect: Callable[[], None] | None,
    hooks: TransferHooks,
    opts: PtyOptions,
    pod: str,
    link: LinkState,
    first: bool,
) -> tuple[_R, int]:
    """Run ``work`` on a fresh session, and again after each dropped connection (after
    ``reconnect``), at most ``opts.max_reconnects`` times.

    A drop during the first handshake's probe settles the link for base64 (with
    ``framing="auto"``): a path that breaks on some byte value is no path for raw frames.

    Returns:
        ``(work's result, reconnects)``.

    Raises:
        TransferError: the connection dropped too often (the pod named, and that
            finished files are kept).
        OSError: this machine's disk is full (``is_disk_full``), raised at once.
    """
    reconnects = 0
    while True:
        session = None
        try:
            session = Session(open_stream(command), hooks, opts, pod)
            session.handshake(link, first and link.probe is None)
            result = work(session)
            session.close()
            return result, reconnects
        except (Dropped, *DROP_ERRORS) as exc:  # type: ignore[misc]
            if is_disk_full(exc):  # this machine's disk, not the connection: no retry
                if session is not None:
                    session.close()
                raise
            reconnects += 1
            if reconnects > opts.max_reconnects or reconnect is None:
                raise TransferError(
                    f"pty transfer to pod {pod} lost its connection {reconnects} times "
                    f"(last: {exc}); check the pod is running, then rerun — finished "
                    "files are kept and partial ones resume",
                    pod_id=pod,
                ) from exc
            reconnect()
        except BaseException:
            if session is not None:
                session.close()  # end the receiver so the console is usable again
            raise
