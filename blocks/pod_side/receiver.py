#!/usr/bin/env python3
"""The pod end of the ``pty`` transfer: framed, hashed, acknowledged chunks over a tty
(docs/architecture.md#the-pty-framing).

Standard library only, Python 3.8+. The frames are :mod:`frame_codec`'s, the partial
files :mod:`part_files`' (both in this folder, shared with the flow's side).

On start the receiver puts its tty in raw mode (every byte value passes, no signal or
line-editing keys, no line-ending rewrites) and announces itself with
``#READY <version> <input>``, ``input`` being ``raw`` (a tty now in raw mode), ``pipe``
(not a tty) or ``cooked`` (a tty that stayed in canonical mode: the flow then never
probes and keeps to base64 frames).

Commands (flow → pod) and answers (pod → flow)::

    #PING token                          ← #PONG token                  (round trip)
    #PROBE token + pattern + end         ← #PROBED token ok|bad detail_b64, then a probe back
    #FRAMING raw|base64                  (what downloads are sent in)
    #W bytes                             (the download window)
    #Z 0|1|auto                          (compress downloads: never, when smaller, if a sample shrinks)
    #STAT fid size sha256 path           ← #O fid size done | #O fid 0 absent
    #OPEN fid size sha256 path [start end index]   ← #O fid offset part|done
    #D / #R data frames                  ← #A fid epoch offset end | #N fid epoch offset verified reason
    #CLOSE fid                           ← #C fid size - sha256 | #K fid end (a segment) | #I fid verified | #BAD fid sha256 actual
    #JOIN fid size sha256 path b1,b2,…   ← #C … | #BAD … | #I fid segment kept
    #SYNC fid                            ← #S fid verified
    #GET fid epoch offset path [end]     ← frames until end of file (or ``end``), then #E fid epoch offset
    #A fid epoch offset                  (a download frame arrived: one chunk of window back)
    M blob (JSON in a frame)             ← M blob: the manifest, or {"error", "problems"}
    #BYE                                 ← #STATS peak_rss_kib, and the receiver exits
    any write error                      ← #X fid errno-name message_b64

Command line: ``python3 receiver.py --root DIR [--window-bytes N] [--chunk-bytes N]
[--line-chars N]`` (the same as protocol 3's, so a newer flow can start an older
receiver and hear its version).
"""

import binascii
import errno
import io
import json
import os
import select
import sys
import termios

if __package__:  # imported by the flow as a package module
    from prefect_runpod.blocks.pod_side import frame_codec as _codec
    from prefect_runpod.blocks.pod_side import manifest as _manifest
    from prefect_runpod.blocks.pod_side import part_files as _parts
else:  # run on the pod: the script's own folder holds its siblings
    import frame_codec as _codec  # type: ignore
    import manifest as _manifest  # type: ignore
    import part_files as _parts  # type: ignore

PROTOCOL_VERSION = "4"
"""2: CRC-32 chunk digests; 3: trees (dirs, links, follow_links); 4: raw frames after a
probe, a window the flow resizes, compression by sample, segments (``#STAT``,
``#JOIN``), ranged ``#GET``, ``#STATS``."""
DEFAULT_WINDOW_BYTES = 8 * 1024 * 1024
READ_BYTES = 1 << 20
_PAUSE_SECONDS = 0.05  # base64 input silent this long: parse what came (see read_frame)
_RAW_IFLAGS_OFF = (
    "IGNBRK", "BRKINT", "PARMRK", "ISTRIP", "INLCR", "IGNCR", "ICRNL",
    "IXON", "IXOFF", "IXANY", "INPCK", "IUCLC", "IMAXBEL",
)  # fmt: skip
_WRITE_ERRORS = {
    "ENOSPC": "no space left on the pod's disk",
    "EFBIG": "file size limit reached on the pod",
    "EDQUOT": "disk quota exceeded on the pod",
}


