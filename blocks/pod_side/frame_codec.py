#!/usr/bin/env python3
"""The frames of the ``pty`` transfer, for both ends (docs/architecture.md#the-pty-framing).

Standard library only, Python 3.8+. The receiver on the pod imports this file from its
own folder; the flow imports it as ``prefect_runpod.blocks.pod_side.frame_codec``, so
both ends share one implementation.

Every control line starts with ``#`` and a tag and ends in ``\\n`` (a ``\\r`` added on
the way is ignored). A data frame is a header line and its payload, in one of two
framings:

* **base64** (``#D``): the payload is base64 wrapped in lines of at most ``line_chars``
  characters (under the tty's 4096-byte canonical limit), so it survives any tty::

      #D <fid> <epoch> <offset> <rawlen> <flag> <enclen> <crc32>
      <base64 line>...

* **raw** (``#R``): the payload's ``enclen`` bytes as they are, then ``\\n``. Only for a
  path that carries every byte value unchanged, which the probe checks first::

      #R <fid> <epoch> <offset> <rawlen> <flag> <enclen> <crc32>\\n<enclen bytes>\\n

``flag`` is ``r`` (as is) or ``z`` (zlib level 1); ``crc32`` is the CRC-32 hex of
``"<fid>:<offset>:"`` followed by the chunk's raw bytes, so a garbled header or
payload, a payload cut short, or a chunk delivered to the wrong place is caught.

**The probe** (both directions): ``#PROBE <token>``, the bytes of :data:`PROBE_PATTERN`
(all 256 byte values, and the sequences terminals and gateways like to rewrite), then
``\\n#PROBE-END <token>\\n``. The random token never occurs in the pattern, so the end
is found whatever happened to the bytes in between.
"""

import base64
import binascii
import hashlib
import zlib

DEFAULT_CHUNK_BYTES = 256 * 1024
DEFAULT_LINE_CHARS = 4000
MAX_FRAME_BYTES = 64 * 1024 * 1024  # a header announcing more is garbage
FRAMINGS = ("raw", "base64")
COMPRESS_SAMPLE_BYTES = 64 * 1024
COMPRESS_WORTH_RATIO = 0.9  # compress a file only when a sample shrinks below this

PROBE_PATTERN = (
    bytes(range(256))
    + bytes(range(255, -1, -1))
    + b"\r\n~.\r~?\n\x1b[6n\x1b]0;t\x07\xff\xff\xfe\x00\x00\r\r\n\n\x03\x04\x11\x13\x1a\x1c\x7f\x08"
    + bytes(range(128, 256))
    + b"\n"
)
"""What the probe sends each way: every byte value, both orders, plus line ends, the
ssh escape (``~.``), a cursor query, an OSC title, telnet's IAC, NUL and the signal,
flow-control and erase keys."""
_PROBE_LIMIT_BYTES = 64 * 1024


# --------------------------------------------------------------------------- chunks


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


def worth_compressing(sample):
    """True when zlib (level 1) shrinks ``sample`` below 90 %: text and JSON do, random
    or already-compressed data (safetensors weights, archives) does not, and then no
    chunk of that file pays for a compression attempt."""
    if not sample:
        return False
    return len(zlib.compress(sample, 1)) < COMPRESS_WORTH_RATIO * len(sample)


