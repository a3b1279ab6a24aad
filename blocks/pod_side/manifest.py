#!/usr/bin/env python3
"""File manifests: relative path, size in bytes, md5 and sha256 of every file in a tree.

One implementation for both ends of a transfer: the flow imports it as
``prefect_runpod.blocks.pod_side.manifest`` and the pod runs it as a script that prints
JSON. Standard library only, Python 3.8+.

A manifest is a plain dict, so it crosses the wire as JSON and needs none of our
classes::

    {"root": "/workspace/bundle",
     "entries": [{"path": "data/train.jsonl", "size_bytes": 1234,
                  "md5": "<32 hex>", "sha256": "<64 hex>"}, ...]}

Entries are sorted by path; paths are relative to ``root`` with ``/`` separators.
Work-in-progress files of a transfer (``*.part`` and their ``*.part.json`` sidecars)
are left out. Each file is read once; md5 and sha256 run side by side on two threads
(``hashlib`` releases the GIL on large buffers), so the pair costs about as much as
the slower of the two, not their sum.

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


def _hash_stream(fileobj, limit_bytes=None):
    """Read ``fileobj`` to EOF (or ``limit_bytes``) once; return (size, md5hex, sha256hex)."""
    md5 = hashlib.md5()
    sha = hashlib.sha256()
    size = 0
    remaining = limit_bytes
    pending = None  # the md5 thread of the previous buffer
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
        if pending is not None:
            pending.join()
        if len(buf) >= 65536:
            pending = threading.Thread(target=md5.update, args=(buf,))
            pending.start()
            sha.update(buf)
        else:
            pending = None
            md5.update(buf)
            sha.update(buf)
    if pending is not None:
        pending.join()
    return size, md5.hexdigest(), sha.hexdigest()


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
        return _hash_stream(fh, limit_bytes)


def hash_bytes(data):
    """``(size_bytes, md5_hex, sha256_hex)`` of an in-memory buffer."""
    return len(data), hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()


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
    """The manifest entry (dict) of ``rel_path`` under ``root``.

    Raises:
        OSError: the file is missing or unreadable.
    """
    full = root if os.path.isfile(root) else os.path.join(root, *rel_path.split("/"))
    size, md5, sha = hash_file(full, limit_bytes)
    return {"path": rel_path, "size_bytes": size, "md5": md5, "sha256": sha}


def compute_manifest(root, paths=None, limit_bytes=None):
    """The manifest of a tree (or of one file).

    Args:
        root: a directory, or a single file (its entry is then named by its basename).
        paths: relative paths to include (default: every file under ``root``).
        limit_bytes: hash only each file's first N bytes (for resuming a partial copy).

    Returns:
        ``{"root": str, "entries": [{"path", "size_bytes", "md5", "sha256"}, ...]}``,
        entries sorted by path.

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
    """
    have = {e["path"]: e for e in actual["entries"]}
    problems = []
    for want in expected["entries"]:
        got = have.get(want["path"])
        if got is None:
            problems.append((want["path"], "missing"))
            continue
        for key in ("size_bytes", "sha256", "md5"):
            if want[key] != got[key]:
                problems.append((want["path"], "%s %s != %s" % (key, want[key], got[key])))
                break
    return problems


def main(argv=None):
    """Print the manifest of ``ROOT`` as one JSON line; exit 2 when it is missing."""
    parser = argparse.ArgumentParser(description="md5+sha256 manifest of a tree, as JSON")
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
