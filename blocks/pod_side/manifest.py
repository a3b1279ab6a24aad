#!/usr/bin/env python3
"""Tree manifests: every file (path, size in bytes, sha256, git blob sha1), empty
directory and symbolic link of a tree.

One implementation for both ends of a transfer: the flow imports it as
``prefect_runpod.blocks.pod_side.manifest`` and the pod runs it as a script that prints
JSON. Standard library only, Python 3.8+.

A manifest is a plain dict, so it crosses the wire as JSON and needs none of our
classes::

    {"root": "/workspace/bundle",
     "entries": [{"path": "data/train.jsonl", "size_bytes": 1234,
                  "sha256": "<64 hex>", "git_sha1": "<40 hex>"},
                 {"path": "ckpt/empty", "kind": "dir", ...},
                 {"path": "current", "kind": "link", "target": "ckpt", ...}, ...]}

Entries are sorted by path; paths are relative to ``root`` with ``/`` separators. A
file entry has no ``kind`` (it is the default); a directory is listed only when it is
empty (the files and links under the others imply them); a link keeps its target text
as written. Only **in-tree relative links** belong in a manifest: a link with an
absolute target, one whose target resolves outside the tree, and one whose target does
not exist are problems (:class:`TreeProblems`, naming each), so a transfer refuses
them before any byte moves; with ``follow_links`` the escaping ones are read through
(their target's files take their place) and only dangling ones stay problems.
Symlinked directories are never descended otherwise.

Work-in-progress files of a transfer (``*.part`` and their ``*.part.json`` sidecars)
are left out. Each file is read once; sha256 and the git blob sha1 run side by side
on threads (``hashlib`` releases the GIL on large buffers). No md5 is computed: nothing
checks one (sha256 is what a transfer verifies; RunPod's S3 ETag, an md5, is never
compared because that service computes it late; the Hub identifies files by git blob
sha1 or, in LFS, by sha256), and it was the slowest of the three (no CPU instruction
for it, where sha256 and sha1 have them). An ``md5`` in an entry from an older
``manifest.py`` is compared only when both sides carry one.

A file hashed moments ago need not be read again while it is unchanged
(:func:`remember`, ``known`` of :func:`compute_manifest`): in one process, or, on the
pod, from one run of this script to the next within a transfer (``--save-known`` /
``--use-known``, a small JSON file of the entries and their file signatures).

``git_sha1`` is the id git (and so the Hugging Face Hub) gives the file's content:
``sha1(b"blob <size>\\0" + data)``. The Hub reports it for every file it stores as a
regular git blob, so a published file can be checked without downloading it (for
files it stores in LFS it reports the sha256). Hashes of a file's first N bytes
(``--prefix-bytes``) carry no ``git_sha1``.

Command line (prints one JSON object on stdout)::

    python3 manifest.py ROOT                      # the whole tree (exit 3 on problem links)
    python3 manifest.py ROOT --follow-links       # escaping links read through
    python3 manifest.py ROOT --files a.txt b/c    # only these relative paths
    python3 manifest.py ROOT --missing-ok --files a b     # those of them that exist
    python3 manifest.py ROOT --prefix-bytes N --files f   # hashes of each file's first N bytes
    python3 manifest.py ROOT --apply-b64 B64 [--files …]  # make dirs/links (JSON entries), then
                                                          # the manifest of them (or of --files)
    python3 manifest.py ROOT --files a --save-known K     # …and record what was hashed in K
    python3 manifest.py ROOT --files a --use-known K      # reuse K's unchanged files, remove K
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
        ``(size, sha256hex, git_sha1hex)``; ``git_sha1hex`` is None unless
        ``blob_size`` (the size the git blob header announces) is given.

    Raises:
        OSError: ``blob_size`` was given and the stream held a different number of bytes
            (the file changed while it was read).
    """
    sha = hashlib.sha256()
    blob = None
    if blob_size is not None:
        blob = hashlib.sha1()
        blob.update(b"blob %d\0" % blob_size)
    size = 0
    remaining = limit_bytes
    pending = None  # the git sha1 thread of the previous buffer
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
            pending = None
        if blob is not None and len(buf) >= 65536:
            pending = threading.Thread(target=blob.update, args=(buf,))
            pending.start()
        elif blob is not None:
            blob.update(buf)
        sha.update(buf)
    if pending is not None:
        pending.join()
    if blob is not None and size != blob_size:
        raise OSError(
            "file changed while it was hashed (%d bytes, expected %d)" % (size, blob_size)
        )
    return size, sha.hexdigest(), (blob.hexdigest() if blob else None)


