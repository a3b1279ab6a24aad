"""What a ``pty`` transfer moves, and over how many sessions (docs/architecture.md#the-pty-framing).

A transfer is a list of ``Piece``: a whole file, or — when it stripes over several PTY
sessions (``PtyOptions.streams``) — one segment of a large file. ``plan_lanes`` deals
the pieces out to the sessions ("lanes"); ``Crew`` runs the lanes after the first in
threads, each on its own SSH session and receiver, and stops them all when one fails.
``Tally`` adds up the bytes confirmed across lanes for progress and the fault point.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.exceptions import ConsoleError, TransferError
from prefect_runpod.blocks.pod_side import frame_codec as codec
from prefect_runpod.blocks.pod_side import part_files
from prefect_runpod.blocks.transfer.base import ProgressCallback, TransferHooks, is_disk_full

__all__ = ["MAX_REWINDS", "Crew", "Lane", "Piece", "Stopped", "Striped", "Tally", "plan_lanes"]

MAX_REWINDS = 20
"""A piece refused (or arriving damaged) this often in a row without progress fails."""
MIN_STRIPE_CHUNKS = 4
"""A file is striped only when each segment gets at least this many chunks."""
_JOIN_SECONDS = 0.5


@dataclass
class Lane:
    """One PTY session a transfer can use.

    Attributes:
        open_stream: runs a shell command in a raw tty and returns its stream.
        reconnect: re-opens the SSH connection after a drop (None: a drop is final).
        close: ends the session when the transfer is done (None: the caller owns it).
    """

    open_stream: Callable[[str], Any]
    reconnect: Callable[[], None] | None = None
    close: Callable[[], None] | None = None


@dataclass(eq=False)
class Piece:
    """A whole file, or the byte range ``[start, end)`` of one (segment ``index``), as
    one session moves it; the sender's and receiver's state for it.

    ``next`` is the next offset to send (upload) or expected (download), ``acked`` the
    end of what the far side confirmed, ``epoch`` the restart counter that makes stale
    answers ignorable, ``counted`` the bytes of it already in the ``Tally``.
    """

    fid: str
    rel: str
    size: int
    sha256: str
    local: Path | None = None
    start: int = 0
    end: int = -1
    index: int = 0
    next: int = 0
    acked: int = 0
    epoch: int = 0
    close_sent: bool = False
    done: bool = False
    bad: int = 0
    rewinds: int = 0
    counted: int = 0
    compress: bool = False
    fh: Any = None
    part: part_files.PartFile | None = None

    def __post_init__(self) -> None:
        if self.end < 0:
            self.end = self.size
        self.next = self.acked = self.start

    @property
    def segment(self) -> bool:
        """True for one segment of a striped file."""
        return self.start != 0 or self.end != self.size

    def whole(self) -> Piece:
        """The whole file this piece belongs to, as one fresh piece."""
        return Piece(self.fid, self.rel, self.size, self.sha256, self.local)

    def close(self) -> None:
        """Close its local file handles."""
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        if self.part is not None:
            self.part.close()


def choose_compression(piece: Piece, mode: bool | str) -> bool:
    """Whether ``piece``'s chunks are compressed: ``mode`` True/False, or for ``auto``
    whether a sample from its start shrinks (``frame_codec.worth_compressing``)."""
    if mode != "auto":
        return bool(mode)
    assert piece.local is not None
    with open(piece.local, "rb") as fh:
        fh.seek(piece.start)
        return codec.worth_compressing(fh.read(codec.COMPRESS_SAMPLE_BYTES))


@dataclass
class Striped:
    """A file sent as segments: its whole-file piece and the segments' offsets."""

    piece: Piece
    bounds: list[int] = field(default_factory=list)


