#!/usr/bin/env python3
"""The pod's side of checkpoints: which of the job's checkpoints are complete, each with
its manifest (docs/architecture.md#resuming-from-a-checkpoint).

Only the job says a checkpoint is complete, in one of two ways a bundle declares:

- **rename** (no marker): the job writes ``NAME.tmp/`` and renames it to ``NAME/`` when
  whole; a folder whose name ends in ``.tmp`` is never complete;
- **marker** (``--marker FILE``): the job writes ``FILE`` inside the folder last; a
  folder without it is never complete.

For each complete checkpoint this script writes its manifest (every file's size and
sha256, ``manifest.py``'s form) once, atomically, into ``MANIFESTS/NAME.json`` — never
before the job's signal — and prints one JSON object::

    {"checkpoints": [{"name": "step-20", "step": 20, "manifest": "<path>",
                      "signalled_at": 1733130000.5, "bytes": 1234}, ...],
     "incomplete": ["step-40.tmp"]}

sorted by step (the number at the end of the name); with ``--inline`` each also holds
its manifest itself (``"tree"``). Standard library only, Python 3.8+.

Command line::

    python3 checkpoints.py CHECKPOINT_DIR MANIFEST_DIR [--marker FILE] [--inline]
"""

import json
import os
import re
import sys

if __package__:  # imported by the flow as a package module
    from prefect_runpod.blocks.pod_side import manifest as _manifest
else:  # run on the pod: the script's own folder holds its siblings
    import manifest as _manifest  # type: ignore

TMP_SUFFIX = ".tmp"
_STEP = re.compile(r"(\d+)$")


def step_of(name):
    """The step a checkpoint's name ends with (``step-20`` → 20), or None."""
    found = _STEP.search(name)
    return int(found.group(1)) if found else None


def signal_path(folder, name, marker):
    """The file or folder whose existence is the job's signal, or None when the
    checkpoint is not complete."""
    path = os.path.join(folder, name)
    if not os.path.isdir(path) or name.startswith("."):
        return None
    if marker:
        done = os.path.join(path, marker)
        return done if os.path.isfile(done) else None
    return None if name.endswith(TMP_SUFFIX) else path


def scan(folder, manifests, marker="", inline=False):
    """Write the manifest of each newly complete checkpoint and describe them all
    (``inline``: each with its manifest as ``tree``).

    Returns:
        ``{"checkpoints": [...], "incomplete": [...]}`` as the module docstring says.
    """
    listing = {"checkpoints": [], "incomplete": []}
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    for name in names:
        step = step_of(name[: -len(TMP_SUFFIX)] if name.endswith(TMP_SUFFIX) else name)
        signal = signal_path(folder, name, marker)
        if signal is None or step is None:
            if os.path.isdir(os.path.join(folder, name)):
                listing["incomplete"].append(name)
            continue
        target = os.path.join(manifests, name + ".json")
        try:
            if not os.path.isfile(target):
                tree = _manifest.compute_manifest(os.path.join(folder, name))
                os.makedirs(manifests, exist_ok=True)
                with open(target + ".part", "w", encoding="utf-8") as fh:
                    json.dump(tree, fh, sort_keys=True)
                os.replace(target + ".part", target)
            with open(target, encoding="utf-8") as fh:
                tree = json.load(fh)
            signalled_at = os.stat(signal).st_mtime
        except (OSError, ValueError):  # the job removed it meanwhile (keeping its last N)
            continue
        item = {
            "name": name,
            "step": step,
            "manifest": target,
            "signalled_at": signalled_at,
            "bytes": sum(e.get("size_bytes", 0) for e in tree.get("entries", [])),
        }
        if inline:
            item["tree"] = tree
        listing["checkpoints"].append(item)
    listing["checkpoints"].sort(key=lambda c: c["step"])
    return listing


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    marker, inline = "", "--inline" in args
    args = [a for a in args if a != "--inline"]
    if "--marker" in args:
        at = args.index("--marker")
        marker = args[at + 1]
        del args[at : at + 2]
    if len(args) != 2:
        print("usage: checkpoints.py CHECKPOINT_DIR MANIFEST_DIR [--marker FILE] [--inline]",
              file=sys.stderr)  # fmt: skip
        return 2
    print(json.dumps(scan(args[0], args[1], marker, inline), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