def hash_file(path, limit_bytes=None):
    """Hash one file.

    Args:
        path: the file.
        limit_bytes: hash only the first ``limit_bytes`` bytes (None: the whole file).

    Returns:
        ``(size_bytes, sha256_hex)`` of what was read.

    Raises:
        OSError: the file cannot be opened or read.
    """
    with open(path, "rb") as fh:
        return _hash_stream(fh, limit_bytes)[:2]


def git_blob_sha1(data):
    """The git blob id of ``data`` (what ``git hash-object`` prints): the sha1 of
    ``b"blob <size>\\0"`` followed by the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_transfer_scratch(name):
    """True for a transfer's work-in-progress file (``x.part``, ``x.part.json``)."""
    return name.endswith(PART_SUFFIX) or name.endswith(SIDECAR_SUFFIX)


KIND_DIR = "dir"
KIND_LINK = "link"


class TreeProblems(ValueError):
    """Links a transfer cannot carry: ``problems`` lists ``(relative path, why)``."""

    def __init__(self, root, problems):
        self.root = root
        self.problems = list(problems)
        shown = "; ".join("%s (%s)" % p for p in self.problems[:20])
        more = len(self.problems) - 20
        if more > 0:
            shown += "; and %d more" % more
        ValueError.__init__(self, "links under %s that cannot be carried: %s" % (root, shown))


def _within(path, base):
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)


def link_problem(root, rel, target):
    """Why the link ``rel`` (target text ``target``) under ``root`` cannot be carried as a
    link, or None for an in-tree relative link whose target exists."""
    if os.path.isabs(target):
        return "absolute link to %s: make it relative, or copy its target" % target
    here = os.path.dirname(os.path.join(root, *rel.split("/")))
    lexical = os.path.normpath(os.path.join(here, target))
    if not _within(lexical, os.path.normpath(root)):
        return "points outside the tree, to %s" % lexical
    if not os.path.exists(lexical):
        return "dangling: %s does not exist" % target
    real = os.path.realpath(lexical)
    if not _within(real, os.path.realpath(root)):
        return "points outside the tree through another link, to %s" % real
    return None


def scan_tree(root, follow_links=False):
    """The tree under ``root``: ``(items, problems)``.

    ``items`` are ``(relative path, kind, link target)`` sorted by path, kind ``file``,
    ``dir`` (empty directories only) or ``link`` (in-tree relative links, target as
    written); ``problems`` are ``(relative path, why)`` for links that cannot be
    carried (see the module docstring). With ``follow_links`` an escaping link is read
    through: its target's files (or the file itself) are listed under the link's path,
    every link below it followed too, cycles cut.
    """
    if os.path.isfile(root):
        return [(os.path.basename(root), "file", None)], []
    items = []
    problems = []
    seen = set()

    def walk(real_dir, rel_dir, follow_all):
        key = os.path.realpath(real_dir)
        if key in seen:
            problems.append((rel_dir or ".", "a link cycle back to %s" % key))
            return
        seen.add(key)
        try:
            names = sorted(n for n in os.listdir(real_dir) if not is_transfer_scratch(n))
        except OSError as exc:
            problems.append((rel_dir or ".", "unreadable: %s" % exc.strerror))
            return
        if not names and rel_dir:
            items.append((rel_dir, KIND_DIR, None))
        for name in names:
            full = os.path.join(real_dir, name)
            rel = name if not rel_dir else rel_dir + "/" + name
            if os.path.islink(full):
                target = os.readlink(full)
                why = None if follow_all else link_problem(root, rel, target)
                if not follow_all and why is None:
                    items.append((rel, KIND_LINK, target))
                elif not os.path.exists(full):
                    problems.append((rel, "dangling: %s does not exist" % target))
                elif not (follow_all or follow_links):
                    problems.append((rel, why))
                elif os.path.isdir(full):
                    walk(full, rel, True)
                else:
                    items.append((rel, "file", None))
            elif os.path.isdir(full):
                walk(full, rel, follow_all)
            elif os.path.isfile(full):
                items.append((rel, "file", None))
        seen.discard(key)

    walk(root, "", False)
    items.sort()
    return items, problems


