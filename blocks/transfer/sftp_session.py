"""The connection of the ``sftp`` transfer method: one SSH connection to a pod's
direct-TCP sshd with an SFTP channel and exec for ``manifest.py``
(:class:`SftpSession`), opened again after a drop (:func:`with_reconnect`).

Direct mode only: RunPod's gateway refuses SFTP and exec. The files themselves move in
:mod:`prefect_runpod.blocks.transfer.sftp`.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
from pydantic import SecretStr

from prefect_runpod.blocks.console.ssh import open_ssh_client
from prefect_runpod.blocks.exceptions import TransferError
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.models import MethodResult, refuse_links
from prefect_runpod.blocks.transfer.pod_tools import manifest_command

__all__ = [
    "WINDOW_BYTES",
    "SftpSession",
    "connect_direct",
    "direct_endpoint",
    "remote_size",
    "with_reconnect",
]

WINDOW_BYTES = 8 * 1024 * 1024


_DROPS = (paramiko.SSHException, OSError, EOFError)


def direct_endpoint(handle: PodHandle) -> SSHEndpoint | None:
    """The pod's direct-TCP sshd (``handle.direct_ssh``, or ``handle.ssh`` in direct
    mode), or None when it has only the gateway."""
    if handle.direct_ssh is not None:
        return handle.direct_ssh
    if handle.ssh is not None and handle.ssh.mode == "direct":
        return handle.ssh
    return None


def connect_direct(
    endpoint: SSHEndpoint, private_key: SecretStr, timeout_seconds: float = 30.0
) -> paramiko.SSHClient:
    """A paramiko client on a direct-mode endpoint, host key pinned when known.

    The connection itself is ``ssh_connect.open_ssh_client`` (one place for host-key
    pinning and the cipher choice).

    Raises:
        ConsoleConnectError: the connection or the login failed, or the host key differs.
    """
    where = f"{endpoint.user}@{endpoint.host}:{endpoint.port}"
    client = open_ssh_client(
        endpoint,
        private_key,
        pinned_host_key=endpoint.host_key,
        timeout_seconds=timeout_seconds,
        where=where,
    )
    transport = client.get_transport()
    assert transport is not None
    transport.default_window_size = WINDOW_BYTES
    transport.set_keepalive(15)
    return client


class SftpSession:
    """One SSH connection with an SFTP channel and exec for ``manifest.py``."""

    def __init__(
        self, endpoint: SSHEndpoint, private_key: SecretStr, tools_dir: str, python: str = "python3"
    ):
        self.endpoint, self.private_key = endpoint, private_key
        self.tools_dir, self.python = tools_dir, python
        self.client = connect_direct(endpoint, private_key)
        transport = self.client.get_transport()
        assert transport is not None
        sftp = paramiko.SFTPClient.from_transport(transport, window_size=WINDOW_BYTES)
        assert sftp is not None
        self.sftp = sftp
        self._install_manifest()

    def _install_manifest(self) -> None:
        local = Path(mf.__file__)
        self.makedirs(self.tools_dir)
        target = f"{self.tools_dir}/manifest.py"
        try:
            if self.sftp.stat(target).st_size == local.stat().st_size:
                return
        except OSError:
            pass
        self.sftp.put(str(local), target + ".tmp")
        self.sftp.posix_rename(target + ".tmp", target)

    def makedirs(self, path: str) -> None:
        """``mkdir -p`` over SFTP."""
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if not sub:
                continue
            try:
                if stat.S_ISDIR(self.sftp.stat(sub).st_mode or 0):
                    continue
            except OSError:
                self.sftp.mkdir(sub)

    def manifest(
        self,
        root: str,
        paths: list[str] | None = None,
        prefix_bytes: int | None = None,
        *,
        follow_links: bool = False,
        structure: list[dict[str, Any]] | None = None,
        save_known: str | None = None,
        use_known: str | None = None,
    ) -> dict[str, Any]:
        """The pod's manifest of ``root`` (``manifest.py`` over exec), after making the
        directory and link entries of ``structure`` when given (``save_known`` /
        ``use_known``: see ``pod_tools.manifest_command``).

        Raises:
            SpecError: the tree holds links that leave it or dangle (each named).
            TransferError: the script failed (e.g. the folder is missing), or the
                ``structure`` entries could not be made."""
        cmd = manifest_command(
            self.tools_dir,
            root,
            paths,
            python=self.python,
            prefix_bytes=prefix_bytes,
            follow_links=follow_links,
            structure=structure,
            save_known=save_known,
            use_known=use_known,
        )
        _, stdout, stderr = self.client.exec_command(cmd, timeout=600)
        out = stdout.read()
        code = stdout.channel.recv_exit_status()
        if code == 3:
            answer: dict[str, Any] = json.loads(out)
            problems = answer.get("problems") or []
            if structure:
                listed = "; ".join(f"{path} ({why})" for path, why in problems[:20])
                raise TransferError(f"could not make {listed} under {root} on the pod")
            raise refuse_links(f"the pod's {root}", problems)
        if code != 0:
            raise TransferError(
                f"manifest of {root} on the pod failed: "
                f"{stderr.read().decode(errors='replace').strip()}"
            )
        result: dict[str, Any] = json.loads(out)
        return result

    def close(self) -> None:
        """Close SFTP and SSH."""
        try:
            self.sftp.close()
        finally:
            self.client.close()


def remote_size(sftp: paramiko.SFTPClient, path: str) -> int | None:
    """The size of ``path`` on the pod in bytes, or None when it is not there."""
    try:
        return sftp.stat(path).st_size
    except OSError:
        return None


def with_reconnect(
    work: Callable[[SftpSession], MethodResult],
    open_session: Callable[[], SftpSession],
    max_reconnects: int,
    pod: str,
) -> MethodResult:
    """Run ``work`` on a fresh session, again on a new one after each dropped
    connection (up to ``max_reconnects``); the result counts the reconnects.

    Raises:
        TransferError: the connection dropped more than ``max_reconnects`` times.
    """
    reconnects = 0
    while True:
        session = None
        try:
            session = open_session()
            result = work(session)
            return result.model_copy(update={"reconnects": reconnects})
        except _DROPS as exc:
            reconnects += 1
            if reconnects > max_reconnects:
                raise TransferError(
                    f"sftp transfer with pod {pod} dropped {reconnects} times (last: {exc}); "
                    "check the pod is running and rerun — partial files resume",
                    pod_id=pod,
                ) from exc
        finally:
            if session is not None:
                session.close()
