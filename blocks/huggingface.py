"""Hugging Face credentials block and the client calls the access diagnosis and the
publish stage make.

The token is a ``SecretStr`` unwrapped only here, at the ``huggingface_hub`` call.
``HF_ENDPOINT`` is read by huggingface_hub at import time (``constants.ENDPOINT``),
so the endpoint is always passed explicitly (``HfApi(endpoint=…)``,
``hf_hub_url(…, endpoint=…)``) instead of through the environment.

:func:`collect_access_evidence` asks the same three questions as the pod-side script
``blocks/pod_side/hf_check.py`` (whoami, auth-check, HEAD on a file) through the real
client, and returns the same evidence shape, so one classifier decides both.
:func:`collect_write_evidence` asks whether a token may publish to a repo (before any
spend), and :func:`hub_file_records` reads back what the Hub stored for each published
file (docs/architecture.md#publish-from-the-pod).
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar, NamedTuple

from prefect.blocks.abstract import CredentialsBlock
from pydantic import Field, SecretStr, field_validator

from prefect_runpod.blocks import secret_mask
from prefect_runpod.blocks.exceptions import SpecError

__all__ = [
    "DEFAULT_HF_ENDPOINT",
    "HFAccess",
    "HuggingFaceCredentials",
    "collect_access_evidence",
    "collect_write_evidence",
    "hub_file_records",
    "resolve_hf_access",
    "whoami_evidence",
]

DEFAULT_HF_ENDPOINT = "https://huggingface.co"


class HuggingFaceCredentials(CredentialsBlock):
    """A Hugging Face access token and the Hub endpoint it is for.

    A run names it (``hf_credentials_block`` / ``--hf-credentials NAME``); the token
    reaches a pod only as the ``HF_TOKEN`` environment variable of the console session
    (never on a command line, never as a run parameter). Leave it empty for public
    models. A token with whitespace or a control character in it is refused where a
    run reads it, naming the block, never the token (docs/secrets.md).

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

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        from prefect_runpod.blocks.validation import check_url

        return check_url(value, "endpoint")

    def get_client(self) -> Any:
        """A ``huggingface_hub.HfApi`` bound to this endpoint and token.

        Returns:
            ``HfApi``; with no token it sends no Authorization header (it never falls
            back to a token saved on this machine).
        """
        return _hub(self.endpoint, self.token)[2]

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


class HFAccess(NamedTuple):
    """The Hugging Face token and endpoint a run uses, and where the token came from.

    Attributes:
        token: the token, or None (public models only).
        endpoint: the Hub base URL, or None for ``DEFAULT_HF_ENDPOINT``.
        source: ``HuggingFaceCredentials block 'NAME'``, ``Secret block 'NAME'``,
            ``environment variable HF_TOKEN`` or ``none`` (never the token itself).
    """

    token: SecretStr | None
    endpoint: str | None
    source: str


def resolve_hf_access(
    *,
    credentials_block: str | None = None,
    token_secret: str | None = None,
    token_env: str = "HF_TOKEN",
    endpoint: str | None = None,
) -> HFAccess:
    """Where a run's Hugging Face token comes from, in this order: a saved
    ``HuggingFaceCredentials`` block, else a saved Prefect ``Secret`` block, else the
    environment variable ``token_env`` of the process running the flow (the worker).
    A run parameter never carries the token itself: Prefect stores parameters as sent.

    Args:
        credentials_block: the name of a saved ``HuggingFaceCredentials`` block.
        token_secret: the name of a saved ``prefect.blocks.system.Secret`` holding the token.
        token_env: the environment variable read when no block is named.
        endpoint: the Hub URL; default the credentials block's, else huggingface.co.

    Returns:
        ``HFAccess`` (the token stays a ``SecretStr``).

    Raises:
        SpecError: both blocks named, a named block that is not saved (the saved ones
            are listed), a Secret that is not text, a malformed variable name or URL.
        SecretShapeError: the token holds whitespace or a control character (one
            trailing newline is stripped, and said; ``blocks.secret_mask.check_secret``).
    """
    from prefect_runpod.blocks.validation import check_env_name, check_url, load_block

    if credentials_block and token_secret:
        raise SpecError(
            "hf_credentials_block (--hf-credentials) and hf_token_secret (--hf-token-secret) "
            "both name a Hugging Face token: give one of them."
        )
    if endpoint is not None:
        endpoint = check_url(endpoint, "hf_endpoint")
    if credentials_block:
        block = load_block(HuggingFaceCredentials, credentials_block, "hf_credentials_block")
        if endpoint is None and block.endpoint.rstrip("/") != DEFAULT_HF_ENDPOINT:
            endpoint = check_url(block.endpoint, "hf_endpoint")
        source = f"HuggingFaceCredentials block {credentials_block!r}"
        token = block.token.get_secret_value() if block.token else ""
        if not token:
            return HFAccess(None, endpoint, source)
        what = f"the token of the HuggingFaceCredentials block {credentials_block!r}"
        fix = "remove it and save the block again"
        return HFAccess(SecretStr(secret_mask.check_secret(token, what, fix=fix)), endpoint, source)
    if token_secret:
        from prefect.blocks.system import Secret

        value = load_block(Secret, token_secret, "hf_token_secret").get()
        secret_mask.register(value if isinstance(value, str) else None)
        if not isinstance(value, str) or not value.strip():
            raise SpecError(
                f"the Secret block {token_secret!r} (hf_token_secret) does not hold a token as "
                "text: save the token itself, e.g. Secret(value='hf_...').save(NAME)."
            )
        what = f"the Secret block {token_secret!r} (hf_token_secret)"
        value = secret_mask.check_secret(value, what, fix="remove it and save the block again")
        return HFAccess(SecretStr(value), endpoint, f"Secret block {token_secret!r}")
    name = check_env_name(token_env)
    value = os.environ.get(name, "")
    if value.strip():
        token = secret_mask.check_secret(value, name)
        return HFAccess(SecretStr(token), endpoint, f"environment variable {name}")
    return HFAccess(None, endpoint, "none")


