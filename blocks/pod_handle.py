"""The plain, JSON-serialisable records that name a pod and the way into it.

Tasks pass these between stages and persist them as Prefect results; they never hold
a live client (a live paramiko object silently fails to persist, see docs/architecture.md#data-that-moves).
"""

from __future__ import annotations

import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["PodHandle", "SSHEndpoint", "known_hosts_file"]


def known_hosts_file(pod_id: str) -> Path:
    """The file that pins one pod's host key for the OpenSSH client
    (``<PREFECT_RUNPOD_HOME or ~/.prefect-runpod>/known_hosts/<pod_id>``), never the user's
    ``~/.ssh/known_hosts``: a pod's key dies with the pod."""
    from prefect_runpod.blocks.local_pod.registry import default_home

    return default_home() / "known_hosts" / pod_id


class SSHEndpoint(BaseModel):
    """How to reach a pod over SSH.

    Attributes:
        host: host name or IP (``ssh.runpod.io`` for RunPod's gateway, ``127.0.0.1`` locally).
        port: TCP port.
        user: login user; on RunPod's gateway this is the pod's ``podHostId``
            (``<podId>-<8 hex>``, per RunPod's docs), ``root`` for direct TCP.
        mode: ``gateway`` (PTY only: no exec, no SFTP) or ``direct`` (full sshd).
        host_key: the server's public host key as one OpenSSH line
            (``ssh-ed25519 AAAA…``), pinned by the client; None until first recorded.
    """

    host: str
    port: int = Field(ge=1, le=65535)
    user: str
    mode: Literal["gateway", "direct"] = "gateway"
    host_key: str | None = None

    def ssh_command(self, key_path: str = "KEY") -> str:
        """The short form of the command that gets a shell on the pod (``ssh -tt -i KEY -p
        PORT user@host``), for messages; ``PodHandle.pinned_ssh_command`` is the one to
        paste."""
        return (
            f"ssh -tt -i {shlex.quote(key_path)} -p {self.port} "
            f"{shlex.quote(self.user)}@{self.host}"
        )


class PodHandle(BaseModel):
    """A pod that exists (or existed) at a provider.

    Attributes:
        pod_id: the provider's id: lowercase letters and digits (RunPod's ``id``; local
            pods get ids of the same shape).
        name: ``<prefix>-<flow_run_id>``; hooks and the reaper find pods by it.
        provider: the provider's name (``runpod``, ``local``: ``blocks.provider_registry``).
        gpu_type: the GPU type id rented (``NVIDIA GeForce RTX 3090``), ``cpu`` locally.
        gpu_count: how many GPUs the pod has (RunPod's ``gpuCount``); 0 for a pod
            without one (a local pod). A checkpoint records it: its per-rank state
            resumes only on a pod with as many.
        cost_per_hr: price in USD/h (RunPod's ``costPerHr``).
        created_at: when the provider returned the id (UTC); billing starts here.
        ssh: the endpoint the console uses (gateway by default).
        direct_ssh: a direct-TCP endpoint when the pod exposes 22/tcp on a public IP.
        workdir: the pod's workspace directory (``/workspace`` on RunPod).
        pod_host_id: RunPod's ``machine.podHostId`` (only create/resume return it).
        lifetime_seconds: the dead-man lifetime the pod was created with (recorded on
            the pod, so the reaper's default TTL can follow it), or None when unknown.
    """

    pod_id: str
    name: str
    provider: str
    gpu_type: str = "cpu"
    gpu_count: int = Field(default=0, ge=0)
    cost_per_hr: float = Field(default=0.0, ge=0.0)
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    ssh: SSHEndpoint | None = None
    direct_ssh: SSHEndpoint | None = None
    workdir: str = "/workspace"
    pod_host_id: str | None = None
    lifetime_seconds: float | None = None

    def ssh_command(self, key_path: str = "KEY") -> str:
        """The short ``ssh -tt …`` form for messages (``SSHEndpoint.ssh_command``), or a
        note that the endpoint is not known yet."""
        if self.ssh is None:
            return f"(pod {self.pod_id}: SSH endpoint not known yet)"
        return self.ssh.ssh_command(key_path)

    def pinned_ssh_command(self, key_path: str = "KEY") -> str:
        """The one ``ssh`` line every place shows (the run's log, its summary, ``status``,
        ``pods``, ``ssh --print``): the line that works when pasted while the pod lives, with
        the pod's host key pinned in ``known_hosts_file(pod_id)`` (written here). A note
        when the endpoint is not known yet.

        Args:
            key_path: the private key file in use (shown as it is: pass an absolute path).
        """
        from prefect_runpod.blocks.console.openssh import ssh_argv

        if self.ssh is None:
            return f"(pod {self.pod_id}: SSH endpoint not known yet)"
        return shlex.join(ssh_argv(self, key_path, known_hosts_file(self.pod_id)))