def encode_frame(
    fid, epoch, offset, raw, compress=False, line_chars=DEFAULT_LINE_CHARS, framing="base64"
):
    """One data frame as bytes.

    Args:
        fid: file id (digits) or a blob letter.
        epoch: the sender's restart counter for this file (stale frames are dropped).
        offset: byte offset of ``raw`` in the file.
        raw: the chunk's bytes.
        compress: zlib-compress (level 1) when that makes the payload smaller.
        line_chars: base64 framing: at most this many characters per line (a multiple
            of 4 is used).
        framing: ``base64`` (``#D``, any tty) or ``raw`` (``#R``, a path that passed
            the probe).
    """
    flag = "r"
    body = raw
    if compress and raw:
        packed = zlib.compress(raw, 1)
        if len(packed) < len(raw):
            body, flag = packed, "z"
    digest = chunk_digest(fid, offset, raw)
    if framing == "raw":
        header = "#R %s %d %d %d %s %d %s\n" % (
            fid,
            epoch,
            offset,
            len(raw),
            flag,
            len(body),
            digest,
        )
        return b"".join((header.encode("ascii"), body, b"\n"))
    header = "#D %s %d %d %d %s %d %s\n" % (
        fid,
        epoch,
        offset,
        len(raw),
        flag,
        4 * ((len(body) + 2) // 3),
        digest,
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


# --------------------------------------------------------------------------- probe


def probe_block(token):
    """The probe as sent: ``#PROBE <token>``, the pattern, ``#PROBE-END <token>``."""
    tok = token.encode("ascii")
    return b"#PROBE " + tok + b"\n" + PROBE_PATTERN + b"\n#PROBE-END " + tok + b"\n"


def probe_verdict(got):
    """``(ok, detail)`` for the bytes a probe delivered (None: no end was found).

    ``detail`` names the first difference (``byte 259 sent 0x0d got 0x0a``), so a
    person can tell a line-ending rewrite from lost bytes.
    """
    want = PROBE_PATTERN
    if got is None:
        return False, "its end never arrived"
    if got == want:
        return True, "all %d bytes intact" % len(want)
    for i in range(min(len(got), len(want))):
        if got[i] != want[i]:
            return False, "%d of %d bytes arrived; byte %d sent 0x%02x got 0x%02x" % (
                len(got),
                len(want),
                i,
                want[i],
                got[i],
            )
    return False, "%d of %d bytes arrived; the first %d are intact" % (
        len(got),
        len(want),
        min(len(got), len(want)),
    )


# --------------------------------------------------------------------------- parser


class Frame(object):
    """A decoded data frame: ``fid``, ``epoch``, ``offset``, ``raw`` (bytes, or None when
    the frame failed its checks) and ``error`` (why it failed)."""

    __slots__ = ("fid", "epoch", "offset", "rawlen", "raw", "error")

    def __init__(self, fid, epoch, offset, rawlen, raw, error):
        self.fid, self.epoch, self.offset, self.rawlen = fid, epoch, offset, rawlen
        self.raw, self.error = raw, error


def _header(fields):
    """``(kind, fid, epoch, offset, rawlen, flag, enclen, digest)`` of a ``#D``/``#R``
    line's fields, or None when it is garbled."""
    try:
        head = (
            fields[0][1:2].decode("ascii"),
            fields[1].decode("ascii"),
            int(fields[2]),
            int(fields[3]),
            int(fields[4]),
            fields[5].decode("ascii"),
            int(fields[6]),
            fields[7].decode("ascii"),
        )
    except (IndexError, ValueError, UnicodeDecodeError):
        return None
    if not (0 <= head[6] <= MAX_FRAME_BYTES and 0 <= head[4] <= MAX_FRAME_BYTES):
        return None
    return head


class FrameParser(object):
    """Incremental decoder: ``feed(bytes)`` returns events in order.

    Events are ``("line", [tag, arg, ...])`` for control lines, ``("frame", Frame)`` for
    data frames of either framing (bad frames included, with ``raw=None``) and
    ``("probe", (token, bytes or None))`` for a probe. Lines that are none of these
    (shell echo, prompts, the damaged rest of a frame) are dropped.
    """

    def __init__(self):
        self._buf = bytearray()
        self._head = None  # (kind, fid, epoch, offset, rawlen, flag, enclen, digest)
        self._parts = []
        self._have = 0
        self._probe = None  # (token, end marker) while a probe's bytes arrive

    def pending(self):
        """``(bytes, exact)``: how many bytes at least are still to come for the frame
        under way, beyond what was fed (0 between frames). Exact for a raw frame (its
        payload's rest and the ``\\n`` after it); for base64 the payload characters
        still missing, line breaks not counted, so the true count is larger, and a
        damaged path may never deliver them."""
        head = self._head
        if head is None:
            return 0, True
        if head[0] == "R":
            return max(0, head[6] - self._have + 1 - len(self._buf)), True
        return max(0, head[6] - self._have - len(self._buf)), False

    def feed(self, data):
        """Add received bytes; return the complete events they finish."""
        events = []
        if data:
            self._buf += data
        buf = self._buf
        pos = 0
        while True:
            if self._probe is not None:
                pos, done = self._probe_step(buf, pos, events)
                if not done:
                    break
                continue
            head = self._head
            if head is not None and head[0] == "R":
                need = head[6] - self._have
                if need > 0:
                    take = min(need, len(buf) - pos)
                    if take <= 0:
                        break
                    with memoryview(buf) as view:  # one copy, not a slice and a copy
                        self._parts.append(bytes(view[pos : pos + take]))
                    self._have += take
                    pos += take
                    continue
                if pos >= len(buf):
                    break
                if buf[pos : pos + 1] == b"\n":
                    events.append(("frame", self._finish()))
                    pos += 1
                else:  # more bytes than announced: the header or the payload is damaged
                    events.append(("frame", self._bad("frame length mismatch")))
                continue
            if head is not None:
                # base64 payload: take every whole line up to the next "#" (never in
                # base64, so a control line or the next header) in one piece.
                stop = buf.find(b"#", pos)
                last = buf.rfind(b"\n", pos, len(buf) if stop < 0 else stop)
                if last >= pos:
                    with memoryview(buf) as view:  # line breaks are skipped by a2b
                        body = bytes(view[pos : last + 1])
                    pos = last + 1
                    self._parts.append(body)
                    crs = body.count(b"\r") if b"\r" in body else 0  # "in" is the fast scan
                    self._have += len(body) - body.count(b"\n") - crs
                    if self._have >= head[6]:
                        events.append(("frame", self._finish()))
                    continue
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            line = bytes(buf[pos:nl]).strip(b"\r \t")
            pos = nl + 1
            if head is not None:
                if line.startswith(b"#"):
                    events.append(("frame", self._bad("truncated payload")))
                else:  # a line with a "#" inside: damaged payload, the checks catch it
                    self._parts.append(line)
                    self._have += len(line)
                    if self._have >= head[6]:
                        events.append(("frame", self._finish()))
                    continue
            if not line.startswith(b"#"):
                continue
            if line.startswith(b"#D ") or line.startswith(b"#R "):
                new = _header(line.split())
                if new is None:
                    continue  # a garbled header: its payload lines are dropped as noise
                self._head, self._parts, self._have = new, [], 0
                if new[0] == "D" and new[6] == 0:
                    events.append(("frame", self._finish()))
                continue
            if line.startswith(b"#PROBE "):
                token = line[7:].strip()
                self._probe = (token, b"\n#PROBE-END " + token)
                continue
            try:
                events.append(("line", line.decode("ascii").split()))
            except UnicodeDecodeError:
                continue
        del buf[:pos]
        return events

    def _probe_step(self, buf, pos, events):
        """Look for the probe's end; ``(pos, True)`` once it is handled."""
        token, end = self._probe
        idx = buf.find(end, pos)
        if idx >= 0:
            stop = buf.find(b"\n", idx + len(end))
            if stop < 0:
                return pos, False
            got = bytes(buf[pos:idx])
            events.append(("probe", (token.decode("ascii", "replace"), got)))
            self._probe = None
            return stop + 1, True
        if len(buf) - pos > _PROBE_LIMIT_BYTES:
            events.append(("probe", (token.decode("ascii", "replace"), None)))
            self._probe = None
            return pos, True
        return pos, False

    def _bad(self, why):
        fid, epoch, offset, rawlen = self._head[1:5]
        self._head, self._parts, self._have = None, [], 0
        return Frame(fid, epoch, offset, rawlen, None, why)

    def _finish(self):
        kind, fid, epoch, offset, rawlen, flag, enclen, digest = self._head
        if self._have != enclen:
            return self._bad("payload length %d != %d" % (self._have, enclen))
        enc = b"".join(self._parts)
        try:
            # base64 with line breaks, which a2b_base64 skips
            body = enc if kind == "R" else binascii.a2b_base64(enc)
            raw = zlib.decompress(body) if flag == "z" else body
        except (binascii.Error, zlib.error, ValueError) as exc:
            return self._bad("undecodable payload (%s)" % exc)
        if len(raw) != rawlen or _digest_for(digest)(fid, offset, raw) != digest:
            return self._bad("chunk hash mismatch")
        self._head, self._parts, self._have = None, [], 0
        return Frame(fid, epoch, offset, rawlen, raw, None)
