#!/usr/bin/env python3
"""The pod end of the ``pty`` transfer: framed, hashed, acknowledged chunks over a tty.

Standard library only, Python 3.8+. The flow imports the frame codec from here
(``prefect_runpod.blocks.pod_side.receiver``) so both ends share one implementation.

Wire format (ASCII only, so it survives any tty; every line ends in ``\\n``, a ``\\r``
added on the way is ignored). A control line starts with ``#`` and a tag; a data
frame is a header line followed by its base64 payload wrapped in lines of at most
``line_chars`` characters (default 4000, under the tty's 4096-byte canonical limit
even if raw mode were lost)::

    #D <fid> <epoch> <offset> <rawlen> <flag> <enclen> <digest>
    <base64 line>...

``flag`` is ``r`` (raw) or ``z`` (zlib); ``digest`` is the CRC-32 hex of
``"<fid>:<offset>:"`` followed by the chunk's raw bytes, so a garbled header or
payload, or a payload cut short (the next ``#`` line arrives early), is caught; each
whole file is verified by sha256 before it takes its name.

Speed: a tty hands its reader at most 4 KiB per ``read``, so on a tty the receiver
starts ``cat`` to copy its input into a pipe and reads that in large pieces (a Python
loop on the tty itself paid a wakeup per 4 KiB and was the bottleneck of uploads).

Upload (flow → pod), files kept as ``<name>.part`` plus a ``<name>.part.json`` sidecar
(target size and sha256) until verified, so a new receiver resumes where the last
one stopped: the ``.part`` file only ever holds verified bytes::

    → #OPEN fid size sha256 path_b64     ← #O fid offset (part|done)
    → #D fid epoch offset ...            ← #A fid epoch offset end | #N fid epoch offset expected reason
    → #CLOSE fid                         ← #C fid size md5 sha256 | #I fid verified | #BAD fid reason
    → #SYNC fid                          ← #S fid verified
    any write error                      ← #X fid errno-name message_b64

Download (pod → flow), windowed by the flow's acknowledgements::

    → #GET fid epoch offset path_b64     ← #D fid epoch offset ... (until EOF) then #E fid epoch size
    → #A fid epoch offset                (one per frame received: returns window credit)

Blobs (JSON in a data frame with a letter fid): ``M`` asks for the manifest of the
listed paths (``{"paths": [...] | null, "follow_links": bool, "structure": [...]}``),
first making the directory and link entries of ``structure`` (``manifest.apply_structure``),
and is answered by an ``M`` frame holding the manifest (``manifest.compute_manifest``),
or ``{"error", "problems"}`` naming links that cannot be carried. ``#BYE`` ends the
receiver.

Command line: ``python3 receiver.py --root DIR [--window-bytes N] [--chunk-bytes N]``;
prints ``#READY <version>`` when it listens.
"""

import base64
import binascii
import errno
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import zlib

try:  # on the pod the script's own folder holds manifest.py
    import manifest as _manifest  # type: ignore
except ImportError:  # imported as a package module by the flow
    from prefect_runpod.blocks.pod_side import manifest as _manifest  # type: ignore

PROTOCOL_VERSION = "3"  # 2: CRC-32 chunk digests; 3: trees (dirs, links, follow_links)
DEFAULT_CHUNK_BYTES = 256 * 1024
DEFAULT_LINE_CHARS = 4000
DEFAULT_WINDOW_BYTES = 8 * 1024 * 1024
READ_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), named in Python 3.10+ only
_RELAY_PIPE_BYTES = 1 << 20


# --------------------------------------------------------------------------- codec


def chunk_digest(fid, offset, raw):
    """CRC-32 hex of ``"<fid>:<offset>:" + raw`` (binds the payload to its place).

    A per-chunk check against damage on the way (a tty, a gateway), cheap enough for
    every byte; the whole file is then verified by its sha256 before it takes its name.
    """
    return "%08x" % zlib.crc32(raw, zlib.crc32(("%s:%d:" % (fid, offset)).encode("ascii")))


