"""Which Prefect API a pod is handed, and whether it can reach it
(docs/worker.md#how-the-pod-reaches-prefect). Pure: no Prefect import; a host name is resolved once."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.provider_capabilities import Capability
from prefect_runpod.blocks.provider_registry import provider_supports

__all__ = ["api_key_kind", "pod_api_url"]


def _unreachable_reason(host: str) -> str | None:
    """Why a pod on RunPod cannot reach ``host``, or None when it may."""
    name = host.strip("[]").lower()
    if name in {"localhost", "localhost.localdomain"} or name.endswith(".localhost"):
        return "loopback"
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        if "." not in name:
            return "a name only this network resolves"
        try:
            address = ipaddress.ip_address(socket.gethostbyname(name))
        except (OSError, ValueError):
            return None  # a public name this machine cannot resolve: the pod may
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_private or address.is_unspecified:
        return "a private address"
    return None


def pod_api_url(api_url: str | None, override: str | None, *, provider: str) -> str:
    """The Prefect API URL the pod's flow process talks to.

    Args:
        api_url: the worker's own ``PREFECT_API_URL``.
        override: the job variable ``prefect_api_url_for_pod`` (used as it is).
        provider: the pod's provider; one whose pods run on this machine
            (``Capability.ON_THIS_MACHINE``: the local pod) reaches any URL this one does.

    Returns:
        ``override`` when set, else ``api_url``.

    Raises:
        SpecError: no URL at all, or, for a RunPod pod, one it cannot reach (loopback,
            link-local, a private address), in one sentence that names the fix.
    """
    if override:
        return override
    if not api_url:
        raise SpecError(
            "the worker has no PREFECT_API_URL, so a pod has no Prefect API to report to: "
            "start the worker against a Prefect server or Prefect Cloud"
        )
    if provider_supports(provider, Capability.ON_THIS_MACHINE):
        return api_url
    host = urlsplit(api_url).hostname or ""
    why = _unreachable_reason(host)
    if why is None:
        return api_url
    return _refuse(api_url, why)


def _refuse(api_url: str, why: str) -> str:
    raise SpecError(
        f"the Prefect API {api_url} is {why}, which a RunPod pod cannot reach: set the job "
        "variable prefect_api_url_for_pod to an address the pod can reach, or run the worker "
        "against Prefect Cloud"
    )


def api_key_kind(api_key: str | None) -> str:
    """What kind of key the worker hands the pod, in words for its one log line:
    ``no API key`` (a self-hosted server without auth), ``a Prefect Cloud API key``
    (``pnu_``: a user's, ``pnb_``: a service account's) or ``an API key``."""
    if not api_key:
        return "no API key (a server without authentication)"
    if api_key.startswith("pnb_"):
        return "a Prefect Cloud service account's API key"
    if api_key.startswith("pnu_"):
        return "a Prefect Cloud user API key (a service account's is safer on a rented pod)"
    return "an API key"