_REFUSED = secret_mask.refused_headers(
    "the Hugging Face Hub",
    "the Hugging Face token (HF_TOKEN, the variable --hf-token-env names, or the block)",
)
"""A header the HTTP client refused, raised as ``SecretShapeError`` (the Hub was never
asked, so the network is not to blame)."""


def _hub(endpoint: str | None, token: SecretStr | None) -> tuple[str, str | None, Any]:
    """``(base URL, token value, HfApi)`` for the Hub at ``endpoint`` (default
    ``DEFAULT_HF_ENDPOINT``, trailing slashes dropped): the token is registered for
    masking, and without one the client sends no Authorization header (it never falls
    back to a token saved on this machine)."""
    from huggingface_hub import HfApi

    base = (endpoint or DEFAULT_HF_ENDPOINT).rstrip("/")
    secret_mask.register(token)
    secret = token.get_secret_value() if token else None
    return base, secret, HfApi(endpoint=base, token=secret or False)


def _answer_from_exception(exc: BaseException, secret: str | None) -> dict[str, Any]:
    """The evidence of one failed call: status, X-Error-Code and the server's message
    (redacted).

    Raises:
        SecretShapeError: the HTTP client refused the header made from the token.
    """
    secret_mask.register(secret)
    if secret_mask.is_header_error(exc):
        with _REFUSED:
            raise exc
    response = getattr(exc, "response", None)
    if response is None:
        return {"status": None, "error_code": None, "message": secret_mask.error_text(exc)}
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
        "message": secret_mask.redact(message) if message else message,
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

    Raises:
        SecretShapeError: the HTTP client refused the header made from the token.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    base, secret, api = _hub(endpoint, token)
    send: str | bool = secret or False
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
        evidence["whoami"] = _who(api, secret)
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


def whoami_evidence(token: SecretStr, endpoint: str | None = None) -> dict[str, Any]:
    """Who the token belongs to, asked of the Hub (``HfApi.whoami``), as evidence: ``status``
    (200, or the HTTP status of the refusal; None when the Hub did not answer), ``user``,
    ``role`` (``read``/``write``/``fineGrained``), ``message``. The token is unwrapped
    only at the call.

    Args:
        token: the Hugging Face token.
        endpoint: the Hub base URL (default ``DEFAULT_HF_ENDPOINT``).

    Raises:
        SecretShapeError: the HTTP client refused the header made from the token (any
            other failure is evidence).
    """
    from huggingface_hub import HfApi

    return _who(HfApi(endpoint=endpoint or DEFAULT_HF_ENDPOINT), token.get_secret_value())