def plan_lanes(
    files: list[Piece], lanes: int, chunk_bytes: int
) -> tuple[list[list[Piece]], list[Striped]]:
    """Deal ``files`` out to ``lanes`` sessions.

    A file of at least ``lanes × MIN_STRIPE_CHUNKS`` chunks is cut into one segment per
    lane (on chunk boundaries); every other file goes whole to the lane with the
    fewest bytes so far.

    Returns:
        ``(pieces per lane, the striped files)``.
    """
    plan: list[list[Piece]] = [[] for _ in range(lanes)]
    load = [0] * lanes
    striped: list[Striped] = []
    for f in sorted(files, key=lambda p: -p.size):
        if lanes > 1 and f.size >= lanes * MIN_STRIPE_CHUNKS * chunk_bytes:
            bounds = part_files.segment_bounds(f.size, lanes, chunk_bytes)
            striped.append(Striped(f, bounds))
            for k in range(len(bounds) - 1):
                seg = Piece(f.fid, f.rel, f.size, f.sha256, f.local)
                seg.start, seg.end, seg.index = bounds[k], bounds[k + 1], k
                seg.next = seg.acked = seg.start
                plan[k].append(seg)
                load[k] += seg.end - seg.start
            continue
        k = load.index(min(load))
        plan[k].append(f)
        load[k] += f.size
    return plan, striped


class Tally:
    """Bytes confirmed across every lane; reports them to the fault point and the
    caller's ``on_progress`` (from whichever lane's thread moved them)."""

    def __init__(
        self, total: int, hooks: TransferHooks, on_progress: ProgressCallback | None
    ) -> None:
        self.total, self.hooks, self.on_progress = total, hooks, on_progress
        self.done = 0
        self._lock = threading.Lock()

    def move(self, piece: Piece, confirmed: int) -> None:
        """``piece`` now has ``confirmed`` bytes (relative to its start) in."""
        with self._lock:
            self.done += confirmed - piece.counted
            piece.counted = confirmed
            done = self.done
        self.hooks.progress(done)
        if self.on_progress:
            self.on_progress(done, self.total)


class Stopped(Exception):
    """Another lane failed: this one stops where it is."""


class Crew:
    """The lanes after the first, each in its own thread.

    ``check()`` (called by every lane's loop, the first included) raises ``Stopped`` in
    the others once one has failed; ``wait()`` joins them and raises the first failure.
    """

    def __init__(self, pod: str = "?") -> None:
        self.pod = pod
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def check(self) -> None:
        """Raise ``Stopped`` when another lane failed (or the transfer is ending)."""
        if self._stop.is_set():
            raise Stopped(str(self.failure) if self.failure else "the transfer stopped")

    def start(self, name: str, work: Callable[[], None]) -> None:
        """Run ``work`` in a thread; its exception (other than ``Stopped``) stops all."""

        def run() -> None:
            try:
                work()
            except Stopped:
                pass
            except BaseException as exc:  # noqa: BLE001 - handed to the first lane
                if self.failure is None:
                    self.failure = exc
                self._stop.set()

        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def wait(self, check: Callable[[], None] | None = None) -> None:
        """Join every lane (calling ``check`` while waiting, e.g. to keep a session
        alive); raise the first lane's failure."""
        for thread in self._threads:
            while thread.is_alive():
                thread.join(_JOIN_SECONDS)
                if check is not None and thread.is_alive():
                    check()
        self._threads.clear()
        if self.failure is not None:
            raise lane_error(self.pod, self.failure)

    def abort(self, why: BaseException | None = None) -> None:
        """Stop every lane (they end at their next ``check``) and wait for them."""
        if why is not None and self.failure is None:
            self.failure = why
        self._stop.set()
        for thread in self._threads:
            thread.join(60.0)
        self._threads.clear()


def lane_error(pod: str, exc: BaseException) -> BaseException:
    """A lane's failure as the first lane raises it: the transfer's own errors as they
    are, anything else as a ``TransferError`` (never as a drop of the first lane)."""
    from prefect_runpod.blocks.exceptions import RunPodFlowError

    if isinstance(exc, RunPodFlowError) and not isinstance(exc, ConsoleError):
        return exc
    if is_disk_full(exc):  # this machine's disk: said as such by the caller
        return exc
    return TransferError(f"pod {pod}: a parallel pty stream failed: {exc}", pod_id=pod)
