"""The local pod's daemon: one process per pod serving SSH on loopback (docs/architecture.md#pod-providers).

Run as ``python -m prefect_runpod.blocks.local_pod.daemon --home HOME --pod-id ID``
by ``LocalPodProvider.create``, in its own session, so that like a real pod it
outlives the process that made it. It reads ``pod.json`` from the pod directory,
listens with asyncssh on ``127.0.0.1`` (a free port, the pod's ed25519 host key,
public-key auth for the pod's user only), then writes the registry entry.

Each SSH session runs a pod process bridged to its channel, as RunPod's gateway or a
pod's own sshd would (:mod:`prefect_runpod.blocks.local_pod.sessions`).
On SIGTERM the daemon ends the pod: it kills every process carrying
``RUNPOD_POD_ID=<pod_id>``, removes the pod directory and the registry entry, exits.
It never ends the pod by itself on a deadline: a RunPod pod does not either, so a pod
whose flow died before its dead-man switch was armed is ended by the run's guardian
(docs/architecture.md#termination-layers), here as there. Before the directory goes, it
leaves a tombstone (``registry.write_tombstone``) saying when and how the pod ended
(``ending.json``, written by whoever asked: the ``runpodctl`` stand-in, the provider's
terminate), with the dead-man's recorded attempts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Coroutine
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncssh

from prefect_runpod.blocks.local_pod.registry import (
    ENDING_FILE,
    PodPaths,
    PodRecord,
    PodTombstone,
    kill_marked,
    read_deadman_attempts,
    remove_record,
    write_record,
    write_tombstone,
)
from prefect_runpod.blocks.local_pod.sessions import Session

__all__ = ["PodConfig", "PodDaemon", "PublicKeyLogins", "main"]

_WINDOW_BYTES = 8 * 1024 * 1024  # per-channel receive window: uploads need a wide one

log = logging.getLogger("local_pod_daemon")


@dataclass
class PodConfig:
    """What the provider asks of the daemon (``pod.json`` in the pod directory)."""

    pod_id: str
    name: str
    mode: str
    user: str
    pod_host_id: str
    host_key: str
    public_key: str
    cost_per_hr: float
    gpu_type: str
    created_at: str
    env: dict[str, str] = field(default_factory=dict)
    image: str = "plain"
    path_first: list[str] = field(default_factory=list)
    lifetime_seconds: float | None = None

    @classmethod
    def load(cls, path: Path) -> PodConfig:
        """Read ``pod.json`` (keys an older release wrote and this one no longer knows,
        such as its lease, are ignored)."""
        data = json.loads(path.read_text())
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class PublicKeyLogins(asyncssh.SSHServer):
    """An asyncssh server that takes public-key logins only (no password, no keyboard
    interactive); ``validate_public_key`` says which. RunPod's gateway takes keys only."""

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True


class _PodSSHServer(PublicKeyLogins):
    """Public-key auth only, for the pod's user and its authorized keys."""

    def __init__(self, daemon: PodDaemon) -> None:
        self.daemon = daemon

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        ok = (
            username == self.daemon.config.user and key.public_data in self.daemon.authorized_keys()
        )
        if not ok:
            log.info("%s: refused key for user %r", self.daemon.config.pod_id, username)
        return ok


class PodDaemon:
    """Serves one pod until SIGTERM, then ends it."""

    def __init__(self, home: Path, pod_id: str) -> None:
        self.home = home
        self.paths = PodPaths.of(home, pod_id)
        self.config = PodConfig.load(self.paths.config)
        self.ending = {"by": "signal", "layer": "SIGTERM to the pod's daemon"}
        self.port = 0
        self.bash = shutil.which("bash") or "/bin/bash"
        self._stop = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()

    def authorized_keys(self) -> set[bytes]:
        """The authorised public keys, read at each login (a gateway in front of the pod
        may add its own key after the pod started)."""
        try:
            found = asyncssh.read_public_key_list(str(self.paths.authorized_keys))
        except (OSError, ValueError):
            return set()
        return {k.public_data for k in found}

    def spawn_background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task the daemon keeps a reference to until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: None)
        host_key = asyncssh.read_private_key(str(self.paths.host_key))
        server = await asyncssh.listen(
            "127.0.0.1",
            0,
            server_factory=lambda: _PodSSHServer(self),
            server_host_keys=[host_key],
            process_factory=self._handle,
            sftp_factory=asyncssh.SFTPServer if self.config.mode == "direct" else None,
            encoding=None,
            line_editor=False,
            window=_WINDOW_BYTES,
            agent_forwarding=False,
            x11_forwarding=False,
            allow_pty=True,
            keepalive_interval=0,
        )
        self.port = server.sockets[0].getsockname()[1]
        self.paths.pid_file.write_text(f"{os.getpid()}\n")
        write_record(
            self.home,
            PodRecord(
                pod_id=self.config.pod_id,
                name=self.config.name,
                pid=os.getpid(),
                port=self.port,
                mode=self.config.mode,
                user=self.config.user,
                pod_host_id=self.config.pod_host_id,
                host_key=self.config.host_key,
                workdir=str(self.paths.workspace),
                cost_per_hr=self.config.cost_per_hr,
                gpu_type=self.config.gpu_type,
                created_at=self.config.created_at,
                lifetime_seconds=self.config.lifetime_seconds,
            ),
        )
        log.info(
            "%s: listening on 127.0.0.1:%d (%s)", self.config.pod_id, self.port, self.config.mode
        )
        await self._stop.wait()
        log.info("%s: terminating", self.config.pod_id)
        server.close()
        self.end_pod()
        logging.shutdown()
        os._exit(0)  # the pod is gone; skip tearing down sessions whose processes are dead

    async def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        await Session(self, process).run()

    def _read_ending(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((self.paths.root / ENDING_FILE).read_text())
            if isinstance(data, dict) and data.get("by"):
                self.ending = {"by": str(data["by"]), "layer": str(data.get("layer") or "")}

    def end_pod(self) -> None:
        """Kill every process of the pod (the caller of ``runpodctl pod delete`` too),
        leave the tombstone, remove the pod directory and the registry entry."""
        self._read_ending()
        attempts = read_deadman_attempts(self.paths.workspace)
        leftovers = kill_marked(self.config.pod_id, timeout_seconds=10.0)
        if leftovers:
            log.error("%s: processes survived SIGKILL: %s", self.config.pod_id, leftovers)
        attempts = read_deadman_attempts(self.paths.workspace) or attempts
        with contextlib.suppress(OSError):
            write_tombstone(
                self.home,
                PodTombstone(
                    pod_id=self.config.pod_id,
                    name=self.config.name,
                    created_at=self.config.created_at,
                    ended_at=datetime.now(UTC).isoformat(),
                    by=self.ending["by"],
                    layer=self.ending["layer"],
                    attempts=attempts,
                ),
            )
        shutil.rmtree(self.paths.root, ignore_errors=True)
        remove_record(self.home, self.config.pod_id)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``--home HOME --pod-id ID``; returns the exit status."""
    parser = argparse.ArgumentParser(description="Serve one local pod over SSH.")
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--pod-id", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    daemon = PodDaemon(args.home, args.pod_id)
    # Pod processes start here (posix_spawn inherits the cwd), and SFTP resolves
    # relative paths from here: the workspace, as /workspace on a RunPod pod.
    os.chdir(daemon.paths.workspace)
    asyncio.run(daemon.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
