"""The OpenSSH client's command line for an interactive shell on a pod, with the pod's
pinned host key (docs/architecture.md#drops-and-host-keys): what ``prefect-runpod ssh``
runs, and what anything else that hands a person (or a worker) a way into the pod
builds, without importing the CLI."""

from __future__ import annotations

from pathlib import Path

from prefect_runpod.blocks.pod_handle import PodHandle

__all__ = ["ssh_argv"]


def ssh_argv(handle: PodHandle, key_path: str, known_hosts: Path) -> list[str]:
    """The OpenSSH client's argv for an interactive shell on the pod (the gateway wants a
    PTY: ``-tt``), checking the pod's pinned host key when the handle has one.

    Args:
        handle: the live pod (its ``ssh`` endpoint must be known).
        key_path: the private key file.
        known_hosts: a file to hold the pinned host key (written here when known); with
            no key pinned yet, the first key seen is kept in that file only.

    Returns:
        ``["ssh", "-tt", "-i", key_path, "-p", PORT, …, "USER@HOST"]``.
    """
    assert handle.ssh is not None
    ep = handle.ssh
    argv = ["ssh", "-tt", "-i", key_path, "-p", str(ep.port), "-o", "IdentitiesOnly=yes"]
    argv += ["-o", f"UserKnownHostsFile={known_hosts}"]
    if ep.host_key:
        host = ep.host if ep.port == 22 else f"[{ep.host}]:{ep.port}"
        known_hosts.write_text(f"{host} {ep.host_key.strip()}\n")
        argv += ["-o", "StrictHostKeyChecking=yes"]
    else:  # not pinned yet: the first key seen is kept in that file only
        argv += ["-o", "StrictHostKeyChecking=accept-new"]
    return [*argv, f"{ep.user}@{ep.host}"]
