"""What the local pod offers beyond the ``PodProvider`` calls (docs/architecture.md#capabilities):
the provider built from a run's parameters (its mode, pretend price and image profile,
a fresh key pair per run), the pod a run is about to rent, its one pretend offer, and
the parameters only the local pod takes. It lives on this machine, so its workspace is
on this disk. ``LocalPodProvider`` inherits them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.provider_capabilities import (
    Capability,
    Capable,
    Offer,
    Offers,
    PlannedPod,
)

__all__ = ["LocalPodCapabilities"]


class LocalPodCapabilities(Capable):
    """The local pod's side of the capabilities (see ``blocks/provider_capabilities.py``)."""

    provider_name = "local"
    display_name = "the local pod"
    capabilities = frozenset(
        {
            Capability.POD_PLAN,
            Capability.PRICES,
            Capability.OPTIONS,
            Capability.ON_THIS_MACHINE,
        }
    )

    home: Path
    mode: Literal["gateway", "direct"]
    cost_per_hr: float

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The run parameters that mean something for the local pod only."""
        return ("local_mode", "local_cost_per_hr", "local_image")

    @classmethod
    def from_params(cls, params: dict[str, Any], *, need_ssh_key: bool = True) -> Any:
        """A local pod provider (mode, price and image profile from the parameters) and
        a fresh per-run key pair.

        Returns:
            ``(provider, KeyPair)``.

        Raises:
            SpecError: ``local_image`` names no image profile.
        """
        provider = cls(  # type: ignore[call-arg]
            mode=params.get("local_mode") or "gateway",
            cost_per_hr=float(params.get("local_cost_per_hr") or 0.0),
            image=params.get("local_image") or "plain",
        )
        return provider, generate_keypair("prefect-runpod-local")

    def plan_pod(self, name: str) -> PlannedPod:
        """The pod a create would start: its SSH mode decides the endpoints (gateway:
        PTY only; direct: exec and SFTP) and the workspace's filesystem the disk.

        Raises:
            SpecError: the pods' home cannot be created (a read-only HOME).
        """
        pending = "(not rented yet)"
        local = SSHEndpoint(host="127.0.0.1", port=22, user="root", mode=self.mode)
        handle = PodHandle(
            pod_id=pending,
            name=name,
            provider=self.provider_name,
            ssh=local,
            direct_ssh=local if self.mode == "direct" else None,
        )
        home = Path(self.home)
        try:  # where the pod will live: a HOME that is read-only says so here
            home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError(
                f"the local pods' home {home} cannot be created ({exc.strerror}): make HOME "
                "writable, or set PREFECT_RUNPOD_HOME to a folder this user can write"
            ) from None
        free = shutil.disk_usage(home).free
        described = "PTY only, like RunPod's gateway" if self.mode == "gateway" else "exec and SFTP"
        return PlannedPod(
            description=f"a local pod in {self.mode} mode ({described})",
            handle=handle,
            disk_bytes=free,
            disk_description=f"the free space under {home}",
        )

    def offers(self) -> Offers:
        """One offer: this machine's CPU at the pretend price."""
        return Offers([Offer("cpu (local pod)", self.cost_per_hr, "HIGH")])
