"""Why Hugging Face access fails, decided from evidence, pure
(docs/architecture.md#env-fix-and-hugging-face-diagnosis).

:func:`classify_hf_access` is the one decision table for reading a repo, used for both
places a download can run — locally in preflight and on the pod in the ``hf_auth``
stage (:mod:`prefect_runpod.tasks.hf_auth` collects the evidence there);
:func:`diagnose_evidence` turns an evidence dict into an :class:`HFDiagnosis` with it.

Evidence comes first (status, ``X-Error-Code``, the server's message — strings as the
Hub sends them, see huggingface_hub 2.4.0 ``hf_raise_for_status``). The usual rule
of thumb — 401 means the licence was not accepted, 403 means the token lacks the
gated-repo scope — decides only when the message is not one we recognise, and the
diagnosis is then flagged ``recognised=False``.

Publishing asks the other question — may this token write there? —
:func:`classify_write_access` answers it from ``whoami`` and the Hub's own write check
(``blocks/huggingface.collect_write_evidence``), with the cause ``no_write_access``
when the token is read-only, the namespace is not the user's, or the user's role in
the organisation does not allow writing (docs/architecture.md#publish-from-the-pod).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from prefect_runpod.tasks.models import HFCause, HFDiagnosis

__all__ = [
    "HF_WEB",
    "TOKENS_URL",
    "WRITE_TOKEN_URL",
    "classify_hf_access",
    "classify_write_access",
    "diagnose_evidence",
    "place_words",
]

HF_WEB = "https://huggingface.co"
"""Where people act on a remediation (licence pages, token settings)."""
TOKENS_URL = f"{HF_WEB}/settings/tokens"
WRITE_TOKEN_URL = f"{HF_WEB}/settings/tokens/new?tokenType=write"
"""Where a write token is made (the token page's ``tokenType`` preset)."""
_ORG_WRITE_ROLES = ("admin", "write", "contributor")
"""``roleInOrg`` values that may create repos in an organisation (the Hub's org roles:
read < contributor < write < admin)."""
_STATUS_URL = "https://status.huggingface.co"

# Server phrases, lower-cased (reference: the Hub's gated-repo answers).
_SCOPE_PHRASE = "enable access to public gated repositories"
_UNLISTED_PHRASE = "not in the authorized list"
_PENDING_PHRASE = "awaiting a review"
_REJECTED_PHRASE = "has been rejected"
_INVALID_PHRASES = ("invalid credentials", "invalid username or password", "invalid user token")


def _remedy(
    cause: HFCause,
    repo_id: str | None,
    where: str,
    user: str | None,
    unreachable: str | None = None,
) -> tuple[str, str]:
    repo_url = f"{HF_WEB}/{repo_id}" if repo_id else HF_WEB
    if unreachable is not None:
        return (
            f"Cannot reach {unreachable} from {place_words(where)}: check the network (DNS, proxy, "
            "firewall) and the Hub endpoint (--hf-endpoint), then run again.",
            _STATUS_URL,
        )
    who = f" as {user}" if user else ""
    if cause == HFCause.OK:
        return "Access works; nothing to do.", repo_url
    if cause == HFCause.NO_TOKEN:
        return (
            f"No Hugging Face token is set where the download runs ({place_words(where)}); create a read "
            "token and put it in the HuggingFaceCredentials block (it reaches the pod as HF_TOKEN).",
            TOKENS_URL,
        )
    if cause == HFCause.INVALID_TOKEN:
        return (
            "The Hub refused the token itself (revoked, expired or mistyped); create a new "
            "token and update the HuggingFaceCredentials block.",
            TOKENS_URL,
        )
    if cause == HFCause.LICENCE_NOT_ACCEPTED:
        return (
            f"Open {repo_url}, sign in{who} and accept the licence "
            '("Agree and access repository"), then run again.',
            repo_url,
        )
    if cause == HFCause.TOKEN_SCOPE:
        return (
            "The token cannot read gated repos: edit the fine-grained token and enable "
            '"Read access to contents of all public gated repos you can access" '
            "(or use a classic read token).",
            TOKENS_URL,
        )
    if cause == HFCause.ACCESS_PENDING:
        return (
            f"Your access request for {repo_id} is waiting for the authors' review; run again "
            "once it is approved (the repo page shows the status).",
            repo_url,
        )
    if cause == HFCause.ACCESS_REJECTED:
        return (
            f"The authors of {repo_id} rejected your access request; contact them from the "
            "repo page or choose another model.",
            repo_url,
        )
    if cause == HFCause.REPO_NOT_FOUND:
        return (
            f"No repo {repo_id!r} is visible with this token: check the id and revision, and "
            "for a private repo use a token of an account that can see it.",
            repo_url,
        )
    if cause == HFCause.NO_WRITE_ACCESS:
        return (
            f"The token{who} cannot write to {repo_id}: use a write token (or a fine-grained "
            "one with repo.write on that namespace) in the HuggingFaceCredentials block.",
            WRITE_TOKEN_URL,
        )
    return (
        "The Hub answered unexpectedly; retry, and run with HF_DEBUG=1 to see each request "
        "(tokens redacted).",
        _STATUS_URL,
    )


def _read_cause(
    status: int | None,
    code: str | None,
    text: str,
    token_present: bool,
    token_valid: bool | None,
    token_can_read_gated: bool | None,
) -> tuple[HFCause, bool]:
    """The cause the table in :func:`classify_hf_access` gives the evidence, and
    whether the answer was recognised (``text``: the server's message, lower-cased)."""
    recognised = True
    if status is not None and (status < 400 or (status == 404 and code == "EntryNotFound")):
        cause = HFCause.OK
    elif not token_present and status in (401, 403) and code != "RepoNotFound":
        cause = HFCause.NO_TOKEN
    elif token_present and (
        token_valid is False or (status == 401 and any(p in text for p in _INVALID_PHRASES))
    ):
        cause = HFCause.INVALID_TOKEN
    elif status == 404 or code == "RepoNotFound":
        cause = HFCause.REPO_NOT_FOUND
    elif _SCOPE_PHRASE in text or (status == 403 and token_can_read_gated is False):
        cause = HFCause.TOKEN_SCOPE
    elif _PENDING_PHRASE in text:
        cause = HFCause.ACCESS_PENDING
    elif _REJECTED_PHRASE in text:
        cause = HFCause.ACCESS_REJECTED
    elif (
        status == 403
        and code == "GatedRepo"
        and _UNLISTED_PHRASE in text
        or status == 401
        and code == "GatedRepo"
        and token_present
    ):
        cause = HFCause.LICENCE_NOT_ACCEPTED
    elif status == 401:
        cause, recognised = HFCause.LICENCE_NOT_ACCEPTED, False
    elif status == 403:
        cause, recognised = HFCause.TOKEN_SCOPE, False
    else:
        cause, recognised = HFCause.UNKNOWN, False
    return cause, recognised


def classify_hf_access(
    *,
    repo_id: str | None,
    status: int | None,
    error_code: str | None = None,
    message: str | None = None,
    token_present: bool,
    token_valid: bool | None = None,
    token_can_read_gated: bool | None = None,
    where: str = "local",
    user: str | None = None,
    endpoint: str | None = None,
) -> HFDiagnosis:
    """Decide why a request to a repo failed (or that it works). Pure.

    The table (docs/architecture.md#env-fix-and-hugging-face-diagnosis), evidence first:

    ==============================================  ==========================
    evidence                                        cause
    ==============================================  ==========================
    2xx/3xx, or 404 ``EntryNotFound`` (repo access  ``ok``
    fine, only that file is missing)
    401/403 and no token where the request runs     ``no_token``
    ``whoami`` 401 / "Invalid credentials…"         ``invalid_token``
    404 or ``RepoNotFound``                         ``repo_not_found``
    "enable access to public gated repositories",   ``token_scope``
    or 403 for a fine-grained token whose whoami
    says ``canReadGatedRepos: false``
    "awaiting a review"                             ``access_pending``
    "has been rejected"                             ``access_rejected``
    403 GatedRepo "not in the authorized list"      ``licence_not_accepted``
    401 GatedRepo with a token valid here           ``licence_not_accepted``
    other 401 / 403                                 fallback: 401 → licence,
                                                    403 → scope, unrecognised
    anything else (5xx, 429, unreachable)           ``unknown``
    ==============================================  ==========================

    With no HTTP answer at all (``status`` None) the remediation says which host
    could not be reached, never that the Hub answered.

    Args:
        repo_id: the repo checked.
        status: HTTP status of the decisive request; None when the Hub was unreachable.
        error_code: the ``X-Error-Code`` header.
        message: the server's message (``X-Error-Message`` or body ``error``).
        token_present: whether a token was sent.
        token_valid: ``whoami`` outcome — True (200), False (401), None (not asked/unknown).
        token_can_read_gated: a fine-grained token's ``canReadGatedRepos``; None otherwise.
        where: ``local`` or ``pod``.
        user: the account the token belongs to, for the remediation text.
        endpoint: the Hub URL asked, named when it could not be reached.

    Returns:
        An :class:`HFDiagnosis` carrying the evidence and one remediation + URL.
    """
    code = error_code or None
    cause, recognised = _read_cause(
        status, code, (message or "").lower(), token_present, token_valid, token_can_read_gated
    )
    unreachable = None
    if cause == HFCause.UNKNOWN and status is None:
        host = urlsplit(endpoint or HF_WEB).netloc or (endpoint or HF_WEB)
        unreachable = f"{host}" + (f" ({message})" if message else "")
    remediation, url = _remedy(cause, repo_id, where, user, unreachable)
    if not recognised and cause != HFCause.UNKNOWN and unreachable is None:
        remediation = (
            f"Unrecognised answer; by the usual rule (401 → licence, 403 → token scope): "
            f"{remediation}"
        )
    return HFDiagnosis(
        repo_id=repo_id,
        cause=cause,
        where="pod" if where == "pod" else "local",
        http_status=status,
        error_code=code,
        server_message=message,
        recognised=recognised,
        remediation=remediation,
        remediation_url=url,
    )


def diagnose_evidence(evidence: Mapping[str, Any], *, where: str = "local") -> HFDiagnosis:
    """Turn an ``hf_check`` evidence dict into a diagnosis. Pure.

    The decisive answer is the first failure among auth-check then the file HEAD; when
    both pass the repo is readable. ``whoami`` supplies token validity and scope.

    Args:
        evidence: the dict printed by ``hf_check.py`` or built by
            :func:`~prefect_runpod.blocks.huggingface.collect_access_evidence`.
        where: ``local`` or ``pod``.

    Returns:
        An :class:`HFDiagnosis`.
    """
    who = evidence.get("whoami") or {}
    token_present = bool(evidence.get("token_present"))
    token_valid: bool | None = None
    if who.get("status") == 200:
        token_valid = True
    elif who.get("status") == 401:
        token_valid = False
    decisive = evidence.get("auth_check") or {}
    file_answer = evidence.get("file")
    if decisive.get("status") is not None and decisive["status"] < 400 and file_answer:
        decisive = file_answer
    if token_valid is False and (decisive.get("status") or 0) < 400:
        decisive = who  # a refused token is the finding even if the repo is public
    return classify_hf_access(
        repo_id=evidence.get("repo_id"),
        status=decisive.get("status"),
        error_code=decisive.get("error_code"),
        message=decisive.get("message"),
        token_present=token_present,
        token_valid=token_valid,
        token_can_read_gated=who.get("can_read_gated"),
        where=where,
        user=who.get("user"),
        endpoint=evidence.get("endpoint"),
    )


def classify_write_access(evidence: Mapping[str, Any]) -> HFDiagnosis:
    """Decide whether a token may publish to a repo. Pure.

    ==============================================  ==========================
    evidence                                        cause
    ==============================================  ==========================
    no token                                        ``no_token``
    ``whoami`` 401                                  ``invalid_token``
    the Hub's write check (``auth-check/write``)    ``ok``
    answers 200 (the repo exists, writable)
    it answers 403                                  ``no_write_access``
    it answers 404 (the run creates the repo) and:
      a ``read`` token                              ``no_write_access``
      namespace = the token's user, or an org       ``ok``
      where ``roleInOrg`` is admin/write/
      contributor (fine-grained: with
      ``repo.write`` on that namespace)
      any other namespace                           ``no_write_access``
    anything else (5xx, unreachable)                ``unknown``
    ==============================================  ==========================

    Args:
        evidence: the dict of ``blocks.huggingface.collect_write_evidence``.

    Returns:
        An :class:`HFDiagnosis` (``where="local"``) with one remediation and its URL.
    """
    repo_id = evidence.get("repo_id")
    namespace = str(repo_id or "").split("/", 1)[0]
    who = evidence.get("whoami") or {}
    check = evidence.get("write_check") or {}
    answer = check if check else who
    user, role = who.get("user"), who.get("role")
    orgs = who.get("orgs") or {}
    remedy: tuple[str, str] | None = None
    recognised = True
    if not evidence.get("token_present"):
        cause = HFCause.NO_TOKEN
        remedy = (
            "Publishing needs a Hugging Face write token where the flow runs: put one in "
            "the HuggingFaceCredentials block (it reaches the pod hidden, as HF_TOKEN).",
            WRITE_TOKEN_URL,
        )
    elif who.get("status") == 401:
        cause = HFCause.INVALID_TOKEN
    elif who.get("status") != 200:
        cause, recognised = HFCause.UNKNOWN, False
    elif check.get("status") == 200:
        cause = HFCause.OK
    elif check.get("status") == 403:
        cause = HFCause.NO_WRITE_ACCESS
    elif check.get("status") == 404:
        fine = role == "fineGrained"
        scoped = namespace in (who.get("write_scopes") or [])
        member = namespace == user or orgs.get(namespace) in _ORG_WRITE_ROLES
        if member and (role == "write" or (fine and scoped)):
            cause = HFCause.OK
            answer = {}
        else:
            cause = HFCause.NO_WRITE_ACCESS
            if role != "read" and not member:
                remedy = (
                    f"The repo {repo_id} does not exist and the token{f' of {user}' if user else ''} "
                    f"cannot create repos under {namespace!r} (not its user, and no admin/"
                    f"write/contributor role there): publish under your own namespace "
                    f"(hf:{user or 'USER'}/…) or ask an admin of {namespace} for the write role.",
                    f"{HF_WEB}/{namespace}",
                )
    else:
        cause, recognised = HFCause.UNKNOWN, False
    unreachable = None
    if cause == HFCause.UNKNOWN and answer.get("status") is None:
        host = urlsplit(str(evidence.get("endpoint") or HF_WEB)).netloc or HF_WEB
        message = answer.get("message")
        unreachable = host + (f" ({message})" if message else "")
    text, url = remedy or _remedy(cause, repo_id, "local", user, unreachable)
    return HFDiagnosis(
        repo_id=repo_id,
        cause=cause,
        where="local",
        http_status=answer.get("status"),
        error_code=answer.get("error_code"),
        server_message=answer.get("message"),
        recognised=recognised,
        remediation=text,
        remediation_url=url,
    )


def place_words(where: str) -> str:
    """Where a check ran, as a sentence says it: ``"local"`` -> "this machine", ``"pod"`` ->
    "the pod" (any other value as given)."""
    return {"local": "this machine", "pod": "the pod"}.get(where, where)
