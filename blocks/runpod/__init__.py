"""RunPod: the blocks a user saves, the one client interface and its two backends, the
error map, the pod lifecycle and the provider that rents pods through it.

- ``blocks``       ``RunPodCredentials`` (key, base URL, which API), ``RunPodPodSpec``, validators
- ``ssh_key``      ``RunPodSSHKey``: the key pair, the gateway and its pinned host key
- ``api``          ``RunPodApi`` (the interface) and the records both backends answer with
- ``rest``         ``RestApi``: REST v2 on httpx (``v2_models``: the shapes it sends and reads)
- ``graphql_api``  ``GraphQLApi``: the GraphQL fallback through the SDK (``client``: ``RunPodClient``)
- ``ratelimit``    the process-wide rate budget read from RunPod's ``RateLimit`` headers
- ``errors``       RunPod's answers (problem objects, SDK errors) -> what happens next
- ``account_keys`` the account's SSH keys, changed without dropping anyone's
- ``catalog`` / ``billing``  the GPU catalog and RunPod's own bill (REST v2)
- ``lifecycle``    endpoints from a pod, the host-key probe, the boot diagnosis, terminate-until-gone
- ``placement`` / ``provider``  ``RunPodProvider``, filling in the provider protocol (and the
  pre-rent placement check: GPU ids, CUDA floor, a network volume's data centre)
- ``poller``       one pod-list read per interval shared by every pod watched in a process

Names load lazily, so importing this package does not import the SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_runpod.blocks import lazy_exports

if TYPE_CHECKING:  # the same names, typed (PEP 562's __getattr__ hides them)
    from prefect_runpod.blocks.runpod.blocks import RunPodCredentials, RunPodPodSpec
    from prefect_runpod.blocks.runpod.client import RunPodClient
    from prefect_runpod.blocks.runpod.provider import RunPodProvider
    from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey

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