def select_tree(root, paths, follow_links=False):
    """:func:`scan_tree` restricted to a selection: ``(items, problems)`` for the entries
    in ``paths`` (files, links, empty directories, as a walk of the tree chose them, e.g.
    an upload's ignore rules) and for everything a selected followed link brings in."""
    items, problems = scan_tree(root, follow_links)
    chosen = set(paths)

    def picked(rel):
        parts = rel.split("/")
        return any("/".join(parts[:i]) in chosen for i in range(1, len(parts) + 1))

    return [it for it in items if picked(it[0])], [pr for pr in problems if picked(pr[0])]


def list_files(root):
    """Relative POSIX paths of every regular file under ``root`` (its own name when
    ``root`` is a file), sorted, transfer scratch left out; links are not followed.

    Raises:
        TreeProblems: the tree holds links that cannot be carried.
    """
    items, problems = scan_tree(root)
    if problems:
        raise TreeProblems(root, problems)
    return [rel for rel, kind, _ in items if kind == "file"]


def _link_entry(rel, target):
    return {"path": rel, "kind": KIND_LINK, "target": target, "size_bytes": 0, "sha256": ""}


def _dir_entry(rel):
    return {"path": rel, "kind": KIND_DIR, "size_bytes": 0, "sha256": ""}


def file_signature(path):
    """What says a file is unchanged since it was hashed: size, inode, device, mtime
    and ctime (a rename changes the ctime, so take it after the file has its name)."""
    st = os.stat(path)
    return (st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns)


def remember(known, path, entry):
    """Record in ``known`` that ``path`` (just hashed from disk) has ``entry``'s hashes."""
    if known is not None:
        known[os.path.abspath(path)] = (file_signature(path), entry)


def file_entry(full, rel, limit_bytes=None, known=None):
    """A file's entry: path, size_bytes, sha256 and, for a whole file (no
    ``limit_bytes``), git_sha1. With ``known`` (see :func:`compute_manifest`), a file
    hashed from disk earlier and unchanged since (same size, inode, device, mtime and
    ctime) is not read again, and a whole file read here is recorded in it."""
    whole = known is not None and limit_bytes is None
    before = file_signature(full) if whole else None
    if whole:
        hit = known.get(os.path.abspath(full))
        if hit is not None and tuple(hit[0]) == before:
            return dict(hit[1], path=rel)
    with open(full, "rb") as fh:
        blob_size = os.fstat(fh.fileno()).st_size if limit_bytes is None else None
        size, sha, blob = _hash_stream(fh, limit_bytes, blob_size)
    entry = {"path": rel, "size_bytes": size, "sha256": sha}
    if blob is not None:
        entry["git_sha1"] = blob
    if whole and file_signature(full) == before:  # unchanged while it was read
        known[os.path.abspath(full)] = (before, entry)
    return entry


def load_known(path):
    """The ``known`` entries an earlier run saved in ``path`` (:func:`save_known`),
    which is then removed; ``{}`` when it is missing or unreadable."""
    try:
        with open(path) as fh:
            saved = json.load(fh)
        os.remove(path)
    except (OSError, ValueError):
        return {}
    if not isinstance(saved, dict):
        return {}
    return {k: (tuple(v[0]), v[1]) for k, v in saved.items() if isinstance(v, list) and len(v) == 2}


def save_known(path, known):
    """Write ``known`` (absolute path -> (file_signature, entry)) to ``path`` as JSON,
    readable only by its owner, for a later run in the same transfer."""
    body = {k: [list(sig), entry] for k, (sig, entry) in known.items()}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(body, fh, separators=(",", ":"))


def entry_for(root, rel_path, limit_bytes=None, known=None):
    """The manifest entry (dict) of ``rel_path`` under ``root``: a link entry for a
    symbolic link (never followed), a directory entry for a directory, else the file's
    entry (path, size_bytes, sha256 and, for a whole file, git_sha1).

    Raises:
        OSError: the path is missing or unreadable, or a file changed while it was read.
    """
    if os.path.isfile(root):
        return file_entry(root, rel_path, limit_bytes, known)
    full = os.path.join(root, *rel_path.split("/"))
    if os.path.islink(full):
        return _link_entry(rel_path, os.readlink(full))
    if os.path.isdir(full):
        return _dir_entry(rel_path)
    return file_entry(full, rel_path, limit_bytes, known)


