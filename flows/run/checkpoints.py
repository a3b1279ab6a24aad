"""A run's checkpoints: copied off the pod while it trains, verified, kept, and the one a
new pod resumes from (docs/architecture.md#resuming-from-a-checkpoint).

- ``CheckpointStore`` is the run's local folder ``<output_dir>/checkpoints``: a
  checkpoint counts there only once its files match the manifest the pod wrote after the
  job's signal (``<name>/`` beside ``<name>.manifest.json``); the last
  ``keep_checkpoints`` are kept; one that no longer verifies is moved to ``.quarantine/``
  and the one before it is used.
- ``CheckpointSync`` follows the pod's checkpoint folder from a thread of its own while
  the job trains (its own console, so the training poll never waits for it): it asks the
  pod side (``blocks/pod_side/checkpoints.py``) which checkpoints the job signalled
  complete, copies the newest one it has not got through the run's transfer method
  (a file whose sha256 matches a verified local file is copied locally first, so only
  what changed is sent), verifies it and records the copy's lag (signalled → verified).
"""

from __future__ import annotations

import contextvars
import json
import logging
import shlex
import shutil
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, SecretStr

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.faults import fault_point
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.pod_side import manifest as tree_manifest
from prefect_runpod.blocks.pod_side.checkpoints import step_of
from prefect_runpod.flows.run.attempts import gpu_count_text

if TYPE_CHECKING:
    from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.transfer.base import MethodOptions
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = [
    "CHECKPOINT_DIR",
    "CheckpointRecord",
    "CheckpointStore",
    "CheckpointSync",
    "gpu_count_refusal",
]

_log = logging.getLogger("prefect_runpod.checkpoints")

CHECKPOINT_DIR = "checkpoints"
"""The run's verified checkpoints, under its output dir."""

_SCAN_TIMEOUT_SECONDS = 300.0


class CheckpointRecord(BaseModel):
    """One checkpoint copied off a pod and verified here.

    Attributes:
        name / step: the job's folder name and the step it ends with.
        attempt / pod_id: the pod attempt that wrote it.
        bytes: the checkpoint's size; sent_bytes: what crossed from the pod;
            local_bytes: what was copied from verified local files instead.
        signalled_at: when the job signalled it complete (the signal's mtime, the pod's
            clock); verified_at: when it verified here (this machine's clock), UTC.
        lag_seconds: ``verified_at - signalled_at``, seconds (both clocks are this
            machine's for a local pod).
        method: the transfer method that copied it.
        gpu_count: GPUs of the pod that wrote it (0: a pod without one).
    """

    name: str
    step: int
    attempt: int = 1
    pod_id: str = ""
    bytes: int = 0
    sent_bytes: int = 0
    local_bytes: int = 0
    signalled_at: datetime
    verified_at: datetime
    lag_seconds: float = 0.0
    method: str = ""
    gpu_count: int = 0


def gpu_count_refusal(name: str, written_on: int | None, resuming_on: int) -> str | None:
    """Why checkpoint ``name``, written on a pod with ``written_on`` GPUs, cannot resume
    training on a pod with ``resuming_on``; None when it can (the same count, or a
    checkpoint that does not record its pod's). Pure.

    A job keeps one random generator state per rank (its data order, dropout) and
    shards its data by rank: on another count they would not match, and the run would
    not continue where it stopped.
    """
    if written_on is None or written_on == resuming_on:
        return None
    was, now = gpu_count_text(written_on), gpu_count_text(resuming_on)
    return (
        f"checkpoint {name} was written on a pod with {was} and this pod has "
        f"{now}: its per-rank state (each rank's random generator state and "
        "data shard) would not match, so training would not continue where it stopped; "
        f"resume on a pod with {was} (the pod spec's gpu_count) or start afresh"
    )


