#!/usr/bin/env python3
"""Partial files of a transfer, for both ends (docs/architecture.md#the-pty-framing).

Standard library only, Python 3.8+. The pod's receiver writes uploads through this
module and the flow writes downloads through it (``prefect_runpod.blocks.pod_side.
part_files``), so both keep the same promises:

* a file being received is ``<name>.part`` beside a ``<name>.part.json`` sidecar that
  names its target (size in bytes and sha256); the ``.part`` only ever holds bytes
  that passed their chunk check, in order, so a new receiver resumes at its end;
* a ``.part`` whose sidecar names another target is started afresh;
* the file takes its name only once its whole sha256 matches. Each chunk is read
  back from the file as soon as it is written and hashed then (what was kept of an
  earlier session first, when the file is opened), so that check does not read the
  whole file again after its last byte: the hash is of the file's bytes all the same.

A large file can travel as **segments** over several sessions at once: segment 0 is
``<name>.part`` itself, segment ``k`` is ``<name>.prx-seg<k>.part`` (each with its own
sidecar, which also names the segment's byte range), and :func:`join_segments`
appends them in order, hashing as it goes, once every one is complete.
"""

import hashlib
import json
import os

if __package__:  # imported by the flow as a package module
    from prefect_runpod.blocks.pod_side import manifest as _manifest
else:  # on the pod the script's own folder holds manifest.py
    import manifest as _manifest  # type: ignore

PART_SUFFIX = _manifest.PART_SUFFIX
SIDECAR_SUFFIX = _manifest.SIDECAR_SUFFIX
_READ_BYTES = 4 * 1024 * 1024


def segment_base(path, index):
    """The name segment ``index`` of ``path`` is kept under (before ``.part``)."""
    return path if index == 0 else "%s.prx-seg%d" % (path, index)


def already_there(path, size, sha256, known=None):
    """True when ``path`` is a file of ``size`` bytes whose sha256 is ``sha256`` (its
    hashes are then recorded in ``known``, see ``manifest.compute_manifest``)."""
    if not (os.path.isfile(path) and os.path.getsize(path) == size):
        return False
    entry = _manifest.file_entry(path, "")
    if entry["sha256"] != sha256:
        return False
    _manifest.remember(known, path, entry)
    return True


def _remove(path):
    if os.path.exists(path):
        os.remove(path)


