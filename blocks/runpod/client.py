"""A thin client over the ``runpod`` SDK (1.12) that binds one API key.

Every call goes through the SDK: its query/mutation builders and its transport
``runpod.api.graphql.run_graphql_query`` (``POST {RUNPOD_API_BASE_URL}/graphql``).
The key is passed per call (``api_key=``), never written to ``runpod.api_key``, so two
credentials can live in one process. The key is unwrapped only here, at the call.

The SDK inlines values into GraphQL text unescaped (``f'name: "{name}"'``); callers
pass values already validated by ``runpod.blocks`` (names, ids) or escaped with
``graphql_escape`` (free text).

``requests`` quotes a header it refuses (``InvalidHeader: … 'Bearer rpa_…\n'``): every
call re-raises that as ``SecretShapeError`` without the header (``REFUSED_KEY_HEADER``).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import SecretStr

from prefect_runpod.blocks.runpod.errors import REFUSED_KEY_HEADER
from prefect_runpod.blocks.secret_mask import register

__all__ = ["RunPodClient", "graphql_escape"]


def graphql_escape(value: str) -> str:
    """Escape ``value`` for use inside a GraphQL double-quoted string literal.

    JSON's string escapes (``\\"``, ``\\\\``, ``\\n``, ``\\uXXXX``) are all valid in
    GraphQL strings, so a JSON-encoded string minus its quotes is a safe body for the
    SDK's ``"{value}"`` templates.
    """
    return json.dumps(value, ensure_ascii=False)[1:-1]


class RunPodClient:
    """RunPod's GraphQL API through the ``runpod`` SDK, with one bound API key.

    Each method may raise what the SDK raises: ``runpod.error.AuthenticationError``
    (HTTP 401), ``runpod.error.QueryError`` (GraphQL ``errors``), ``ValueError``
    (unknown GPU id), ``requests`` errors (network, non-JSON 5xx). The provider
    classifies them with ``runpod.errors.classify_exception``. A key whose header
    ``requests`` refuses raises ``SecretShapeError`` (without the header), never retried.
    """

    def __init__(self, api_key: SecretStr) -> None:
        register(api_key)
        self._api_key = api_key

    def __repr__(self) -> str:
        return "RunPodClient(api_key=SecretStr('**********'))"

    def _key(self) -> str:
        return self._api_key.get_secret_value()

    @REFUSED_KEY_HEADER
    def query(self, query: str) -> dict[str, Any]:
        """Send one GraphQL document; returns the whole JSON answer (``{"data": …}``)."""
        from runpod.api.graphql import run_graphql_query

        return run_graphql_query(query, api_key=self._key())

    @REFUSED_KEY_HEADER
    def get_gpus(self) -> list[dict[str, Any]]:
        """``gpuTypes { id displayName memoryInGb }`` (SDK ``get_gpus``)."""
        from runpod.api import ctl_commands

        return list(ctl_commands.get_gpus(api_key=self._key()))

    @REFUSED_KEY_HEADER
    def get_gpu(self, gpu_type_id: str, gpu_count: int = 1) -> dict[str, Any]:
        """One GPU type with prices (SDK ``get_gpu``); ``ValueError`` if unknown."""
        from runpod.api import ctl_commands

        return ctl_commands.get_gpu(gpu_type_id, gpu_count, api_key=self._key())

    @REFUSED_KEY_HEADER
    def get_pods(self) -> list[dict[str, Any]]:
        """All pods of the account (SDK ``get_pods``: ``myself { pods { … } }``)."""
        from runpod.api import ctl_commands

        return list(ctl_commands.get_pods(api_key=self._key()) or [])

    @REFUSED_KEY_HEADER
    def get_pod(self, pod_id: str) -> dict[str, Any] | None:
        """One pod (SDK ``get_pod``), or None when RunPod answers ``pod: null``."""
        from runpod.api import ctl_commands

        return ctl_commands.get_pod(pod_id, api_key=self._key())

    @REFUSED_KEY_HEADER
    def get_user(self) -> dict[str, Any]:
        """``myself { id pubKey networkVolumes {…} }`` (SDK ``get_user``)."""
        from runpod.api import ctl_commands

        return ctl_commands.get_user(api_key=self._key())

    @REFUSED_KEY_HEADER
    def update_user_settings(self, pub_key: str) -> dict[str, Any]:
        """Replace the account's SSH public keys (``updateUserSettings(input:{pubKey})``)."""
        from runpod.api import ctl_commands

        return ctl_commands.update_user_settings(pub_key, api_key=self._key())

    def deploy_on_demand(self, **fields: Any) -> dict[str, Any]:
        """``podFindAndDeployOnDemand`` built by the SDK's own mutation builder.

        Args:
            **fields: keyword arguments of
                ``runpod.api.mutations.pods.generate_pod_deployment_mutation`` (``name``,
                ``image_name``, ``gpu_type_id``, ``cloud_type``, ``env`` …), validated
                and escaped by the caller.

        Returns:
            ``{id imageName env machineId machine { podHostId }}``.
        """
        from runpod.api.mutations.pods import generate_pod_deployment_mutation

        mutation = generate_pod_deployment_mutation(**fields)
        answer = self.query(mutation)
        return answer["data"]["podFindAndDeployOnDemand"]

    def terminate_pod(self, pod_id: str) -> None:
        """``podTerminate(input:{podId})`` (a scalar answer), with the bound key."""
        from runpod.api.mutations.pods import generate_pod_terminate_mutation

        self.query(generate_pod_terminate_mutation(pod_id))
