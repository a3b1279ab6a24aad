#!/usr/bin/env python3
"""File manifests: relative path, size in bytes, md5, sha256 and git blob sha1 of every
file in a tree.

One implementation for both ends of a transfer: the flow imports it as
``prefect_runpod.blocks.pod_side.manifest`` and the pod runs it as a script that prints
JSON. Standard library only, Python 3.8+.

A manifest is a plain dict, so it crosses the wire as JSON and needs none of our
classes::

    {"root": "/workspace/bundle",
     "entries": [{"path": "data/train.jsonl", "size_bytes": 1234,
                  "md5": "<32 hex>", "sha256": "<64 hex>", "git_sha1": "<40 hex>"}, ...]}

Entries are sorted by path; paths are relative to ``root`` with ``/`` separators.
Work-in-progress files of a transfer (``*.part`` and their ``*.part.json`` sidecars)
are left out. Each file is read once; md5, sha256 and the git blob sha1 run side by
side on threads (``hashlib`` releases the GIL on large buffers), so together they cost
about as much as the slowest of them, not their sum.

``git_sha1`` is the id git (and so the Hugging Face Hub) gives the file's content:
``sha1(b"blob <size>\\0" + data)``. The Hub reports it for every file it stores as a
regular git blob, so a published file can be checked without downloading it (for
files it stores in LFS it reports the sha256). Hashes of a file's first N bytes
(``--prefix-bytes``) carry no ``git_sha1``.

Command line (prints one JSON object on stdout)::

    python3 manifest.py ROOT                      # the whole tree
    python3 manifest.py ROOT --files a.txt b/c    # only these relative paths
    python3 manifest.py ROOT --prefix-bytes N --files f   # hashes of each file's first N bytes
"""

import argparse
import hashlib
import json
import os
import sys
import threading

READ_BYTES = 4 * 1024 * 1024
PART_SUFFIX = ".part"
SIDECAR_SUFFIX = ".part.json"


def _hash_stream(fileobj, limit_bytes=None, blob_size=None):
    """Read ``fileobj`` to EOF (or ``limit_bytes``) once.

    Returns:
        ``(size, md5hex, sha256hex, git_sha1hex)``; ``git_sha1hex`` is None unless
        ``blob_size`` (the size the git blob header announces) is given.

    Raises:
        OSError: ``blob_size`` was given and the stream held a different number of bytes
            (the file changed while it was read).
    """
    md5 = hashlib.md5()
    sha = hashlib.sha256()
    blob = None
    if blob_size is not None:
        blob = hashlib.sha1()
        blob.update(b"blob %d\0" % blob_size)
    side = [h for h in (md5, blob) if h is not None]
    size = 0
    remaining = limit_bytes
    pending = []  # the side threads of the previous buffer
    while True:
        want = READ_BYTES if remaining is None else min(READ_BYTES, remaining)
        if want <= 0:
            break
        buf = fileobj.read(want)
        if not buf:
            break
        size += len(buf)
        if remaining is not None:
            remaining -= len(buf)
        for thread in pending:
            thread.join()
        pending = []
        if len(buf) >= 65536:
            for h in side:
                thread = threading.Thread(target=h.update, args=(buf,))
                thread.start()
                pending.append(thread)
        else:
            for h in side:
                h.update(buf)
        sha.update(buf)
    for thread in pending:
        thread.join()
    if blob is not None and size != blob_size:
        raise OSError(
            "file changed while it was hashed (%d bytes, expected %d)" % (size, blob_size)
        )
    return size, md5.hexdigest(), sha.hexdigest(), (blob.hexdigest() if blob else None)


def hash_file(path, limit_bytes=None):
    """Hash one file.

    Args:
        path: the file.
        limit_bytes: hash only the first ``limit_bytes`` bytes (None: the whole file).

    Returns:
        ``(size_bytes, md5_hex, sha256_hex)`` of what was read.

    Raises:
        OSError: the file cannot be opened or read.
    """
    with open(path, "rb") as fh:
        return _hash_stream(fh, limit_bytes)[:3]


def hash_bytes(data):
    """``(size_bytes, md5_hex, sha256_hex)`` of an in-memory buffer."""
    return len(data), hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()


