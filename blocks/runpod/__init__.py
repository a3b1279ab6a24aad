"""RunPod: the blocks a user saves, the SDK client, the error map, the pod lifecycle and
the provider that rents pods through the ``runpod`` SDK (GraphQL).

- ``blocks``     ``RunPodCredentials``, ``RunPodPodSpec`` and the input validators
- ``ssh_key``    ``RunPodSSHKey``: the key pair, the gateway and its pinned host key
- ``client``     ``RunPodClient``: the SDK bound to one API key
- ``errors``     RunPod's exact error strings -> what the provider does next
- ``lifecycle``  endpoints from a pod answer, the host-key probe, terminate-until-gone
- ``provider``   ``RunPodProvider``, filling in the provider protocol

Names load lazily, so importing this package does not import the SDK.
"""

from __future__ import annotations

from prefect_runpod.blocks import lazy_exports

__all__ = ["RunPodClient", "RunPodCredentials", "RunPodPodSpec", "RunPodProvider", "RunPodSSHKey"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "RunPodClient": f"{__name__}.client",
        "RunPodCredentials": f"{__name__}.blocks",
        "RunPodPodSpec": f"{__name__}.blocks",
        "RunPodProvider": f"{__name__}.provider",
        "RunPodSSHKey": f"{__name__}.ssh_key",
    },
)
