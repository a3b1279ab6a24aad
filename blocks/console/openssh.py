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
    PTY: ``-tt``), checking the pod's pinned host key when it is known.

    Args:
        handle: the live pod (its ``ssh`` endpoint must be known).
        key_path: the private key file (shown as it is: pass an absolute path).
        known_hosts: the file that pins this pod's host key; written here when the key is
            known (then ``StrictHostKeyChecking=yes``). A handle read back from the
            provider may not carry the key the run learned on its first connection
            (RunPod's gateway key is pinned on first use): the pin the run wrote to this
            file then counts the same. Else the first key seen is kept in that file only
            (``accept-new``), never in the user's own known_hosts.

    Returns:
        ``["ssh", "-tt", "-i", key_path, "-p", PORT, …, "USER@HOST"]``.
    """
    assert handle.ssh is not None
    ep = handle.ssh
    argv = ["ssh", "-tt", "-i", key_path, "-p", str(ep.port), "-o", "IdentitiesOnly=yes"]
    argv += ["-o", f"UserKnownHostsFile={known_hosts}"]
    host = ep.host if ep.port == 22 else f"[{ep.host}]:{ep.port}"
    pinned = ep.host_key.strip() if ep.host_key else _pinned_in(known_hosts, host)
    if pinned:
        known_hosts.parent.mkdir(parents=True, exist_ok=True)
        known_hosts.write_text(f"{host} {pinned}\n")
        argv += ["-o", "StrictHostKeyChecking=yes"]
    else:
        argv += ["-o", "StrictHostKeyChecking=accept-new"]
    return [*argv, f"{ep.user}@{ep.host}"]


def _pinned_in(known_hosts: Path, host: str) -> str | None:
    """The host key ``known_hosts`` pins for ``host`` (``[host]:port`` off port 22), or None."""
    try:
        lines = known_hosts.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, key = line.strip().partition(" ")
        if name == host and key.strip():
            return key.strip()
    return None
