"""Transfer records: manifests, method results and transfer reports (docs/architecture.md#data-that-moves, #transfers-and-integrity).

They live in blocks/ because the transfer code in blocks/ returns them and blocks
never import tasks/; ``prefect_runpod.tasks.models`` re-exports them, so
``from prefect_runpod.tasks.models import Manifest`` keeps working. Plain pydantic
models: JSON-serialisable, safe to persist as Prefect results.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from prefect_runpod.blocks.api_probe import probe_api
from prefect_runpod.blocks.exceptions import LinksRefusedError
from prefect_runpod.blocks.faults import fault_point

__all__ = [
    "LinkReport",
    "Manifest",
    "ManifestEntry",
    "MethodResult",
    "TransferProgress",
    "TransferReport",
    "refuse_links",
    "tree_refusal",
]


def tree_refusal(root: str, problems: list[tuple[str, str]] | list[list[str]]) -> str:
    """The message that refuses a tree for its links, naming each (at most 20) and the
    way out.

    Args:
        root: the tree (local or on the pod).
        problems: ``(relative path, why)`` pairs, as ``pod_side.manifest`` finds them.
    """
    listed = "; ".join(f"{path} ({why})" for path, why in problems[:20])
    more = f"; and {len(problems) - 20} more" if len(problems) > 20 else ""
    return (
        f"{root} holds links a transfer would not carry as links: {listed}{more}. Nothing "
        "was moved. Make them relative links inside the tree, remove them, or pass "
        "--follow-links to copy what the escaping ones point at"
    )


def refuse_links(
    root: str, problems: list[tuple[str, str]] | list[list[str]], *, pod_id: str | None = None
) -> LinksRefusedError:
    """The ``LinksRefusedError`` for ``problems`` in ``root`` (message: ``tree_refusal``),
    carrying the problems so a download can still bring what can travel."""
    pairs = [(str(path), str(why)) for path, why in problems]
    return LinksRefusedError(tree_refusal(root, problems), problems=pairs, pod_id=pod_id)


class ManifestEntry(BaseModel):
    """One entry of a tree: a file (path relative to the manifest root with POSIX
    separators, size in bytes, sha256 hex digest, git blob id), an empty
    directory, or an in-tree relative symbolic link (``target`` as written; never
    followed).

    Attributes:
        path: relative POSIX path.
        size_bytes: the file's size; 0 for a directory or a link.
        sha256: the file's digest; empty for a directory or a link.
        md5: empty: no longer computed (nothing checks one, see ``pod_side.manifest``);
            kept so that an answer of older pod tools, or S3 metadata written by them,
            still reads (compared only when both sides carry one).
        git_sha1: the file's git blob id (``sha1("blob <size>\\0" + data)``, what the
            Hugging Face Hub reports for a file it stores as a regular blob); None for a
            directory, a link, or a manifest made before it was recorded.
        kind: ``file``, ``dir`` or ``link``.
        target: a link's target text; None otherwise.
    """

    path: str
    size_bytes: int = Field(ge=0)
    md5: str = ""
    sha256: str = ""
    git_sha1: str | None = None
    kind: Literal["file", "dir", "link"] = "file"
    target: str | None = None


class Manifest(BaseModel):
    """The integrity record of a directory tree (or a single file).

    Attributes:
        root: where the files are (a local path or a pod path).
        entries: one per file, sorted by path.
    """

    root: str
    entries: list[ManifestEntry] = Field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """Sum of all entry sizes, in bytes."""
        return sum(e.size_bytes for e in self.entries)

    @property
    def files(self) -> list[ManifestEntry]:
        """The file entries (the ones whose bytes travel)."""
        return [e for e in self.entries if e.kind == "file"]

    def subset(self, paths: set[str]) -> Manifest:
        """A copy holding only the entries whose path is in ``paths``."""
        return self.model_copy(update={"entries": [e for e in self.entries if e.path in paths]})

    def as_dict(self) -> dict[str, Any]:
        """The plain form ``pod_side.manifest`` uses (``{"root", "entries": [...]}``; a
        file entry has no ``kind`` or ``target``, a directory or link no ``git_sha1``,
        and an entry without an md5 no ``md5``)."""
        data = self.model_dump(mode="json")
        for entry in data["entries"]:
            if not entry["md5"]:
                del entry["md5"]
            if entry["kind"] == "file":
                del entry["kind"], entry["target"]
            else:
                del entry["git_sha1"]
                if entry["kind"] == "dir":
                    del entry["target"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Build from the plain form ``pod_side.manifest.compute_manifest`` returns."""
        return cls.model_validate({"root": data["root"], "entries": data["entries"]})

    @classmethod
    def compute(
        cls, root: str | Path, paths: list[str] | None = None, *, follow_links: bool = False
    ) -> Manifest:
        """The manifest of the local tree (or file) ``root``, computed here.

        Args:
            root: a local folder or file.
            paths: only these entries of the tree (a selection: files, links, empty
                directories, as an upload's ignore rules chose them); None for the whole
                tree. Links among them are checked as the whole tree's would be.
            follow_links: read links that leave the tree through (their target's files
                take their place) instead of refusing them.

        Raises:
            SpecError: the tree holds links that leave it or dangle (each named).
            OSError: a file cannot be read.
        """
        from prefect_runpod.blocks.pod_side import manifest as mf

        try:
            return cls.from_dict(
                mf.compute_manifest(str(root), paths, follow_links=follow_links, select=True)
            )
        except mf.TreeProblems as exc:
            raise refuse_links(str(root), exc.problems) from exc