class PartFile(object):
    """One file (or one segment of it) being received.

    A whole file (not a segment) is hashed as it grows: each chunk read back from the
    ``.part`` once written (and the kept bytes when it is opened), so :meth:`finish`
    has its sha256 and git blob id without reading it again; that entry also serves
    the destination manifest (``manifest.remember``). A segment is hashed when the
    joined file is (:func:`join_segments`).

    Args:
        path: where the whole file goes.
        size: the whole file's size, bytes.
        sha256: the whole file's sha256.
        start / end: the byte range this part holds (default: the whole file).
        index: the segment number (0: the file's own ``.part``).

    Attributes:
        offset: the file offset the next byte belongs at (``start`` + bytes kept).
    """

    def __init__(self, path, size, sha256, start=0, end=None, index=0):
        self.path, self.size, self.sha256 = path, size, sha256
        self.start = start
        self.end = size if end is None else end
        self.index = index
        base = segment_base(path, index)
        self.part = base + PART_SUFFIX
        self.sidecar = base + SIDECAR_SUFFIX
        self.fh = None
        self.offset = start
        self._hashes = None  # (sha256, git blob sha1, bytes) of the .part, read back

    @property
    def segment(self):
        """True for a part of a file sent as several segments."""
        return self.start != 0 or self.end != self.size

    def _target(self):
        meta = {"size": self.size, "sha256": self.sha256}
        if self.segment:
            meta.update(start=self.start, end=self.end)
        return meta

    def kept_bytes(self):
        """Verified bytes already in the ``.part`` for this target (0 when the sidecar
        is missing or names another target)."""
        if not (os.path.isfile(self.part) and os.path.isfile(self.sidecar)):
            return 0
        try:
            with open(self.sidecar) as fh:
                meta = json.load(fh)
        except ValueError:
            return 0
        if meta != self._target():
            return 0
        return min(os.path.getsize(self.part), self.end - self.start)

    def open(self):
        """Open the ``.part`` for appending, keeping its verified bytes.

        Returns:
            The bytes kept.

        Raises:
            OSError: the folder or the file cannot be made.
        """
        parent = os.path.dirname(self.path)
        if parent and not os.path.isdir(parent):
            os.makedirs(parent)
        keep = self.kept_bytes()
        if keep == 0:
            with open(self.sidecar, "w") as fh:
                json.dump(self._target(), fh)
        self.close()
        self.fh = open(self.part, "r+b" if keep else "w+b", buffering=0)  # noqa: SIM115
        self.fh.truncate(keep)
        self.fh.seek(keep)
        self.offset = self.start + keep
        self._hashes = None
        if not self.segment:
            blob = hashlib.sha1(b"blob %d\0" % self.size)
            self._hashes = [hashlib.sha256(), blob, 0]
            for at in range(0, keep, _READ_BYTES):
                self._hash_back(at, min(_READ_BYTES, keep - at))
        return keep

    def _hash_back(self, at, size):
        """Read ``size`` bytes at ``at`` back from the ``.part`` into its hashes."""
        data = os.pread(self.fh.fileno(), size, at)
        sha, blob, _ = self._hashes
        sha.update(data)
        blob.update(data)
        self._hashes[2] += len(data)

    def write(self, raw):
        """Append ``raw`` (a verified chunk at ``offset``).

        Raises:
            OSError: the disk refused it (ENOSPC, EFBIG, …); the ``.part`` is cut back
                to its verified bytes first.
        """
        try:
            view = memoryview(raw)
            while view:
                n = self.fh.write(view)
                view = view[n:]
        except OSError:
            self.fh.truncate(self.offset - self.start)
            self.fh.seek(self.offset - self.start)
            raise
        if self._hashes is not None:
            self._hash_back(self.offset - self.start, len(raw))
        self.offset += len(raw)

    @property
    def complete(self):
        """True once every byte of the range is in."""
        return self.offset == self.end

    def close(self):
        """Close the ``.part`` (kept on disk)."""
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        self._hashes = None  # opening it again reads the kept bytes back

    def discard(self):
        """Close and remove the ``.part`` and its sidecar."""
        self.close()
        _remove(self.part)
        _remove(self.sidecar)

    def finish(self, known=None):
        """A whole file: its hashes (of the bytes read back from the ``.part`` as it
        grew; read from disk now when it was not opened and written through this
        object), and its name when its sha256 matches (the hashes then go into
        ``known``).

        Returns:
            ``(ok, entry)``: ``entry`` holds ``size_bytes``, ``sha256`` and
            ``git_sha1`` as read; a mismatch removes the ``.part``.

        Raises:
            OSError: the ``.part`` cannot be read.
        """
        hashes = self._hashes
        self.close()
        if hashes is not None and hashes[2] == self.size == os.path.getsize(self.part):
            entry = {"path": "", "size_bytes": self.size, "sha256": hashes[0].hexdigest()}
            entry["git_sha1"] = hashes[1].hexdigest()
        else:  # not read back whole as it grew (a segment's joined file): read it now
            entry = _manifest.file_entry(self.part, "")
        if entry["sha256"] != self.sha256 or entry["size_bytes"] != self.size:
            self.discard()
            return False, entry
        os.replace(self.part, self.path)
        _remove(self.sidecar)
        _manifest.remember(known, self.path, entry)
        return True, entry


def segment_bounds(size, count, align):
    """Byte offsets splitting ``size`` bytes into ``count`` segments on ``align``
    boundaries: ``[0, b1, …, size]``."""
    step = max(align, -(-size // count // align) * align)
    bounds = list(range(0, size, step))[:count]
    return bounds + [size]


def join_segments(path, size, sha256, bounds, known=None):
    """Append segments 1… of ``path`` to its ``.part`` (segment 0) and verify the whole
    as :meth:`PartFile.finish` does.

    Args:
        path / size / sha256: the whole file.
        bounds: the segments' offsets, ``[0, b1, …, size]``.
        known: where the joined file's hashes are recorded.

    Returns:
        ``("ok", entry)``; ``("bad", entry)`` after removing every part; or
        ``("missing", (index, kept_bytes))`` when a segment is not complete.

    Raises:
        OSError: a part cannot be read or appended to.
    """
    parts = [
        PartFile(path, size, sha256, bounds[k], bounds[k + 1], k) for k in range(len(bounds) - 1)
    ]
    for p in parts:
        kept = p.kept_bytes()
        if kept != p.end - p.start:
            return "missing", (p.index, kept)
    with open(parts[0].part, "ab") as out:
        for p in parts[1:]:
            with open(p.part, "rb") as src:
                while True:
                    buf = src.read(_READ_BYTES)
                    if not buf:
                        break
                    out.write(buf)
    whole = PartFile(path, size, sha256)
    with open(whole.sidecar, "w") as fh:  # the joined .part is now the whole file's
        json.dump(whole._target(), fh)
    for p in parts[1:]:
        p.discard()
    ok, entry = whole.finish(known)
    return ("ok" if ok else "bad"), entry
