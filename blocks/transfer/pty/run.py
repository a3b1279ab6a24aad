"""One ``pty`` transfer from start to verified end, over one or several sessions
(docs/architecture.md#the-pty-framing).

``Transfer.go`` is what an upload and a download share: the first session's
handshake (protocol, probe, round trip), the plan (which session moves which file or
segment), the other sessions in threads, the join of striped files, and the resend
of the files the final check found different (``Transfer.resend``). The halves
(:mod:`.upload`, :mod:`.download`) bring the parts that differ: how a session
moves its pieces, how segments are joined, how the result is verified (through the
one verify step of every method, ``transfer.verify``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect_runpod.blocks.pod_side.receiver import PROTOCOL_VERSION
from prefect_runpod.blocks.transfer.base import TransferHooks
from prefect_runpod.blocks.transfer.models import LinkReport, Manifest, MethodResult
from prefect_runpod.blocks.transfer.pty.lanes import (
    Crew,
    Lane,
    Piece,
    Stopped,
    Striped,
    Tally,
    lane_error,
    plan_lanes,
)
from prefect_runpod.blocks.transfer.pty.options import PtyOptions
from prefect_runpod.blocks.transfer.pty.session import (
    LinkState,
    PathWindow,
    Session,
    resilient,
)

__all__ = ["Engine", "Transfer"]

Engine = Callable[[Session, list[Piece], PathWindow, "Transfer"], None]
"""Moves a list of pieces through one session, with its window, as part of a transfer
(``send_pieces``, ``fetch_pieces``)."""


class Transfer:
    """The state of one transfer, kept across reconnects of its sessions.

    Args:
        main: the caller's session (the console's stream).
        more_lanes: makes one more lane per extra stream, or None.
        command: the receiver's command line.
        opts: the method's options.
        hooks: fault points.
        tally: the progress of every lane.
        pod: the pod id, for messages.
    """

    def __init__(
        self,
        main: Lane,
        more_lanes: Callable[[], Lane] | None,
        command: str,
        opts: PtyOptions,
        hooks: TransferHooks,
        tally: Tally,
        pod: str,
    ) -> None:
        self.main, self.more_lanes = main, more_lanes
        self.command, self.opts, self.hooks, self.tally, self.pod = (
            command,
            opts,
            hooks,
            tally,
            pod,
        )
        self.link = LinkState()
        self.stats = {"retries": 0, "sent": 0}  # sent: payload bytes framed
        self.known: dict[str, Any] = {}  # files hashed from disk here (downloads)
        self.crew = Crew(pod)
        self.files: list[Piece] | None = None
        self.plan: list[list[Piece]] | None = None
        self.striped: list[Striped] = []
        self.redo: list[Piece] = []
        self.resent = False
        self._resend: Callable[[list[Piece]], None] | None = None
        self.joined = False
        self.windows: list[PathWindow] = []
        self.reconnects = 0
        self._lanes: list[Lane] = []

    def window(self) -> PathWindow:
        """A new window for one session, from the round trip measured at the start."""
        w = PathWindow(self.link.rtt_seconds, self.opts)
        self.windows.append(w)
        return w

    def report(self) -> LinkReport:
        """How the bytes travelled, for the ``TransferReport``."""
        link = self.link
        rtt = link.rtt_seconds
        return LinkReport(
            protocol=link.protocol or int(PROTOCOL_VERSION),
            framing=link.framing,  # type: ignore[arg-type]
            probe=link.probe or "skipped",  # type: ignore[arg-type]
            probe_detail=link.probe_detail,
            streams=1 + len(self._lanes),
            rtt_ms=round(rtt * 1000, 2) if rtt is not None else None,
            window_bytes=max((w.peak for w in self.windows), default=0),
            compressed_files=len({p.rel for p in self.files or [] if p.compress}),
            pod_peak_rss_bytes=link.pod_peak_rss_bytes or None,
        )

    def go(
        self,
        prepare: Callable[[Session], list[Piece]],
        engine: Engine,
        join: Callable[[Session, list[Striped], dict[str, int]], list[Piece]],
        verify: Callable[[Session], MethodResult],
        screen: Callable[[Session, list[Striped]], None] | None = None,
    ) -> MethodResult:
        """Run the transfer; returns the verified result.

        Args:
            prepare: on the first session, the files to move (once).
            engine: moves pieces through one session.
            join: joins the striped files; returns files to move again whole.
            verify: checks the result and returns it (moving files again through
                ``resend`` when the check asks for it).
            screen: marks striped files that are already in place as done.
        """
        try:
            result, reconnects = resilient(
                self._main_work(prepare, engine, join, verify, screen),
                self.main.open_stream,
                self.command,
                self.main.reconnect,
                self.hooks,
                self.opts,
                self.pod,
                self.link,
                True,
            )
            self.crew.wait()
            # After the sessions closed: their receivers' peak memory is known now.
            return result.model_copy(
                update={"reconnects": reconnects + self.reconnects, "link": self.report()}
            )
        except Stopped:  # another lane failed: its error is the transfer's
            self.crew.abort()
            assert self.crew.failure is not None
            raise lane_error(self.pod, self.crew.failure) from None
        except BaseException as exc:
            self.crew.abort(exc)
            raise
        finally:
            for p in self.files or []:
                p.close()
            for lane in self._lanes:
                if lane.close is not None:
                    lane.close()

    def _main_work(
        self,
        prepare: Callable[[Session], list[Piece]],
        engine: Engine,
        join: Callable[[Session, list[Striped], dict[str, int]], list[Piece]],
        verify: Callable[[Session], MethodResult],
        screen: Callable[[Session, list[Striped]], None] | None,
    ) -> Callable[[Session], MethodResult]:
        def work(s: Session) -> MethodResult:
            if self.files is None:
                self.files = prepare(s)
            window = self.window()
            if self.plan is None:
                self._plan(s, engine, screen)
            assert self.plan is not None
            engine(s, [p for p in self.plan[0] if not p.done], window, self)
            self.crew.wait()
            if not self.joined:
                self.redo.extend(join(s, self.striped, self.stats))
                self.joined = True
            if self.redo:  # files the join (or a resend a drop cut short) left to move
                engine(s, self.redo, window, self)
            self._resend = lambda pieces: engine(s, pieces, window, self)
            return verify(s)

        return work

    def resend(self, pieces: list[Piece]) -> None:
        """Move ``pieces`` (files the final check found different) once more, through
        the session doing the check, each counted as a retry; a drop on the way moves
        them again on the next session, whose check then does not resend."""
        assert self._resend is not None
        self.stats["retries"] += len(pieces)
        self.redo, self.resent = pieces, True
        self._resend(pieces)

    def result(self, source: Manifest, dest: dict[str, Any]) -> MethodResult:
        """The verified transfer's ``MethodResult``: its bytes, the payload framed, the
        retries, ``source`` and the plain destination manifest ``dest``, the link."""
        return MethodResult(
            bytes=self.tally.total,
            sent_bytes=self.stats["sent"],
            retries=self.stats["retries"],
            source_manifest=source,
            dest_manifest=Manifest.from_dict(dest),
            link=self.report(),
        )

    def _plan(
        self,
        s: Session,
        engine: Engine,
        screen: Callable[[Session, list[Striped]], None] | None,
    ) -> None:
        """Deal the files out; start a thread per extra lane."""
        assert self.files is not None
        wanted = self.opts.streams if (s.modern and self.more_lanes is not None) else 1
        plan, striped = plan_lanes(
            [f for f in self.files if not f.done], wanted, self.opts.chunk_bytes
        )
        if striped and screen is not None:
            screen(s, striped)
            done = {st.piece.fid for st in striped if st.piece.done}
            plan = [[p for p in lane if p.fid not in done] for lane in plan]
        self.plan, self.striped = plan, striped
        for k in range(1, len(plan)):
            if not plan[k]:
                continue
            assert self.more_lanes is not None
            lane = self.more_lanes()
            self._lanes.append(lane)
            self.crew.start(f"pty-stream-{k + 1}", self._lane_work(lane, plan[k], engine))

    def _lane_work(self, lane: Lane, pieces: list[Piece], engine: Engine) -> Callable[[], None]:
        def run() -> None:
            def work(s: Session) -> None:
                engine(s, [p for p in pieces if not p.done], self.window(), self)

            _, reconnects = resilient(
                work,
                lane.open_stream,
                self.command,
                lane.reconnect,
                self.hooks,
                self.opts,
                self.pod,
                self.link,
                False,
            )
            self.reconnects += reconnects

        return run