def _entries(manifest: dict[str, Any]) -> list[tuple[str, str, int, str]]:
    """What a manifest says, in an order-free comparable form."""
    return sorted(
        (e["path"], e.get("kind", "file"), e.get("size_bytes", 0), e.get("sha256", ""))
        for e in manifest.get("entries", [])
    )


class CheckpointStore:
    """The verified checkpoints of a run in ``<output_dir>/checkpoints`` (see the module).

    Args:
        output_dir: the run's output dir.
        keep: how many verified checkpoints to keep (``keep_checkpoints``, >= 1).
    """

    def __init__(self, output_dir: str | Path, keep: int = 2) -> None:
        self.root = Path(output_dir) / CHECKPOINT_DIR
        self.keep = keep

    def names(self) -> list[str]:
        """The checkpoints that have a saved manifest, oldest step first."""
        if not self.root.is_dir():
            return []
        found = [p.name[: -len(".manifest.json")] for p in self.root.glob("*.manifest.json")]
        return sorted((n for n in found if (self.root / n).is_dir()), key=lambda n: step_of(n) or 0)

    def manifest(self, name: str) -> dict[str, Any]:
        """The pod's manifest of checkpoint ``name``, as saved when it verified."""
        data: dict[str, Any] = json.loads((self.root / f"{name}.manifest.json").read_text())
        return data

    def written_gpu_count(self, name: str) -> int | None:
        """GPUs of the pod that wrote ``name`` (recorded when it verified), or None for a
        checkpoint saved without its pod's count."""
        written = self.manifest(name).get("written_by") or {}
        count = written.get("gpu_count")
        return int(count) if isinstance(count, int) else None

    def refuse_other_gpu_count(self, name: str, handle: PodHandle) -> None:
        """Refuse to resume ``name`` on ``handle`` when the pod's GPU count is not the
        count the checkpoint was written on (``gpu_count_refusal``).

        Raises:
            SpecError: the counts differ (naming the pod and where the checkpoint is kept).
        """
        refusal = gpu_count_refusal(name, self.written_gpu_count(name), handle.gpu_count)
        if refusal is not None:
            raise SpecError(
                f"pod {handle.pod_id} does not resume the run: {refusal}; the checkpoint "
                f"is kept in {self.root / name}"
            )

    def verifies(self, name: str) -> bool:
        """Whether the local files of ``name`` still match its manifest (hashed now)."""
        try:
            here = tree_manifest.compute_manifest(str(self.root / name))
            return _entries(here) == _entries(self.manifest(name))
        except (OSError, ValueError):
            return False

    def latest(self) -> str | None:
        """The newest checkpoint that verifies now; any newer one that does not is
        quarantined (moved to ``.quarantine/``) and the one before it is tried."""
        for name in reversed(self.names()):
            if self.verifies(name):
                return name
            self.quarantine(name)
        return None

    def quarantine(self, name: str) -> None:
        """Move ``name`` and its manifest out of the way, to ``.quarantine/``."""
        where = self.root / ".quarantine"
        where.mkdir(parents=True, exist_ok=True)
        for path in (self.root / name, self.root / f"{name}.manifest.json"):
            if path.exists():
                path.replace(where / path.name)
        _log.warning("checkpoint %s did not verify: quarantined in %s", name, where)

    def known_files(self) -> dict[str, Path]:
        """sha256 → a verified local file with that content (any checkpoint, any path)."""
        known: dict[str, Path] = {}
        for name in self.names():
            for entry in self.manifest(name).get("entries", []):
                if entry.get("kind", "file") == "file" and entry.get("sha256"):
                    known.setdefault(entry["sha256"], self.root / name / entry["path"])
        return known

    def staging(self, name: str, manifest: dict[str, Any]) -> tuple[Path, int]:
        """A fresh ``.incoming/<name>`` seeded with the files of ``manifest`` that a
        verified checkpoint already holds (copied here, never sent again).

        Returns:
            The folder and the bytes copied into it locally.
        """
        folder = self.root / ".incoming" / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        known, copied = self.known_files(), 0
        for entry in manifest.get("entries", []):
            source = known.get(entry.get("sha256", ""))
            if entry.get("kind", "file") != "file" or source is None or not source.is_file():
                continue
            target = folder / entry["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            copied += int(entry.get("size_bytes", 0))
        return folder, copied

    def accept(
        self,
        name: str,
        folder: Path,
        manifest: dict[str, Any],
        here: dict[str, Any] | None = None,
        written_by: dict[str, Any] | None = None,
    ) -> bool:
        """Make ``folder`` the verified checkpoint ``name`` when its files match
        ``manifest`` (the pod's, written after the job's signal), then keep the last
        ``keep``. ``here`` is ``folder``'s manifest when a transfer has just computed it
        (hashed now otherwise); ``written_by`` (the pod that wrote it: ``pod_id``,
        ``attempt``, ``gpu_count``) is saved with the manifest. Returns False (and
        removes ``folder``) when they do not match."""
        if here is None:
            here = tree_manifest.compute_manifest(str(folder))
        if _entries(here) != _entries(manifest):
            shutil.rmtree(folder, ignore_errors=True)
            return False
        shutil.rmtree(self.root / name, ignore_errors=True)
        folder.replace(self.root / name)
        part = self.root / f"{name}.manifest.json.part"
        saved = dict(manifest, written_by=written_by) if written_by else manifest
        part.write_text(json.dumps(saved, sort_keys=True))
        part.replace(self.root / f"{name}.manifest.json")
        for old in self.names()[: -self.keep]:
            shutil.rmtree(self.root / old, ignore_errors=True)
            (self.root / f"{old}.manifest.json").unlink(missing_ok=True)
        return True


class CheckpointSync:
    """Copies the job's completed checkpoints off the pod while it trains (see the
    module). ``start`` it once training is launched; ``stop`` it after.

    Args:
        handle / key: the pod and its SSH key (a console of its own is opened).
        store: the run's ``CheckpointStore``.
        pod_folder: the pod's checkpoint folder (absolute).
        manifest_folder: where the pod side writes the manifests (absolute).
        marker: the bundle's ``checkpoint_marker`` ("" for the rename signal).
        python: the pod's interpreter for the pod-side script.
        method / options / s3: the run's transfer method, its options (``PtyOptions``
            for ``pty``) and the S3 target (for ``s3``), as the stages' transfers get them.
        attempt: the pod attempt's number.
        interval_seconds: seconds between two looks at the pod's folder.
        reconnect: the run's reconnect policy for the console opened here.
        on_copied: called with each ``CheckpointRecord`` once verified.
    """

    def __init__(
        self,
        handle: PodHandle,
        key: SecretStr,
        store: CheckpointStore,
        *,
        pod_folder: str,
        manifest_folder: str,
        marker: str = "",
        python: str = "python3",
        method: str = "auto",
        options: MethodOptions | None = None,
        s3: S3Target | None = None,
        attempt: int = 1,
        interval_seconds: float = 2.0,
        reconnect: ReconnectPolicy | None = None,
        on_copied: Callable[[CheckpointRecord], None] | None = None,
    ) -> None:
        self.handle, self.key, self.store = handle, key, store
        self.pod_folder, self.manifest_folder, self.marker = pod_folder, manifest_folder, marker
        self.python, self.method, self.options, self.s3 = python, method, options, s3
        self.attempt, self.interval_seconds = attempt, interval_seconds
        self.reconnect, self.on_copied = reconnect, on_copied
        self.copied: list[CheckpointRecord] = []
        self.refused: list[str] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._console: PodConsole | None = None

    def start(self) -> CheckpointSync:
        """Begin following the pod's checkpoint folder from a daemon thread (in a copy of
        this thread's context, so the transfer logs to the run as the stages do)."""
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._loop,), name="checkpoint-sync", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, *, final: bool = False) -> None:
        """Stop following; with ``final``, look once more first (a checkpoint the job
        signalled just before it ended is copied too)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if final and self.error is None:
            self._poll_guarded()
        if self._console is not None:
            self._console.close()
            self._console = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            if not self._poll_guarded():
                return

    def _poll_guarded(self) -> bool:
        try:
            self.poll_once()
            return True
        except Exception as exc:  # the pod may be gone: training's own watch says so
            self.error = f"{type(exc).__name__}: {exc}"[:300]
            _log.warning("%s: checkpoint copy stopped: %s", self.handle.pod_id, self.error)
            return False

    def _console_now(self) -> PodConsole:
        if self._console is None:
            from prefect_runpod.blocks.console.session import PodConsole

            self._console = PodConsole.for_pod(self.handle, self.key, reconnect=self.reconnect)
        return self._console

    def scan(self) -> list[dict[str, Any]]:
        """The pod side's list of complete checkpoints, each with its manifest."""
        from prefect_runpod.blocks.transfer.pod_tools import tools_dir

        q = shlex.quote
        script = f"{tools_dir(self.handle)}/checkpoints.py"
        cmd = f"{q(self.python)} {q(script)} {q(self.pod_folder)} {q(self.manifest_folder)}"
        if self.marker:
            cmd += f" --marker {q(self.marker)}"
        cmd += " --inline"
        result = self._console_now().run(cmd + " 2>&1", timeout_seconds=_SCAN_TIMEOUT_SECONDS)
        for line in result.output.splitlines():
            if line.startswith('{"checkpoints"'):
                found: list[dict[str, Any]] = json.loads(line)["checkpoints"]
                return found
        return []

    def poll_once(self) -> CheckpointRecord | None:
        """Copy the newest complete checkpoint not copied yet, if any; returns its record."""
        have = set(self.store.names()) | set(self.refused)
        fresh = [c for c in self.scan() if c["name"] not in have]
        if not fresh or (self.copied and fresh[-1]["step"] <= self.copied[-1].step):
            return None
        return self.copy(fresh[-1])

    def copy(self, found: dict[str, Any]) -> CheckpointRecord | None:
        """Copy one checkpoint the pod side listed, verify it, and record it."""
        from prefect_runpod.blocks.transfer.dispatch import download_dir

        name, manifest = found["name"], found["tree"]
        folder, local_bytes = self.store.staging(name, manifest)
        fault_point("checkpoint_copy")  # tests: a pod lost while a checkpoint is copied off
        report = download_dir(
            self._console_now(),
            self.handle,
            f"{self.pod_folder}/{name}",
            folder,
            method=self.method,
            private_key=self.key,
            s3=self.s3,
            options=self.options,
        )
        here = report.dest_manifest.as_dict() if report.dest_manifest is not None else None
        pod = {
            "pod_id": self.handle.pod_id,
            "attempt": self.attempt,
            "gpu_count": self.handle.gpu_count,
        }
        if not self.store.accept(name, folder, manifest, here, written_by=pod):
            self.refused.append(name)  # it changed after its signal: never resumed from
            _log.warning("%s: checkpoint %s changed after the job's signal: not kept",
                         self.handle.pod_id, name)  # fmt: skip
            return None
        now = datetime.now(UTC)
        signalled = datetime.fromtimestamp(float(found["signalled_at"]), UTC)
        record = CheckpointRecord(
            name=name,
            step=int(found["step"]),
            attempt=self.attempt,
            pod_id=self.handle.pod_id,
            bytes=int(found.get("bytes", 0)),
            sent_bytes=report.sent_bytes or 0,
            local_bytes=local_bytes,
            signalled_at=signalled,
            verified_at=now,
            lag_seconds=round(max(0.0, (now - signalled).total_seconds()), 3),
            method=report.method,
            gpu_count=self.handle.gpu_count,
        )
        self.copied.append(record)
        if self.on_copied is not None:
            self.on_copied(record)
        return record