class Receiver(object):
    """The pod-side state machine. Reads commands from ``in_fd``, writes to ``out``."""

    def __init__(
        self,
        root,
        in_fd=0,
        out=None,
        window_bytes=DEFAULT_WINDOW_BYTES,
        chunk_bytes=_codec.DEFAULT_CHUNK_BYTES,
        line_chars=_codec.DEFAULT_LINE_CHARS,
        input_kind="pipe",
    ):
        self.root = root
        self.in_fd = in_fd
        self.out = out if out is not None else sys.stdout.buffer
        self.window_bytes = window_bytes
        self.chunk_bytes = chunk_bytes
        self.line_chars = line_chars
        self.input_kind = input_kind
        self.parser = _codec.FrameParser()
        self.uploads = {}  # fid -> PartFile
        self.known = {}  # files verified from disk here: see manifest.compute_manifest
        self.jobs = []  # download jobs: [fid, epoch, offset, rel, fh, end, compress]
        self.credit_bytes = window_bytes
        self.compress = "0"
        self.framing = "base64"
        self.running = True

    # -- output
    def send(self, data):
        self.out.write(data)
        self.out.flush()

    def reply(self, *fields):
        self.send((" ".join(str(f) for f in fields) + "\n").encode("ascii"))

    # -- main loop
    def serve(self):
        """Answer until ``#BYE`` or end of input. Reads block (no polling) unless a
        download has window credit, then input is only peeked at between chunks."""
        self.reply("#READY", PROTOCOL_VERSION, self.input_kind)
        fd = self.in_fd
        view = memoryview(bytearray(READ_BYTES))
        src = io.FileIO(fd, "rb", closefd=False)

        def more():
            return bool(select.select([fd], [], [], _PAUSE_SECONDS)[0])

        while self.running:
            if self.jobs and self.credit_bytes > 0:
                ready, _, _ = select.select([fd], [], [], 0)
                if not ready:
                    self.pump()
                    continue
            n = read_frame(src, view, self.parser.pending(), more)
            if not n:
                break
            for kind, ev in self.parser.feed(view[:n]):
                if kind == "line":
                    self.on_line(ev)
                elif kind == "frame":
                    self.on_frame(ev)
                else:
                    self.on_probe(*ev)
        for up in self.uploads.values():
            up.close()

    def on_line(self, f):
        tag = f[0]
        try:
            if tag == "#OPEN":
                bounds = [int(x) for x in f[5:8]] if len(f) >= 8 else None
                self.open_upload(f[1], int(f[2]), f[3], _codec.unb64text(f[4]), bounds)
            elif tag == "#CLOSE":
                self.close_upload(f[1])
            elif tag == "#SYNC":
                up = self.uploads.get(f[1])
                self.reply("#S", f[1], up.offset if up else 0)
            elif tag == "#GET":
                end = int(f[5]) if len(f) > 5 else None
                self.get(f[1], int(f[2]), int(f[3]), _codec.unb64text(f[4]), end)
            elif tag == "#A":
                self.credit_bytes = min(self.window_bytes, self.credit_bytes + self.chunk_bytes)
            elif tag == "#STAT":
                path = _manifest.safe_join(self.root, _codec.unb64text(f[4]))
                there = _parts.already_there(path, int(f[2]), f[3], self.known)
                self.reply("#O", f[1], f[2] if there else 0, "done" if there else "absent")
            elif tag == "#JOIN":
                self.join(f[1], int(f[2]), f[3], _codec.unb64text(f[4]), f[5])
            elif tag == "#PING":
                self.reply("#PONG", *f[1:2])
            elif tag == "#W":
                self.window_bytes = max(self.chunk_bytes, int(f[1]))
                self.credit_bytes = min(self.credit_bytes, self.window_bytes)
            elif tag == "#FRAMING" and f[1] in _codec.FRAMINGS:
                self.framing = f[1]
            elif tag == "#Z":
                self.compress = f[1]
            elif tag == "#BYE":
                self.reply("#STATS", peak_rss_kib())
                self.running = False
        except (IndexError, ValueError, binascii.Error, UnicodeDecodeError):
            self.reply("#?", tag)

    def on_probe(self, token, got):
        """Answer a probe with its verdict, then send one back the other way."""
        ok, detail = _codec.probe_verdict(got)
        self.reply("#PROBED", token, "ok" if ok else "bad", _codec.b64text(detail))
        self.send(_codec.probe_block(token))

    # -- upload
    def open_upload(self, fid, size, sha256, rel, bounds=None):
        try:
            path = _manifest.safe_join(self.root, rel)
        except ValueError as exc:
            return self.reply("#X", fid, "EINVAL", _codec.b64text(str(exc)))
        old = self.uploads.pop(fid, None)
        if old is not None:
            old.close()
        if bounds is None:
            up = _parts.PartFile(path, size, sha256)
        else:
            up = _parts.PartFile(path, size, sha256, bounds[0], bounds[1], bounds[2])
        try:
            if not up.segment and _parts.already_there(path, size, sha256, self.known):
                return self.reply("#O", fid, size, "done")
            up.open()
        except OSError as exc:
            return self.write_error(fid, rel, exc)
        self.uploads[fid] = up
        self.reply("#O", fid, up.offset, "part")

    def write_error(self, fid, rel, exc):
        name = errno.errorcode.get(exc.errno or 0, "EIO")
        what = _WRITE_ERRORS.get(name, exc.strerror or str(exc))
        self.reply("#X", fid, name, _codec.b64text("%s while writing %s" % (what, rel)))

    def on_frame(self, fr):
        if fr.fid == "M":
            return self.on_blob(fr)
        up = self.uploads.get(fr.fid)
        if up is None or up.fh is None:
            return self.reply("#N", fr.fid, fr.epoch, fr.offset, 0, "not-open")
        if fr.raw is None:
            return self.reply("#N", fr.fid, fr.epoch, fr.offset, up.offset, "bad")
        if fr.offset != up.offset or fr.offset + fr.rawlen > up.end:
            return self.reply("#N", fr.fid, fr.epoch, fr.offset, up.offset, "order")
        try:
            up.write(fr.raw)
        except OSError as exc:
            return self.write_error(fr.fid, os.path.relpath(up.path, self.root), exc)
        self.reply("#A", fr.fid, fr.epoch, fr.offset, up.offset)

    def close_upload(self, fid):
        up = self.uploads.get(fid)
        if up is None:
            return self.reply("#I", fid, 0)
        if not up.complete:
            return self.reply("#I", fid, up.offset)
        del self.uploads[fid]
        if up.segment:
            up.close()
            return self.reply("#K", fid, up.end)
        try:
            ok, entry = up.finish(self.known)
        except OSError as exc:
            return self.write_error(fid, os.path.relpath(up.path, self.root), exc)
        if not ok:
            return self.reply("#BAD", fid, "sha256", entry["sha256"])
        self.reply("#C", fid, up.size, "-", entry["sha256"])

    def join(self, fid, size, sha256, rel, bounds_text):
        """Join a file's segments (each one complete) and verify the whole."""
        path = _manifest.safe_join(self.root, rel)
        bounds = [0] + [int(b) for b in bounds_text.split(",")]
        try:
            verdict, found = _parts.join_segments(path, size, sha256, bounds, self.known)
        except OSError as exc:
            return self.write_error(fid, rel, exc)
        if verdict == "missing":
            return self.reply("#I", fid, *found)
        if verdict == "bad":
            return self.reply("#BAD", fid, "sha256", found["sha256"])
        self.reply("#C", fid, size, "-", found["sha256"])

    # -- blobs
    def on_blob(self, fr):
        if fr.raw is None:
            return self.reply("#N", fr.fid, fr.epoch, fr.offset, 0, "bad")
        req = json.loads(fr.raw.decode("utf-8"))
        try:
            errors = _manifest.apply_structure(self.root, req.get("structure") or [])
            if errors:
                result = {"error": "could not make the tree", "problems": errors}
            else:
                result = _manifest.compute_manifest(
                    self.root,
                    req.get("paths"),
                    follow_links=bool(req.get("follow_links")),
                    known=self.known,
                )
        except _manifest.TreeProblems as exc:
            result = {"error": str(exc), "problems": exc.problems}
        except OSError as exc:
            result = {"error": str(exc)}
        body = json.dumps(result, separators=(",", ":")).encode("utf-8")
        self.send(_codec.encode_frame("M", fr.epoch, 0, body, True, self.line_chars))

    # -- download
    def get(self, fid, epoch, offset, rel, end=None):
        self.credit_bytes = self.window_bytes  # a (re)request resets the window
        for job in self.jobs:
            if job[0] == fid:
                job[1], job[2] = epoch, offset
                if end is not None:
                    job[5] = end
                return
        try:
            fh = open(_manifest.safe_join(self.root, rel), "rb")  # noqa: SIM115
        except (OSError, ValueError) as exc:
            return self.reply("#X", fid, "ENOENT", _codec.b64text("%s: %s" % (rel, exc)))
        squeeze = self.compress == "1"
        if self.compress == "auto":
            fh.seek(offset)
            squeeze = _codec.worth_compressing(fh.read(_codec.COMPRESS_SAMPLE_BYTES))
        self.jobs.append([fid, epoch, offset, rel, fh, end, squeeze])

    def pump(self):
        job = self.jobs[0]
        fid, epoch, offset, _, fh, end, squeeze = job
        want = self.chunk_bytes if end is None else min(self.chunk_bytes, end - offset)
        raw = b""
        if want > 0:
            fh.seek(offset)
            raw = fh.read(want)
        if not raw:
            fh.close()
            self.jobs.pop(0)
            return self.reply("#E", fid, epoch, offset)
        self.send(
            _codec.encode_frame(fid, epoch, offset, raw, squeeze, self.line_chars, self.framing)
        )
        job[2] = offset + len(raw)
        self.credit_bytes -= len(raw)