def git_blob_sha1(data):
    """The git blob id of ``data`` (what ``git hash-object`` prints): the sha1 of
    ``b"blob <size>\\0"`` followed by the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_transfer_scratch(name):
    """True for a transfer's work-in-progress file (``x.part``, ``x.part.json``)."""
    return name.endswith(PART_SUFFIX) or name.endswith(SIDECAR_SUFFIX)


def list_files(root):
    """Relative POSIX paths of every regular file under ``root`` (or ``[""]``-free list
    with the file's own name when ``root`` is a file), sorted, transfer scratch left out.
    Symlinks to files are followed; symlinked directories are not descended."""
    if os.path.isfile(root):
        return [os.path.basename(root)]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            if is_transfer_scratch(name):
                continue
            full = os.path.join(dirpath, name)
            if not os.path.isfile(full):
                continue
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            out.append(rel.replace(os.sep, "/"))
    out.sort()
    return out


def entry_for(root, rel_path, limit_bytes=None):
    """The manifest entry (dict) of ``rel_path`` under ``root``: path, size_bytes, md5,
    sha256 and, for a whole file (no ``limit_bytes``), git_sha1.

    Raises:
        OSError: the file is missing or unreadable, or changed while it was read.
    """
    full = root if os.path.isfile(root) else os.path.join(root, *rel_path.split("/"))
    with open(full, "rb") as fh:
        blob_size = os.fstat(fh.fileno()).st_size if limit_bytes is None else None
        size, md5, sha, blob = _hash_stream(fh, limit_bytes, blob_size)
    entry = {"path": rel_path, "size_bytes": size, "md5": md5, "sha256": sha}
    if blob is not None:
        entry["git_sha1"] = blob
    return entry


def compute_manifest(root, paths=None, limit_bytes=None):
    """The manifest of a tree (or of one file).

    Args:
        root: a directory, or a single file (its entry is then named by its basename).
        paths: relative paths to include (default: every file under ``root``).
        limit_bytes: hash only each file's first N bytes (for resuming a partial copy).

    Returns:
        ``{"root": str, "entries": [{"path", "size_bytes", "md5", "sha256",
        "git_sha1"}, ...]}``, entries sorted by path (no ``git_sha1`` with
        ``limit_bytes``).

    Raises:
        OSError: ``root`` or a listed path is missing or unreadable.
    """
    root = os.fspath(root)
    if not os.path.exists(root):
        raise FileNotFoundError("manifest root does not exist: %s" % root)
    names = sorted(paths) if paths is not None else list_files(root)
    return {"root": root, "entries": [entry_for(root, p, limit_bytes) for p in names]}


def compare_manifests(expected, actual):
    """Differences between two manifests, keyed by relative path.

    Returns:
        A list of ``(path, problem)``, e.g. ``("a.bin", "sha256 ab12… != cd34…")``,
        ``("b.txt", "missing")``; empty when every expected entry matches. Extra files
        in ``actual`` are not problems (the destination may hold other files).
        ``git_sha1`` is compared only when both entries carry one.
    """
    have = {e["path"]: e for e in actual["entries"]}
    problems = []
    for want in expected["entries"]:
        got = have.get(want["path"])
        if got is None:
            problems.append((want["path"], "missing"))
            continue
        for key in ("size_bytes", "sha256", "md5", "git_sha1"):
            mine, theirs = want.get(key), got.get(key)
            if key == "git_sha1" and (mine is None or theirs is None):
                continue
            if mine != theirs:
                problems.append((want["path"], "%s %s != %s" % (key, mine, theirs)))
                break
    return problems


def main(argv=None):
    """Print the manifest of ``ROOT`` as one JSON line; exit 2 when it is missing."""
    parser = argparse.ArgumentParser(description="md5+sha256+git-sha1 manifest of a tree, as JSON")
    parser.add_argument("root")
    parser.add_argument("--files", nargs="*", default=None, help="relative paths to include")
    parser.add_argument("--prefix-bytes", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        manifest = compute_manifest(args.root, args.files, args.prefix_bytes)
    except OSError as exc:
        sys.stderr.write("manifest: %s\n" % exc)
        return 2
    sys.stdout.write(json.dumps(manifest, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