def compute_manifest(
    root,
    paths=None,
    limit_bytes=None,
    follow_links=False,
    select=False,
    known=None,
    missing_ok=False,
):
    """The manifest of a tree (or of one file).

    Args:
        root: a directory, or a single file (its entry is then named by its basename).
        paths: relative paths to include (default: the whole tree). Without ``select``
            each is described as it is (a destination being verified); with it they
            are a selection of the source tree, checked like the whole tree would be.
        limit_bytes: hash only each file's first N bytes (for resuming a partial copy).
        follow_links: read escaping links through (see the module docstring).
        select: ``paths`` is a source selection (see above).
        known: ``{absolute path: (file_signature, entry)}`` of files hashed from disk
            earlier in the same transfer (a transfer verifying what it just wrote,
            :func:`remember`, or what it found already there); one whose signature
            still matches is not read again, and the whole files read are added.
        missing_ok: with ``paths`` (not ``select``), leave out the paths that do not
            exist, and describe a missing ``root`` as an empty tree (what is already at
            a destination).

    Returns:
        ``{"root": str, "entries": [...]}``, entries sorted by path (a file's carries
        ``git_sha1`` unless ``limit_bytes``).

    Raises:
        TreeProblems: the tree (or the selection) holds links that cannot be carried.
        OSError: ``root`` or a listed path is missing or unreadable.
    """
    root = os.fspath(root)
    there = missing_ok and paths is not None and not select
    if not os.path.exists(root):
        if there:
            return {"root": root, "entries": []}
        raise FileNotFoundError("manifest root does not exist: %s" % root)
    if paths is not None and not select:
        if there and os.path.isdir(root):
            paths = [p for p in paths if os.path.lexists(os.path.join(root, *p.split("/")))]
        entries = [entry_for(root, p, limit_bytes, known) for p in sorted(paths)]
        return {"root": root, "entries": entries}
    if paths is not None:
        items, problems = select_tree(root, paths, follow_links)
    else:
        items, problems = scan_tree(root, follow_links)
    if problems:
        raise TreeProblems(root, problems)
    entries = []
    for rel, kind, target in items:
        if kind == KIND_LINK:
            entries.append(_link_entry(rel, target))
        elif kind == KIND_DIR:
            entries.append(_dir_entry(rel))
        else:
            full = root if os.path.isfile(root) else os.path.join(root, *rel.split("/"))
            entries.append(file_entry(full, rel, limit_bytes, known))
    return {"root": root, "entries": entries}


def safe_join(root, rel):
    """``root/rel`` for a relative POSIX path that stays inside ``root``.

    Raises:
        ValueError: absolute paths, ``..`` segments or empty names.
    """
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError("unsafe relative path: %r" % rel)
    return os.path.join(root, *parts)


def _clear(path):
    """Remove what is at ``path`` (a link is removed, never followed)."""
    if os.path.islink(path) or not os.path.isdir(path):
        os.remove(path)
    else:
        import shutil

        shutil.rmtree(path)


def apply_structure(root, entries):
    """Make the directory and link entries of a manifest exist under ``root``: empty
    directories created, links created (what stands in their place is replaced), then
    every link checked like the source's were (:func:`link_problem`); a link that
    would leave the tree or dangle here is removed again.

    Args:
        root: the destination folder.
        entries: manifest entries; file entries are ignored.

    Returns:
        ``(relative path, why)`` for every entry that could not be made; empty when all
        were.
    """
    errors = []
    dirs = [e for e in entries if e.get("kind") == KIND_DIR]
    links = [e for e in entries if e.get("kind") == KIND_LINK]
    for entry in dirs:
        try:
            path = safe_join(root, entry["path"])
            if os.path.lexists(path) and not (os.path.isdir(path) and not os.path.islink(path)):
                _clear(path)
            if not os.path.isdir(path):
                os.makedirs(path)
        except (OSError, ValueError) as exc:
            errors.append((entry["path"], str(exc)))
    made = []
    for entry in links:
        try:
            path = safe_join(root, entry["path"])
            target = entry["target"]
            if os.path.islink(path) and os.readlink(path) == target:
                made.append(entry)
                continue
            parent = os.path.dirname(path)
            if not os.path.isdir(parent):
                os.makedirs(parent)
            if os.path.lexists(path):
                _clear(path)
            os.symlink(target, path)
            made.append(entry)
        except (OSError, ValueError, KeyError) as exc:
            errors.append((entry.get("path", "?"), str(exc)))
    for entry in made:
        why = link_problem(root, entry["path"], entry["target"])
        if why is not None:
            os.remove(os.path.join(root, *entry["path"].split("/")))
            errors.append((entry["path"], why))
    return errors


