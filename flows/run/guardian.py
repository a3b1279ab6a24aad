"""The run's guardian: a small local process that outlives the run's own process from
before the pod is created until the pod's dead-man switch is armed
(docs/architecture.md#termination-layers, layer 5).

Between ``create`` and the dead-man being armed nothing on the pod can end it: a run
killed then (SIGKILL during ``wait_ready``: no ``finally``, no hook) would leave a pod
billing until the reaper's TTL. RunPod's ``terminateAfter`` was meant to cover this and
never fired, so the run covers it itself:

- ``Guardian.start`` (the run's side) spawns ``python -m prefect_runpod.flows.run.guardian``
  in a session of its own, before the create, and keeps the write end of a pipe to its
  stdin. The first line is the job (the run's parameters, the pod's name, the flow run,
  the deadline): parameters carry block names only, never a secret; the key comes from
  the same environment or block the run used.
- The guardian waits on that pipe. ``armed`` (the dead-man switch runs on the pod),
  ``gone`` (the run confirmed the pod's end, or rented none) or ``release`` (the pod is
  kept on purpose) end it quietly. End of file without a word — the run's process died,
  however — or its parent changing (the process it was started by is gone) means the
  run can no longer end its pod: the guardian rebuilds the run's provider from the
  parameters (as the crash hook does), finds the pod by its name for a while (RunPod
  lists a new pod late), terminates it (confirmed), records the end in the run's
  ``finetune-costs`` record (``ended_by: guardian``) and sets the run Crashed with the
  cause. A hard deadline ends it too, having done nothing.
- It keeps ``<home>/guardians/<flow_run_id>.json`` (its pid) while it lives, and a log
  beside it, so anyone can tell it ran and what it did (``live_guardians``).

It runs on the user's machine: a machine that sleeps or loses power takes it along (the
reaper remains). Its own wait is a few lines of the standard library; Prefect, the
provider and the SDKs are imported only when it has to act.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_DEADLINE_SECONDS",
    "Guardian",
    "GuardianJob",
    "guardian_dir",
    "live_guardians",
    "main",
    "start_guardian",
]

DEFAULT_DEADLINE_SECONDS = 1800.0
"""The longest a guardian waits for the dead-man to be armed (30 min: the ready wait's
600 s, the pod tools and the dead-man's start, with room): past it, it leaves."""

_POLL_SECONDS = 1.0
_FIND_SECONDS = 120.0
"""How long a guardian looks for its pod by name after its run died (RunPod may list a
pod created a moment ago only later)."""
WORDS = ("armed", "gone", "release")
"""What the run tells its guardian before it lets it go."""

log = logging.getLogger("prefect_runpod.guardian")


def guardian_dir(home: Path | None = None) -> Path:
    """``<home>/guardians``: one ``<flow_run_id>.json`` (pid, pod name) and ``.log`` per
    guardian; ``home`` is the local pods' home (``$PREFECT_RUNPOD_HOME``)."""
    from prefect_runpod.blocks.local_pod.registry import default_home

    return Path(home or default_home()) / "guardians"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"prefect_runpod.flows.run.guardian" in fh.read()
    except OSError:
        return False


def live_guardians(home: Path | None = None) -> list[dict[str, Any]]:
    """The guardians still running under ``home``, from their pid files (a stale file of
    one that is gone is ignored): ``[{pid, flow_run_id, pod_name, …}]``."""
    found = []
    for path in sorted(guardian_dir(home).glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            entry = json.loads(path.read_text())
            if _alive(int(entry["pid"])):
                found.append(entry)
    return found


@dataclass(frozen=True)
class GuardianJob:
    """What a guardian watches over.

    Attributes:
        params: the run's parameters (block names, never a secret), to rebuild its
            provider as the crash hook does.
        pod_name: ``<prefix>-<flow_run_id>``, the name the pod is found by.
        flow_run_id: the run (its cost record and state).
        deadline_seconds: the longest the guardian waits, s.
        poll_seconds: how often it looks at its parent, s.
        find_seconds: how long it looks for the pod after the run died, s.
    """

    params: Mapping[str, Any]
    pod_name: str
    flow_run_id: str
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS
    poll_seconds: float = _POLL_SECONDS
    find_seconds: float = _FIND_SECONDS

    def to_line(self) -> bytes:
        """The job as one JSON line (what the guardian reads first)."""
        data = {
            "params": _plain(self.params),
            "pod_name": self.pod_name,
            "flow_run_id": self.flow_run_id,
            "deadline_seconds": self.deadline_seconds,
            "poll_seconds": self.poll_seconds,
            "find_seconds": self.find_seconds,
        }
        return json.dumps(data).encode() + b"\n"


def _plain(params: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-safe parameters (a ``Path`` as text; anything else JSON cannot hold is
    left out: the provider is rebuilt from names, flags and numbers)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, Path):
            value = str(value)
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out


class Guardian:
    """The run's side of its guardian (see the module docstring): started before the
    create, told when it may go.

    Args:
        process: the guardian's process.
        pipe: the write end of its stdin.
    """

    def __init__(self, process: subprocess.Popen[bytes], pipe: int) -> None:
        self.process = process
        self._pipe: int | None = pipe

    @classmethod
    def start(cls, job: GuardianJob, *, home: Path | None = None) -> Guardian:
        """Spawn the guardian for ``job`` in a session of its own and hand it the job.

        The child gets this process's environment plus the Prefect API it uses (the CLI's
        temporary server is a setting, not a variable), so it can record what it does;
        ``home`` (the local pods' home, ``$PREFECT_RUNPOD_HOME`` when None) is where it
        keeps its pid file and log.

        Raises:
            OSError: the process could not be started.
        """
        from prefect.settings import get_current_settings

        env = dict(os.environ)
        settings = get_current_settings()
        if settings.api.url:
            env["PREFECT_API_URL"] = str(settings.api.url)
        if settings.api.key is not None and settings.api.key.get_secret_value():
            env["PREFECT_API_KEY"] = settings.api.key.get_secret_value()
        if home is not None:  # where it keeps its pid file (and the local pods it ends)
            env["PREFECT_RUNPOD_HOME"] = str(home)
        directory = guardian_dir(home)
        directory.mkdir(parents=True, exist_ok=True)
        read_end, write_end = os.pipe()
        try:
            with open(directory / f"{job.flow_run_id}.log", "ab") as out:
                process = subprocess.Popen(
                    [sys.executable, "-m", "prefect_runpod.flows.run.guardian"],
                    stdin=read_end,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
        finally:
            os.close(read_end)
        guardian = cls(process, write_end)
        guardian._write(job.to_line())
        return guardian

    def _write(self, data: bytes) -> None:
        if self._pipe is None:
            return
        try:
            os.write(self._pipe, data)
        except OSError:  # it is gone already (its deadline): nothing to tell
            self.close()

    def tell(self, word: str) -> None:
        """Tell the guardian why it may go (``armed``, ``gone``, ``release``); it leaves
        without acting. Idempotent: only the first word counts."""
        if word not in WORDS:
            raise ValueError(f"a guardian understands {', '.join(WORDS)}, not {word!r}")
        self._write(word.encode() + b"\n")
        self.close()

    def close(self) -> None:
        """Close the pipe (after a word, the guardian leaves; without one, it acts)."""
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._pipe)
            self._pipe = None

    def wait(self, timeout_seconds: float = 60.0) -> int | None:
        """Wait for the guardian's process to end; its exit status, or None in time."""
        try:
            return self.process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            return None


def start_guardian(params: Mapping[str, Any], pod_name: str, flow_run_id: str) -> Guardian | None:
    """The run's guardian for the pod ``pod_name``, started now (before the create); None,
    logged, when it could not be started (the run goes on: its other layers remain)."""
    try:
        return Guardian.start(
            GuardianJob(params=params, pod_name=pod_name, flow_run_id=flow_run_id)
        )
    except OSError as exc:
        log.warning(
            "the guardian did not start (%s): until the dead-man is armed, only "
            "this process, its hooks and the reaper can end the pod",
            exc,
        )
        return None


# -- the guardian process -----------------------------------------------------------------


class _Inbox:
    """The guardian's stdin: the job line first, then one word, or end of file."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self.buffer = b""
        self.closed = False

    def line(self, timeout_seconds: float) -> str | None:
        """The next whole line (without its end), or None when none came in time or the
        pipe is closed (``closed`` then True)."""
        deadline = time.monotonic() + timeout_seconds
        while b"\n" not in self.buffer and not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.fd, 4096)
            if not chunk:
                self.closed = True
            self.buffer += chunk
        if b"\n" not in self.buffer:
            return None
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode(errors="replace").strip()


def wait_for_word(
    inbox: _Inbox,
    job: GuardianJob,
    parent_alive: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Wait until the run says a word (returned), its process dies (``died``) or the
    deadline passes (``deadline``)."""
    deadline = clock() + job.deadline_seconds
    while True:
        word = inbox.line(min(job.poll_seconds, max(0.0, deadline - clock())))
        if word in WORDS:
            return word
        if inbox.closed or not parent_alive():
            return "died"
        if clock() >= deadline:
            return "deadline"


def _recorded_pod(flow_run_id: str) -> str | None:
    """The pod id the run's cost record holds (the run records its pod the moment it
    exists), or None (no record yet, or the API cannot say)."""
    from prefect_runpod.flows.run.cost_record import latest_record

    try:
        record = latest_record(flow_run_id)
    except Exception as exc:
        log.warning("could not read the run's cost record: %s", exc)
        return None
    return record.pod_id if record is not None else None


def _find_pod(provider: Any, job: GuardianJob) -> Any:
    """The live pod named ``job.pod_name``, looked for up to ``find_seconds`` (a create
    whose answer was on its way when the run died shows in the list late), or None."""
    until = time.monotonic() + job.find_seconds
    while True:
        try:
            handle = provider.find(job.pod_name)
        except Exception as exc:  # a provider that does not answer now may later
            log.warning("looking for %s: %s", job.pod_name, exc)
            handle = None
        if handle is not None or time.monotonic() >= until:
            return handle
        time.sleep(job.poll_seconds)


def end_the_pod(job: GuardianJob, parent_pid: int) -> str:
    """The run's process died before the dead-man was armed: terminate its pod (the one
    its record names, else the one found by name), confirmed; record who ended it; set
    the run Crashed. Returns what was done, in one line. Never raises."""
    from prefect_runpod.blocks.provider import EndedBy
    from prefect_runpod.flows.run.cost_record import record_pod_end
    from prefect_runpod.flows.run.crashed import mark_crashed
    from prefect_runpod.flows.run.providers import build_provider

    why = f"the run's process (pid {parent_pid}) died before the pod's dead-man switch was armed"
    try:
        provider, _ = build_provider(dict(job.params), need_ssh_key=False)
    except Exception as exc:  # say what stopped it; the reaper remains
        return f"could not rebuild the run's provider ({exc}); the reaper ends the pod"
    pod_id, handle = _recorded_pod(job.flow_run_id), None
    if pod_id is None:
        handle = _find_pod(provider, job)
        pod_id = handle.pod_id if handle is not None else None
    if pod_id is None:
        done = f"no pod named {job.pod_name} appeared: nothing to end"
    else:
        try:
            result = provider.terminate(pod_id)
        except Exception as exc:
            return f"pod {pod_id}: terminate not confirmed ({exc}); the reaper ends it"
        if result.already_gone:
            done = f"pod {pod_id} was gone already (another layer ended it)"
        else:
            record_pod_end(
                job.flow_run_id,
                result.end(EndedBy.GUARDIAN, "terminate (the guardian)", detail=why),
                recorded_by="guardian",
                handle=handle,
                provider=provider,
            )
            done = f"pod {pod_id} terminated, confirmed at {result.confirmed_at.isoformat()}"
    cause = f"the guardian ended the run: {why}; {done}"
    try:
        if mark_crashed(job.flow_run_id, cause):
            done += "; the run is marked Crashed"
    except Exception as exc:
        done += f"; could not mark the run Crashed ({exc})"
    return done


def main() -> int:
    """The guardian process: read the job, wait, act when the run died."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(message)s"
    )
    inbox = _Inbox(0)
    first = inbox.line(60.0)
    if not first:
        log.error("no job on stdin: nothing to guard")
        return 2
    data = json.loads(first)
    job = GuardianJob(**data)
    parent = os.getppid()
    entry = guardian_dir() / f"{job.flow_run_id}.json"
    entry.write_text(json.dumps({"pid": os.getpid(), "parent": parent, **data}))
    log.info("guarding %s for run %s (parent pid %d)", job.pod_name, job.flow_run_id, parent)
    try:
        outcome = wait_for_word(inbox, job, lambda: os.getppid() == parent)
        if outcome == "died":
            log.warning("the run's process (pid %d) died: ending its pod", parent)
            log.warning("%s", end_the_pod(job, parent))
        elif outcome == "deadline":
            log.info("deadline of %.0f s passed; leaving", job.deadline_seconds)
        else:
            log.info("the run said %r; leaving", outcome)
    finally:
        with contextlib.suppress(OSError):
            entry.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
