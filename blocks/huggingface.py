"""Hugging Face credentials block and the client calls the access diagnosis makes.

The token is a ``SecretStr`` unwrapped only here, at the ``huggingface_hub`` call.
``HF_ENDPOINT`` is read by huggingface_hub at import time (``constants.ENDPOINT``),
so the endpoint is always passed explicitly (``HfApi(endpoint=…)``,
``hf_hub_url(…, endpoint=…)``) instead of through the environment.

:func:`collect_access_evidence` asks the same three questions as the pod-side script
``blocks/pod_side/hf_check.py`` (whoami, auth-check, HEAD on a file) through the real
client, and returns the same evidence shape, so one classifier decides both.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from prefect.blocks.abstract import CredentialsBlock
from pydantic import Field, SecretStr

__all__ = ["DEFAULT_HF_ENDPOINT", "HuggingFaceCredentials", "collect_access_evidence"]

DEFAULT_HF_ENDPOINT = "https://huggingface.co"


class HuggingFaceCredentials(CredentialsBlock):
    """A Hugging Face access token and the Hub endpoint it is for.

    The token reaches a pod only as the ``HF_TOKEN`` environment variable of the
    console session (never on a command line). Leave it empty for public models.

    Example:
        ```python
        from prefect_runpod.blocks.huggingface import HuggingFaceCredentials

        hf = HuggingFaceCredentials.load("BLOCK_NAME")
        print(hf.get_client().whoami()["name"])
        ```
    """

    _block_type_name: ClassVar[str] = "Hugging Face Credentials"
    _logo_url = "https://huggingface.co/front/assets/huggingface_logo-noborder.svg"  # type: ignore[assignment]
    _documentation_url = "https://huggingface.co/docs/huggingface_hub/quick-start#authentication"  # type: ignore[assignment]

    token: SecretStr | None = Field(
        default=None,
        title="HF token",
        description="A Hugging Face user access token (read access is enough for downloads).",
    )
    endpoint: str = Field(
        default=DEFAULT_HF_ENDPOINT,
        title="Hub endpoint",
        description="Base URL of the Hub (a mirror or a test Hub); trailing slashes are ignored.",
    )

    def get_client(self) -> Any:
        """A ``huggingface_hub.HfApi`` bound to this endpoint and token.

        Returns:
            ``HfApi``; with no token it sends no Authorization header (it never falls
            back to a token saved on this machine).
        """
        from huggingface_hub import HfApi

        token: str | bool = self.token.get_secret_value() if self.token else False
        return HfApi(endpoint=self.endpoint.rstrip("/"), token=token)

    def access_evidence(
        self,
        repo_id: str,
        *,
        repo_type: str = "model",
        revision: str = "main",
        filename: str | None = "config.json",
        timeout_seconds: float = 15.0,
    ) -> dict[str, Any]:
        """:func:`collect_access_evidence` with this block's token and endpoint."""
        return collect_access_evidence(
            repo_id,
            token=self.token,
            endpoint=self.endpoint,
            repo_type=repo_type,
            revision=revision,
            filename=filename,
            timeout_seconds=timeout_seconds,
        )


def _scrub(text: str | None, secret: str | None) -> str | None:
    if text and secret:
        return text.replace(secret, "<redacted>")
    return text


def _answer_from_exception(exc: BaseException, secret: str | None) -> dict[str, Any]:
    """The evidence of one failed call: status, X-Error-Code and the server's message."""
    response = getattr(exc, "response", None)
    if response is None:
        return {
            "status": None,
            "error_code": None,
            "message": _scrub(f"{type(exc).__name__}: {exc}", secret),
        }
    message = response.headers.get("X-Error-Message") or getattr(exc, "server_message", None)
    if not message:
        try:
            payload = json.loads(response.content or b"{}")
            message = payload.get("error") if isinstance(payload, dict) else None
        except (ValueError, TypeError, RuntimeError):
            message = None
    return {
        "status": response.status_code,
        "error_code": response.headers.get("X-Error-Code"),
        "message": _scrub(message, secret),
    }


def collect_access_evidence(
    repo_id: str,
    *,
    token: SecretStr | None,
    endpoint: str | None = None,
    repo_type: str = "model",
    revision: str = "main",
    filename: str | None = "config.json",
    timeout_seconds: float = 15.0,
) -> dict[str, Any]:
    """Ask the Hub, through ``huggingface_hub``, whether ``token`` can read ``repo_id``.

    Calls ``HfApi.whoami`` (when a token is given), ``HfApi.auth_check`` and, when that
    passes, ``get_hf_file_metadata`` (a HEAD on ``resolve/{revision}/{filename}``).
    Mirrors ``blocks/pod_side/hf_check.py``; see it for the shape.

    Args:
        repo_id: ``namespace/name``.
        token: the token to test; None sends none (no fallback to a saved login).
        endpoint: Hub base URL; default ``https://huggingface.co``.
        repo_type: ``model`` or ``dataset``.
        revision: branch, tag or commit for the HEAD.
        filename: the file to HEAD; None skips it.
        timeout_seconds: per-request timeout for the HEAD (whoami / auth-check use
            huggingface_hub's session defaults).

    Returns:
        The evidence dict (``kind == "hf_check"``). Never contains the token.
    """
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url

    base = (endpoint or DEFAULT_HF_ENDPOINT).rstrip("/")
    secret = token.get_secret_value() if token else None
    send: str | bool = secret or False
    api = HfApi(endpoint=base, token=send)
    evidence: dict[str, Any] = {
        "kind": "hf_check",
        "endpoint": base,
        "repo_id": repo_id,
        "repo_type": repo_type,
        "token_present": bool(secret),
        "token_source": "block" if secret else None,
        "whoami": None,
        "auth_check": None,
        "file": None,
    }
    if secret:
        try:
            body = api.whoami(token=secret)
            access = (body.get("auth") or {}).get("accessToken") or {}
            fine = access.get("fineGrained")
            evidence["whoami"] = {
                "status": 200,
                "error_code": None,
                "message": None,
                "user": body.get("name"),
                "role": access.get("role"),
                "can_read_gated": fine.get("canReadGatedRepos") if isinstance(fine, dict) else None,
            }
        except Exception as exc:  # noqa: BLE001 - any failure is evidence, classified later
            evidence["whoami"] = _answer_from_exception(exc, secret)
    try:
        api.auth_check(repo_id, repo_type=repo_type, token=send)
        evidence["auth_check"] = {"status": 200, "error_code": None, "message": None}
    except Exception as exc:  # noqa: BLE001
        evidence["auth_check"] = _answer_from_exception(exc, secret)
    if evidence["auth_check"]["status"] == 200 and filename:
        url = hf_hub_url(repo_id, filename, repo_type=repo_type, revision=revision, endpoint=base)
        try:
            get_hf_file_metadata(url=url, token=send, timeout=timeout_seconds, endpoint=base)
            evidence["file"] = {"status": 200, "error_code": None, "message": None}
        except Exception as exc:  # noqa: BLE001
            evidence["file"] = _answer_from_exception(exc, secret)
    return evidence