def file_entries(manifest):
    """The entries of ``manifest`` that are files (the ones whose bytes travel)."""
    return [e for e in manifest["entries"] if e.get("kind", "file") == "file"]


def compare_manifests(expected, actual):
    """Differences between two manifests, keyed by relative path.

    Returns:
        A list of ``(path, problem)``, e.g. ``("a.bin", "sha256 ab12… != cd34…")``,
        ``("b.txt", "missing")``, ``("current", "a file, not a link")``; empty when every
        expected entry (file, directory or link) matches. Extra entries in ``actual``
        are not problems (the destination may hold other files). ``md5`` and
        ``git_sha1`` are compared only when both entries carry one (an older
        ``manifest.py`` wrote md5s; a prefix hash has no git blob id).
    """
    have = {e["path"]: e for e in actual["entries"]}
    problems = []
    for want in expected["entries"]:
        got = have.get(want["path"])
        if got is None:
            problems.append((want["path"], "missing"))
            continue
        kind, got_kind = want.get("kind", "file"), got.get("kind", "file")
        if kind != got_kind:
            problems.append((want["path"], "a %s, not a %s" % (got_kind, kind)))
            continue
        if kind == KIND_LINK:
            if want.get("target") != got.get("target"):
                problems.append(
                    (want["path"], "link to %s != %s" % (got.get("target"), want.get("target")))
                )
            continue
        if kind == KIND_DIR:
            continue
        for key in ("size_bytes", "sha256", "md5", "git_sha1"):
            mine_value, theirs = want.get(key), got.get(key)
            if key in ("md5", "git_sha1") and not (mine_value and theirs):
                continue
            if mine_value != theirs:
                problems.append((want["path"], "%s %s != %s" % (key, mine_value, theirs)))
                break
    return problems


def main(argv=None):
    """Print the manifest of ``ROOT`` as one JSON line; exit 2 when it is missing, 3 (with
    ``{"error", "problems"}`` on stdout) when it holds links that cannot be carried."""
    parser = argparse.ArgumentParser(description="sha256+git-sha1 manifest of a tree, as JSON")
    parser.add_argument("root")
    parser.add_argument("--files", nargs="*", default=None, help="relative paths to include")
    parser.add_argument("--prefix-bytes", type=int, default=None)
    parser.add_argument("--follow-links", action="store_true", help="read escaping links through")
    parser.add_argument(
        "--missing-ok", action="store_true", help="with --files: leave out paths that do not exist"
    )
    parser.add_argument(
        "--apply-b64",
        default=None,
        help="base64 JSON list of dir/link entries to create under ROOT first",
    )
    parser.add_argument(
        "--save-known", default=None, help="write the files hashed (and their signatures) here"
    )
    parser.add_argument(
        "--use-known", default=None, help="reuse the unchanged files saved here, then remove it"
    )
    args = parser.parse_args(argv)
    known = None
    if args.save_known or args.use_known:
        known = load_known(args.use_known) if args.use_known else {}
    if args.apply_b64 is not None:
        import base64

        entries = json.loads(base64.b64decode(args.apply_b64).decode("utf-8"))
        if not os.path.isdir(args.root):
            os.makedirs(args.root)
        errors = apply_structure(args.root, entries)
        if errors:
            body = {"root": args.root, "error": "could not make the tree", "problems": errors}
            sys.stdout.write(json.dumps(body, separators=(",", ":")) + "\n")
            return 3
        if args.files is None:
            args.files = [e["path"] for e in entries]
    try:
        manifest = compute_manifest(
            args.root,
            args.files,
            args.prefix_bytes,
            args.follow_links,
            missing_ok=args.missing_ok,
            known=known,
        )
        if args.save_known:
            save_known(args.save_known, known)
    except TreeProblems as exc:
        body = {"root": args.root, "error": str(exc), "problems": exc.problems}
        sys.stdout.write(json.dumps(body, separators=(",", ":")) + "\n")
        sys.stdout.flush()
        return 3
    except OSError as exc:
        sys.stderr.write("manifest: %s\n" % exc)
        return 2
    sys.stdout.write(json.dumps(manifest, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
