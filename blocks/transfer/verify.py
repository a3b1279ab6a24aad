"""The step every transfer ends with: the destination's manifest checked against the
source's, the files that differ sent once more, and a ``ChecksumMismatchError`` naming
the file and the method when one still differs (docs/architecture.md#manifests).

A method brings what differs between methods — how it measures the destination (the
pod's ``manifest.py``, the receiver, the local disk) and how it sends files again —
and :func:`verify_resending_once` does the comparing, the one resend and the error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from prefect_runpod.blocks.exceptions import ChecksumMismatchError, TransferError
from prefect_runpod.blocks.pod_side import manifest as mf

__all__ = ["already_here", "local_tree_manifest", "structure_entries", "verify_resending_once"]

Direction = Literal["upload", "download"]
# a verify step: (expected manifest, a call that measures the far side, direction)
VerifyStep = tuple[dict[str, Any], Callable[[], dict[str, Any]], Direction]

_NEXT_STEP: dict[str, str] = {
    "upload": "the pod's disk may be failing: rerun, on a new pod if it repeats",
    "download": "check the local disk and rerun the download",
}


def structure_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The directory and link entries of a plain manifest: what a method makes at the
    destination beside the files (``manifest.apply_structure``)."""
    return [e for e in manifest["entries"] if e.get("kind", "file") != "file"]


def already_here(local_root: Path, files: list[dict[str, Any]], known: dict[str, Any]) -> set[str]:
    """Before a download: the paths of ``files`` (plain manifest entries of files)
    already under ``local_root`` with the same sha256. What it hashes is kept in
    ``known``, so :func:`local_tree_manifest` does not read those files again."""
    here = [e["path"] for e in files if local_root.joinpath(*e["path"].split("/")).is_file()]
    found = mf.compute_manifest(str(local_root), here, known=known)["entries"]
    have = {e["path"]: e for e in found}
    return {e["path"] for e in files if have.get(e["path"], {}).get("sha256") == e["sha256"]}


def local_tree_manifest(
    local_root: Path,
    source: dict[str, Any],
    pod: str | None,
    known: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """After a download: ``source``'s empty directories and links made under
    ``local_root``, then the manifest of every entry of ``source`` read from the local
    disk (``known``: files this process just hashed, not read again).

    Raises:
        TransferError: entries that could not be made (20 named at most).
    """
    made = mf.apply_structure(str(local_root), source["entries"])
    if made:
        listed = "; ".join(f"{path} ({why})" for path, why in made[:20])
        raise TransferError(f"could not make {listed} under {local_root}", pod_id=pod)
    paths = [e["path"] for e in source["entries"]]
    result: dict[str, Any] = mf.compute_manifest(str(local_root), paths, known=known)
    return result


def verify_resending_once(
    expected: dict[str, Any],
    measure: Callable[[], dict[str, Any]],
    resend: Callable[[set[str]], None],
    *,
    method: str,
    direction: Direction,
    pod: str | None = None,
    where: str | None = None,
    next_step: str | None = None,
    resent: bool = False,
) -> dict[str, Any]:
    """Check the destination against ``expected``, send the files that differ once
    more, check again.

    Args:
        expected: the plain manifest to reproduce (the source's).
        measure: the destination's plain manifest, read from its disk.
        resend: sends the files at these relative paths again.
        method / direction / pod: named in the error (``direction`` is its stage).
        where: the other end in the message (default ``pod <pod>``).
        next_step: the error's advice (default: by direction).
        resent: the resend already happened (a drop cut it short and the method
            finished it): check once more, never resend.

    Returns:
        The destination manifest, matching ``expected`` entry for entry.

    Raises:
        ChecksumMismatchError: an entry still differs after the resend (its path,
            both sha256s for a file, the method and the difference in the message).
    """
    for attempt in range(1 if resent else 2):
        dest = measure()
        problems = mf.compare_manifests(expected, dest)
        if not problems:
            return dest
        if resent or attempt == 1:
            path, why = problems[0]
            want = {e["path"]: e for e in expected["entries"]}[path]
            got: dict[str, Any] = {e["path"]: e for e in dest["entries"]}.get(path, {})
            other = where or f"pod {pod}"
            places = "on" if direction == "upload" else "from"
            copy = "the local file" if direction == "upload" else "its source"
            raise ChecksumMismatchError(
                f"{path} {places} {other} differs from {copy} after a resend by the "
                f"{method} method ({why}); {next_step or _NEXT_STEP[direction]}",
                path=path,
                expected=want.get("sha256", ""),
                actual=got.get("sha256", ""),
                pod_id=pod,
                stage=direction,
            )
        resend({p for p, _ in problems})
    raise AssertionError("unreachable")