class LinkReport(BaseModel):
    """How a ``pty`` transfer's bytes travelled (docs/architecture.md#the-pty-framing).

    Attributes:
        protocol: the pod receiver's protocol version (this side's, or one older that
            this side negotiated down to).
        framing: ``raw`` (bytes as they are) or ``base64`` frames.
        probe: the probe's verdict: ``passed`` (every byte value crossed both ways
            unchanged, so raw frames were used), ``failed`` (base64 was used; see
            ``probe_detail``) or ``skipped`` (base64 asked for, a tty that stayed
            cooked, or an older receiver).
        probe_detail: what each direction saw (the first byte that changed), or why
            the probe did not run.
        streams: PTY sessions the transfer used.
        rtt_ms: the shortest round trip measured at the start, in milliseconds.
        window_bytes: the largest window (payload bytes in flight) a session used.
        compressed_files: files whose chunks were zlib-compressed (uploads; the pod
            decides for downloads).
        pod_peak_rss_bytes: the largest peak resident memory a pod receiver reported,
            bytes (None when it did not say).
    """

    protocol: int
    framing: Literal["raw", "base64"]
    probe: Literal["passed", "failed", "skipped"]
    probe_detail: str = ""
    streams: int = Field(default=1, ge=1)
    rtt_ms: float | None = None
    window_bytes: int = Field(default=0, ge=0)
    compressed_files: int = Field(default=0, ge=0)
    pod_peak_rss_bytes: int | None = None


class MethodResult(BaseModel):
    """What one ``TransferMethod`` reports for an upload or a download, before dispatch
    times it and checks the two manifests into a ``TransferReport``.

    Attributes:
        bytes: payload bytes moved (files' sizes, not the encoded wire bytes).
        sent_bytes: file content that actually crossed this time, in bytes: 0 for a
            file already at the destination and verified, the rest of a resumed one,
            what ``rsync`` sent after its delta (resends included); None when the
            method does not count it.
        retries: chunks or files re-sent after a damaged chunk or a mismatch.
        reconnects: dropped connections the method survived.
        source_manifest: computed where the files were (here for an upload, on the pod
            for a download).
        dest_manifest: computed where they landed, from the files on that disk.
        link: how the bytes travelled (``pty``: framing, probe verdict, streams); None
            for methods without such choices.
    """

    bytes: int = Field(ge=0)
    sent_bytes: int | None = Field(default=None, ge=0)
    retries: int = Field(default=0, ge=0)
    reconnects: int = Field(default=0, ge=0)
    source_manifest: Manifest
    dest_manifest: Manifest
    link: LinkReport | None = None


class TransferReport(BaseModel):
    """One upload or download.

    Attributes:
        direction: ``upload`` (local → pod) or ``download`` (pod → local).
        method: the registered method's name (``pty``, ``sftp``, ``rsync``, ``s3``,
            ``runpodctl``).
        bytes: payload bytes moved (files' sizes, not the encoded wire bytes).
        sent_bytes: file content that crossed this time (``MethodResult.sent_bytes``:
            0 when every file was already there and verified); None when not counted.
        seconds: wall time, in seconds.
        retries: chunks/files re-sent after a drop or a mismatch, plus reconnects.
        source_manifest / dest_manifest: computed at each end.
        verified: True only when both manifests match entry for entry.
        link: how the bytes travelled (``pty``: protocol, framing and the probe's
            verdict, streams, round trip, window); None for other methods.
        left_on_pod: a download's entries that could not travel (links that leave the
            pod's tree or dangle), relative path → why; they stay on the pod, and
            everything else travelled and was verified. Empty when nothing stayed.
        left_in: the pod folder those entries are in (the tree the download was asked
            for, which a staging copy stood in for); empty when nothing stayed.
    """

    direction: Literal["upload", "download"]
    method: str
    bytes: int = 0
    sent_bytes: int | None = None
    seconds: float = 0.0
    retries: int = 0
    source_manifest: Manifest | None = None
    dest_manifest: Manifest | None = None
    verified: bool = False
    link: LinkReport | None = None
    left_on_pod: dict[str, str] = Field(default_factory=dict)
    left_in: str = ""


class TransferProgress:
    """An ``on_progress(done_bytes, total_bytes)`` that keeps how far a transfer got, so
    one that stops before its end (a Ctrl-C, a lost pod) still reports the bytes it
    moved instead of none. Safe to call from several lanes' threads. The fault point
    ``upload_moving`` / ``download_moving`` fires once the first bytes are confirmed;
    each call is a boundary at which a run probes the Prefect API (``blocks.api_probe``).

    Args:
        direction: ``upload`` or ``download``.
        method: the method asked for (``auto`` until one is chosen).
        clock: seconds, monotonic (the transfer's time counts from when this object
            is made).
    """

    def __init__(
        self,
        direction: Literal["upload", "download"],
        method: str,
        clock: Any = time.monotonic,
    ) -> None:
        self.direction, self.method, self._clock = direction, method, clock
        self.started = clock()
        self.done = 0
        self._lock = threading.Lock()

    def __call__(self, done: int, total: int) -> None:
        with self._lock:
            first = done > 0 and self.done == 0
            self.done = max(self.done, done)
        if first:  # tests: the transfer has confirmed its first bytes
            fault_point(f"{self.direction}_moving")
        probe_api()  # a chunk boundary: an API outage is told (on a thread of its own)

    def partial_report(self) -> TransferReport:
        """The unverified ``TransferReport`` of the bytes confirmed so far (payload
        bytes, as ``TransferReport.bytes``) and the seconds since the start."""
        return TransferReport(
            direction=self.direction,
            method=self.method,
            bytes=self.done,
            seconds=round(self._clock() - self.started, 3),
            verified=False,
        )