def _sha256_digest(fid, offset, raw):
    h = hashlib.sha256(("%s:%d:" % (fid, offset)).encode("ascii"))
    h.update(raw)
    return h.hexdigest()


def _digest_for(digest):
    """The check a frame's digest was made with: CRC-32 (8 hex digits), or the sha256
    (64) that protocol 1 senders still running use."""
    return _sha256_digest if len(digest) == 64 else chunk_digest


def encode_frame(fid, epoch, offset, raw, compress=False, line_chars=DEFAULT_LINE_CHARS):
    """One data frame as bytes (header line + wrapped base64 lines).

    Args:
        fid: file id (digits) or a blob letter.
        epoch: the sender's restart counter for this file (stale frames are dropped).
        offset: byte offset of ``raw`` in the file.
        raw: the chunk's bytes.
        compress: zlib-compress (level 1) when that makes the payload smaller.
        line_chars: at most this many base64 characters per line (a multiple of 4
            is used).
    """
    flag = "r"
    body = raw
    if compress and raw:
        packed = zlib.compress(raw, 1)
        if len(packed) < len(raw):
            body, flag = packed, "z"
    header = "#D %s %d %d %d %s %d %s\n" % (
        fid,
        epoch,
        offset,
        len(raw),
        flag,
        4 * ((len(body) + 2) // 3),
        chunk_digest(fid, offset, raw),
    )
    if not body:
        return header.encode("ascii")
    # base64 of 3-byte-aligned pieces, each with its newline, is the wrapped base64
    # of the whole: one pass, no split and re-join.
    step = max(1, line_chars // 4) * 3
    view = memoryview(body)
    b2a = binascii.b2a_base64
    lines = [b2a(view[i : i + step]) for i in range(0, len(body), step)]
    lines.insert(0, header.encode("ascii"))
    return b"".join(lines)


def b64text(text):
    """``text`` as one base64 token (for paths with spaces or any unicode)."""
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def unb64text(token):
    """Inverse of :func:`b64text`."""
    return base64.b64decode(token.encode("ascii")).decode("utf-8")


class Frame(object):
    """A decoded data frame: ``fid``, ``epoch``, ``offset``, ``raw`` (bytes, or None when
    the frame failed its checks) and ``error`` (why it failed)."""

    __slots__ = ("fid", "epoch", "offset", "rawlen", "raw", "error")

    def __init__(self, fid, epoch, offset, rawlen, raw, error):
        self.fid, self.epoch, self.offset, self.rawlen = fid, epoch, offset, rawlen
        self.raw, self.error = raw, error


class FrameParser(object):
    """Incremental decoder: ``feed(bytes)`` returns events in order.

    Events are ``("line", [tag, arg, ...])`` for control lines and ``("frame", Frame)``
    for data frames (bad frames included, with ``raw=None``). Lines that are neither
    (shell echo, prompts) are dropped.
    """

    def __init__(self):
        self._buf = bytearray()
        self._head = None  # (fid, epoch, offset, rawlen, flag, enclen, digest)
        self._parts = []
        self._have = 0

    def feed(self, data):
        """Add received bytes; return the complete events they finish."""
        events = []
        if data:
            self._buf += data
        buf = self._buf
        pos = 0
        while True:
            if self._head is not None:
                # Payload: take every whole line up to the next "#" (never in base64,
                # so a control line or the next header) in one piece, not line by line.
                stop = buf.find(b"#", pos)
                last = buf.rfind(b"\n", pos, len(buf) if stop < 0 else stop)
                if last >= pos:
                    body = bytes(buf[pos : last + 1])  # line breaks are skipped by a2b
                    pos = last + 1
                    self._parts.append(body)
                    self._have += len(body) - body.count(b"\n") - body.count(b"\r")
                    if self._have >= self._head[5]:
                        events.append(("frame", self._finish()))
                    continue
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            line = bytes(buf[pos:nl]).strip(b"\r \t")
            pos = nl + 1
            if self._head is not None:
                if line.startswith(b"#"):
                    events.append(("frame", self._bad("truncated payload")))
                else:  # a line with a "#" inside: damaged payload, the checks catch it
                    self._parts.append(line)
                    self._have += len(line)
                    if self._have >= self._head[5]:
                        events.append(("frame", self._finish()))
                    continue
            if not line.startswith(b"#"):
                continue
            if line.startswith(b"#D "):
                fields = line.split()
                try:
                    head = (
                        fields[1].decode("ascii"),
                        int(fields[2]),
                        int(fields[3]),
                        int(fields[4]),
                        fields[5].decode("ascii"),
                        int(fields[6]),
                        fields[7].decode("ascii"),
                    )
                except (IndexError, ValueError, UnicodeDecodeError):
                    continue  # a garbled header: its payload lines are dropped as noise
                self._head, self._parts, self._have = head, [], 0
                if head[5] == 0:
                    events.append(("frame", self._finish()))
                continue
            try:
                events.append(("line", line.decode("ascii").split()))
            except UnicodeDecodeError:
                continue
        del buf[:pos]
        return events

    def _bad(self, why):
        fid, epoch, offset, rawlen = self._head[:4]
        self._head, self._parts, self._have = None, [], 0
        return Frame(fid, epoch, offset, rawlen, None, why)

    def _finish(self):
        fid, epoch, offset, rawlen, flag, enclen, digest = self._head
        if self._have != enclen:
            return self._bad("payload length %d != %d" % (self._have, enclen))
        enc = b"".join(self._parts)  # base64 with line breaks, which a2b_base64 skips
        try:
            body = binascii.a2b_base64(enc)
            raw = zlib.decompress(body) if flag == "z" else body
        except (binascii.Error, zlib.error, ValueError) as exc:
            return self._bad("undecodable payload (%s)" % exc)
        if len(raw) != rawlen or _digest_for(digest)(fid, offset, raw) != digest:
            return self._bad("chunk hash mismatch")
        self._head, self._parts, self._have = None, [], 0
        return Frame(fid, epoch, offset, rawlen, raw, None)


# --------------------------------------------------------------------------- receiver


safe_join = _manifest.safe_join


class _Upload(object):
    def __init__(self, path, size, sha256):
        self.path, self.size, self.sha256 = path, size, sha256
        self.part = path + _manifest.PART_SUFFIX
        self.sidecar = path + _manifest.SIDECAR_SUFFIX
        self.fh = None
        self.md5 = hashlib.md5()
        self.sha = hashlib.sha256()
        self.offset = 0


class Receiver(object):
    """The pod-side state machine. Reads commands from ``in_fd``, writes to ``out``."""

    def __init__(
        self,
        root,
        in_fd=0,
        out=None,
        window_bytes=DEFAULT_WINDOW_BYTES,
        chunk_bytes=DEFAULT_CHUNK_BYTES,
        line_chars=DEFAULT_LINE_CHARS,
    ):
        self.root = root
        self.in_fd = in_fd
        self.out = out if out is not None else sys.stdout.buffer
        self.window_bytes = window_bytes
        self.chunk_bytes = chunk_bytes
        self.line_chars = line_chars
        self.parser = FrameParser()
        self.uploads = {}
        self.jobs = []  # download jobs: [fid, epoch, offset, path, fh]
        self.credit_bytes = window_bytes
        self.compress = False
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
        self.reply("#READY", PROTOCOL_VERSION)
        fd = self.in_fd
        while self.running:
            if self.jobs and self.credit_bytes > 0:
                ready, _, _ = select.select([fd], [], [], 0)
                if not ready:
                    self.pump()
                    continue
            data = os.read(fd, READ_BYTES)
            if not data:
                break
            for kind, ev in self.parser.feed(data):
                if kind == "line":
                    self.on_line(ev)
                else:
                    self.on_frame(ev)
        for up in self.uploads.values():
            if up.fh is not None:
                up.fh.close()

    def on_line(self, f):
        tag = f[0]
        try:
            if tag == "#OPEN":
                self.open_upload(f[1], int(f[2]), f[3], unb64text(f[4]))
            elif tag == "#CLOSE":
                self.close_upload(f[1])
            elif tag == "#SYNC":
                up = self.uploads.get(f[1])
                self.reply("#S", f[1], up.offset if up else 0)
            elif tag == "#GET":
                self.get(f[1], int(f[2]), int(f[3]), unb64text(f[4]))
            elif tag == "#A":
                self.credit_bytes = min(self.window_bytes, self.credit_bytes + self.chunk_bytes)
            elif tag == "#Z":
                self.compress = f[1] == "1"
            elif tag == "#BYE":
                self.running = False
        except (IndexError, ValueError, binascii.Error, UnicodeDecodeError):
            self.reply("#?", tag)

    # -- upload
    def open_upload(self, fid, size, sha256, rel):
        try:
            path = safe_join(self.root, rel)
        except ValueError as exc:
            return self.reply("#X", fid, "EINVAL", b64text(str(exc)))
        old = self.uploads.pop(fid, None)
        if old is not None and old.fh is not None:
            old.fh.close()
        up = _Upload(path, size, sha256)
        try:
            if os.path.isfile(path) and os.path.getsize(path) == size:
                _, md5, sha = _manifest.hash_file(path)
                if sha == sha256:
                    return self.reply("#O", fid, size, "done")
            parent = os.path.dirname(path)
            if parent and not os.path.isdir(parent):
                os.makedirs(parent)
            keep = 0
            if os.path.isfile(up.part) and os.path.isfile(up.sidecar):
                try:
                    with open(up.sidecar) as fh:
                        meta = json.load(fh)
                    if meta.get("size") == size and meta.get("sha256") == sha256:
                        keep = min(os.path.getsize(up.part), size)
                except ValueError:
                    keep = 0
            if keep == 0:
                with open(up.sidecar, "w") as fh:
                    json.dump({"size": size, "sha256": sha256}, fh)
            up.fh = open(up.part, "r+b" if keep else "wb", buffering=0)  # noqa: SIM115
            up.fh.truncate(keep)
            if keep:
                up.fh.seek(0)
                left = keep
                while left:
                    buf = up.fh.read(min(left, 4 << 20))
                    up.md5.update(buf)
                    up.sha.update(buf)
                    left -= len(buf)
            up.offset = keep
        except OSError as exc:
            return self.write_error(fid, rel, exc)
        self.uploads[fid] = up
        self.reply("#O", fid, up.offset, "part")

    def write_error(self, fid, rel, exc):
        name = errno.errorcode.get(exc.errno or 0, "EIO")
        what = {
            "ENOSPC": "no space left on the pod's disk",
            "EFBIG": "file size limit reached on the pod",
            "EDQUOT": "disk quota exceeded on the pod",
        }.get(name, exc.strerror or str(exc))
        self.reply("#X", fid, name, b64text("%s while writing %s" % (what, rel)))

    def on_frame(self, fr):
        if fr.fid == "M":
            return self.on_blob(fr)
        up = self.uploads.get(fr.fid)
        if up is None or up.fh is None:
            return self.reply("#N", fr.fid, fr.epoch, fr.offset, 0, "not-open")
        if fr.raw is None:
            return self.reply("#N", fr.fid, fr.epoch, fr.offset, up.offset, "bad")
        if fr.offset != up.offset or fr.offset + fr.rawlen > up.size:
            return self.reply("#N", fr.fid, fr.epoch, fr.offset, up.offset, "order")
        try:
            view = memoryview(fr.raw)
            while view:
                n = up.fh.write(view)
                view = view[n:]
        except OSError as exc:
            up.fh.truncate(up.offset)
            return self.write_error(fr.fid, os.path.relpath(up.path, self.root), exc)
        up.md5.update(fr.raw)
        up.sha.update(fr.raw)
        up.offset += fr.rawlen
        self.reply("#A", fr.fid, fr.epoch, fr.offset, up.offset)

    def close_upload(self, fid):
        up = self.uploads.get(fid)
        if up is None:
            return self.reply("#I", fid, 0)
        if up.offset != up.size:
            return self.reply("#I", fid, up.offset)
        sha = up.sha.hexdigest()
        up.fh.close()
        up.fh = None
        del self.uploads[fid]
        if sha != up.sha256:
            for p in (up.part, up.sidecar):
                if os.path.exists(p):
                    os.remove(p)
            return self.reply("#BAD", fid, "sha256", sha)
        os.replace(up.part, up.path)
        os.remove(up.sidecar)
        self.reply("#C", fid, up.size, up.md5.hexdigest(), sha)

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
                    self.root, req.get("paths"), follow_links=bool(req.get("follow_links"))
                )
        except _manifest.TreeProblems as exc:
            result = {"error": str(exc), "problems": exc.problems}
        except OSError as exc:
            result = {"error": str(exc)}
        body = json.dumps(result, separators=(",", ":")).encode("utf-8")
        self.send(encode_frame("M", fr.epoch, 0, body, True, self.line_chars))

    # -- download
    def get(self, fid, epoch, offset, rel):
        self.credit_bytes = self.window_bytes  # a (re)request resets the window
        for job in self.jobs:
            if job[0] == fid:
                job[1], job[2] = epoch, offset
                return
        try:
            fh = open(safe_join(self.root, rel), "rb")  # noqa: SIM115
        except (OSError, ValueError) as exc:
            return self.reply("#X", fid, "ENOENT", b64text("%s: %s" % (rel, exc)))
        self.jobs.append([fid, epoch, offset, rel, fh])

    def pump(self):
        job = self.jobs[0]
        fid, epoch, offset, _, fh = job
        fh.seek(offset)
        raw = fh.read(self.chunk_bytes)
        if not raw:
            fh.close()
            self.jobs.pop(0)
            return self.reply("#E", fid, epoch, offset)
        self.send(encode_frame(fid, epoch, offset, raw, self.compress, self.line_chars))
        job[2] = offset + len(raw)
        self.credit_bytes -= len(raw)


def _die_with_parent():  # pragma: no cover - runs in the forked child
    """In the relay's child: get SIGKILL when the receiver dies, however it dies, so
    no ``cat`` is left reading the console's tty."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_relay(fd):
    """A ``cat`` copying the tty ``fd`` into a pipe, when ``fd`` is a tty.

    A tty hands a reader at most 4 KiB per ``read`` (the line discipline's buffer), so
    a Python loop on it pays a wakeup per 4 KiB; ``cat`` pays that in C while this
    process reads the pipe (1 MiB when the kernel allows) in large pieces.

    Returns:
        ``(read_fd, process)``, or ``(fd, None)`` when ``fd`` is not a tty or ``cat``
        cannot start (the receiver then reads the tty itself).
    """
    if not os.isatty(fd):
        return fd, None
    try:
        proc = subprocess.Popen(
            ["cat"], stdin=fd, stdout=subprocess.PIPE, bufsize=0, preexec_fn=_die_with_parent
        )
    except (OSError, ValueError):
        return fd, None
    out = proc.stdout.fileno()
    try:
        import fcntl

        fcntl.fcntl(out, _F_SETPIPE_SZ, _RELAY_PIPE_BYTES)
    except (OSError, ImportError):
        pass
    return out, proc


def stop_relay(proc):
    """End the relay started by :func:`start_relay` (None: nothing to do)."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    proc.stdout.close()


def main(argv=None):
    """Serve the protocol on stdin/stdout until ``#BYE`` or end of input."""
    import argparse

    parser = argparse.ArgumentParser(description="pod end of the pty transfer")
    parser.add_argument("--root", required=True)
    parser.add_argument("--window-bytes", type=int, default=DEFAULT_WINDOW_BYTES)
    parser.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES)
    parser.add_argument("--line-chars", type=int, default=DEFAULT_LINE_CHARS)
    parser.add_argument(
        "--no-relay", action="store_true", help="read the tty directly (no cat relay)"
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        os.makedirs(args.root)
    in_fd, relay = (0, None) if args.no_relay else start_relay(0)
    try:
        Receiver(
            args.root,
            in_fd=in_fd,
            window_bytes=args.window_bytes,
            chunk_bytes=args.chunk_bytes,
            line_chars=args.line_chars,
        ).serve()
    finally:
        stop_relay(relay)
    return 0


if __name__ == "__main__":
    sys.exit(main())