# --------------------------------------------------------------------------- the tty


def peak_rss_kib():
    """This process's peak resident memory since it started, KiB (0 where unknown).

    ``VmHWM`` of ``/proc/self/status`` counts this program only; ``ru_maxrss`` also
    counts the memory of the process it was forked from before ``exec``.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):
        return 0


def make_raw(fd):
    """Put the tty ``fd`` in raw mode, as ``stty raw -echo -iexten`` does, and check it.

    Returns:
        ``raw`` when the tty now passes every byte unchanged both ways, else ``cooked``.
    """
    t = termios
    iflag_off = 0
    for name in _RAW_IFLAGS_OFF:
        iflag_off |= getattr(t, name, 0)
    lflag_off = t.ECHO | t.ECHONL | t.ICANON | t.ISIG | t.IEXTEN
    try:
        attrs = t.tcgetattr(fd)
        attrs[0] &= ~iflag_off
        attrs[1] &= ~t.OPOST
        attrs[2] = (attrs[2] & ~(t.CSIZE | t.PARENB)) | t.CS8
        attrs[3] &= ~lflag_off
        attrs[6][t.VMIN], attrs[6][t.VTIME] = 1, 0
        t.tcsetattr(fd, t.TCSANOW, attrs)
        now = t.tcgetattr(fd)
    except (t.error, OSError):
        return "cooked"
    clean = not (now[0] & iflag_off or now[1] & t.OPOST or now[3] & lflag_off)
    return "raw" if clean and now[2] & t.CSIZE == t.CS8 else "cooked"


def read_frame(src, view, pending, wait=None):
    """Read from ``src`` into ``view``; returns the bytes read (0 at end of input).

    A tty hands its reader at most about 4 KiB per ``read``. While a frame is under
    way, ``pending`` (``FrameParser.pending``: bytes still to come, and whether that
    count is exact) lets reads go on until they are all in, so the parser runs once
    per frame rather than once per piece, and no read allocates (``readinto`` a
    buffer reused throughout). A raw frame's count is exact, so those reads block as
    the parser would; a base64 frame's is a lower bound on a path that may lose bytes,
    so each further read first asks ``wait`` (True: more input is ready) and parsing
    goes ahead as soon as input pauses.
    """
    n = src.readinto(view) or 0
    count, exact = pending
    want = min(count, len(view))
    while 0 < n < want:
        if not exact and (wait is None or not wait()):
            break
        got = src.readinto(view[n:want]) or 0
        if not got:
            break
        n += got
    return n


def main(argv=None):
    """Serve the protocol on stdin/stdout until ``#BYE`` or end of input."""
    import argparse

    parser = argparse.ArgumentParser(description="pod end of the pty transfer")
    parser.add_argument("--root", required=True)
    parser.add_argument("--window-bytes", type=int, default=DEFAULT_WINDOW_BYTES)
    parser.add_argument("--chunk-bytes", type=int, default=_codec.DEFAULT_CHUNK_BYTES)
    parser.add_argument("--line-chars", type=int, default=_codec.DEFAULT_LINE_CHARS)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        os.makedirs(args.root)
    input_kind = make_raw(0) if os.isatty(0) else "pipe"
    Receiver(
        args.root,
        window_bytes=args.window_bytes,
        chunk_bytes=args.chunk_bytes,
        line_chars=args.line_chars,
        input_kind=input_kind,
    ).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