def _who(api: Any, secret: str) -> dict[str, Any]:
    """``whoami`` as evidence: the user, the token's role, the orgs with the user's role
    in each, and for a fine-grained token the namespaces it may write (``repo.write``)."""
    try:
        body = api.whoami(token=secret)
    except Exception as exc:  # noqa: BLE001 - any failure is evidence, classified later
        return _answer_from_exception(exc, secret)
    access = (body.get("auth") or {}).get("accessToken") or {}
    fine = access.get("fineGrained") if isinstance(access.get("fineGrained"), dict) else None
    scopes = []
    for scope in (fine or {}).get("scoped") or []:
        if "repo.write" in (scope.get("permissions") or []):
            scopes.append((scope.get("entity") or {}).get("name"))
    return {
        "status": 200,
        "error_code": None,
        "message": None,
        "user": body.get("name"),
        "role": access.get("role"),
        "orgs": {o.get("name"): o.get("roleInOrg") for o in body.get("orgs") or []},
        "write_scopes": [s for s in scopes if s],
        "can_read_gated": fine.get("canReadGatedRepos") if fine else None,
    }


def collect_write_evidence(
    repo_id: str,
    *,
    token: SecretStr | None,
    endpoint: str | None = None,
    repo_type: str = "model",
) -> dict[str, Any]:
    """Ask the Hub, through ``huggingface_hub``, whether ``token`` can publish to ``repo_id``.

    Calls ``HfApi.whoami`` (user, token role, orgs with ``roleInOrg``, fine-grained
    ``repo.write`` scopes) and ``HfApi.auth_check(repo_id, write=True)`` — the Hub's own
    write check (``GET /api/{type}s/{id}/auth-check/write``). When that answers 404 the
    repo does not exist (or is invisible to this token) and the run would create it, so
    the namespace decides (``tasks.hf_auth.classify_write_access``).

    Args:
        repo_id: ``namespace/name``.
        token: the token the pod will publish with; None sends none.
        endpoint: Hub base URL; default ``https://huggingface.co``.
        repo_type: ``model`` or ``dataset``.

    Returns:
        ``{"kind": "hf_write_check", "repo_id", "endpoint", "token_present", "whoami",
        "write_check"}``; each answer is ``{"status", "error_code", "message", …}``.
        Never contains the token.

    Raises:
        SecretShapeError: the HTTP client refused the header made from the token.
    """
    base, secret, api = _hub(endpoint, token)
    evidence: dict[str, Any] = {
        "kind": "hf_write_check",
        "endpoint": base,
        "repo_id": repo_id,
        "repo_type": repo_type,
        "token_present": bool(secret),
        "whoami": None,
        "write_check": None,
    }
    if not secret:
        return evidence
    evidence["whoami"] = _who(api, secret)
    if evidence["whoami"]["status"] != 200:
        return evidence
    try:
        api.auth_check(repo_id, repo_type=repo_type, token=secret, write=True)
        evidence["write_check"] = {"status": 200, "error_code": None, "message": None}
    except Exception as exc:  # noqa: BLE001
        evidence["write_check"] = _answer_from_exception(exc, secret)
    return evidence


def hub_file_records(
    repo_id: str,
    paths: list[str],
    *,
    revision: str,
    token: SecretStr | None,
    endpoint: str | None = None,
    repo_type: str = "model",
    batch: int = 200,
) -> dict[str, dict[str, Any]]:
    """What the Hub records for each file at a revision, without downloading any of them
    (``HfApi.get_paths_info``: ``POST /api/{type}s/{id}/paths-info/{revision}``).

    Args:
        repo_id: ``namespace/name``.
        paths: repo paths to look up (absent ones are simply missing from the answer).
        revision: the commit id (or branch) to read.
        token: needed for a private repo.
        endpoint: Hub base URL.
        repo_type: ``model`` or ``dataset``.
        batch: paths per request.

    Returns:
        path → ``{"size": bytes, "blob_id": git blob id, "lfs_sha256": hex or None,
        "lfs_size": bytes or None}``.

    Raises:
        huggingface_hub.errors.HfHubHTTPError: the Hub refused or failed (the caller
            names the pod and the repo).
        SecretShapeError: the HTTP client refused the header made from the token.
    """
    from huggingface_hub.hf_api import RepoFile

    _, secret, api = _hub(endpoint, token)
    send: str | bool = secret or False
    out: dict[str, dict[str, Any]] = {}
    for i in range(0, len(paths), batch):
        with _REFUSED:
            answer = api.get_paths_info(
                repo_id, paths[i : i + batch], revision=revision, repo_type=repo_type, token=send
            )
        for item in answer:
            if isinstance(item, RepoFile):
                out[item.path] = {
                    "size": item.size,
                    "blob_id": item.blob_id,
                    "lfs_sha256": item.lfs.sha256 if item.lfs else None,
                    "lfs_size": item.lfs.size if item.lfs else None,
                }
    return out
