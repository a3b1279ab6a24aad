"""A loopback Hugging Face Hub that answers gated-repo questions like the real one.

It serves what the access diagnosis touches, with the status codes, ``X-Error-Code``
/ ``X-Error-Message`` headers and ``{"error": …}`` bodies the Hub sends
(huggingface_hub 2.4.0's ``hf_raise_for_status`` maps exceptions from those headers;
over plain ``http://127.0.0.1`` its URL-based 401 rule never fires, so the headers
must be there):

* ``GET /api/whoami-v2`` — the user and the token's role; fine-grained tokens carry
  ``auth.accessToken.fineGrained.canReadGatedRepos``.
* ``GET /api/{models,datasets}/{id}`` — 200 even for gated repos (as the Hub does).
* ``GET /api/{models,datasets}/{id}/auth-check`` — the gate.
* ``HEAD``/``GET /{id}/resolve/{rev}/{file}`` (and ``/datasets/{id}/…``) — the gate,
  then the file.
* ``GET /api/{models,datasets}/{id}/auth-check/write`` — whether the token may write.
* the publishing routes (repo create, branches, preupload, the LFS batch and uploads,
  commit, paths-info, ``model_info`` with ``blobs=True``): ``tests/emulators/hf_hub_write.py``.

Private repos answer ``RepoNotFound`` to anyone outside their namespace, as the Hub does.

Access is per user (as on the Hub): a repo lists which users were accepted, are
pending or were rejected. A fine-grained token without ``canReadGatedRepos`` gets
the 403 "enable access to public gated repositories" answer on gated repos. A repo
may be set to answer 401 instead of 403 to a valid token that never asked for access
(an answer seen from the Hub, not documented by it).

Every request lands in :attr:`HubEmulator.requests` with the Authorization header
redacted (only the configured user label is kept), so tests can prove that no
token text is ever stored.

Run standalone: ``python -m tests.emulators.hf_hub --port 8808 [--config cfg.json]``.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, unquote

from tests.emulators.hf_hub_write import HubFault, HubWriter, route_write

__all__ = ["HubEmulator", "HubFault", "HubRepo", "HubToken", "running_hub"]

Access = Literal["accepted", "pending", "rejected"]

_INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
_SCOPE_MESSAGE = (
    "Please enable access to public gated repositories in your fine-grained token "
    "settings to view this repository."
)


@dataclass
class HubToken:
    """A token the emulated Hub knows.

    Attributes:
        token: the secret text a client sends as ``Bearer <token>``.
        user: the account it belongs to (access to gated repos is per user).
        role: ``read``, ``write`` or ``fineGrained``.
        can_read_gated: fine-grained only — "Read access to contents of all public gated
            repos you can access".
        valid: False for a revoked token (answers 401 everywhere).
        orgs: organisation → the user's ``roleInOrg`` there (``admin``, ``write``,
            ``contributor``, ``read``), as ``whoami`` lists them.
        write_scopes: fine-grained only — the namespaces it has ``repo.write`` for.
    """

    token: str
    user: str
    role: Literal["read", "write", "fineGrained"] = "read"
    can_read_gated: bool = True
    valid: bool = True
    orgs: dict[str, str] = field(default_factory=dict)
    write_scopes: list[str] = field(default_factory=list)


@dataclass
class HubRepo:
    """A repository on the emulated Hub.

    Attributes:
        repo_id: ``namespace/name``.
        repo_type: ``model`` or ``dataset``.
        gated: True when users must be granted access.
        access: user → ``accepted`` / ``pending`` / ``rejected``; absent = never asked.
        files: file name → content bytes.
        unlisted_status: status for a valid token whose user never asked (403 on today's
            Hub; 401 reproduces the undocumented answer seen from some repos).
        private: visible only to its namespace (the user, or the org's members).
        commits / branches: commit id → files, branch → commit id (filled from ``files``
            on first use; see ``hf_hub_write.HubWriter``).
    """

    repo_id: str
    repo_type: Literal["model", "dataset"] = "model"
    gated: bool = False
    access: dict[str, Access] = field(default_factory=dict)
    files: dict[str, bytes] = field(
        default_factory=lambda: {"config.json": b'{"model_type": "demo"}'}
    )
    unlisted_status: int = 403
    sha: str = field(default_factory=lambda: uuid.uuid4().hex + uuid.uuid4().hex[:8])
    private: bool = False
    commits: dict[str, Any] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)


@dataclass
class _Answer:
    status: int
    error_code: str | None = None
    message: str | None = None


class HubEmulator:
    """The emulated Hub: a threaded HTTP server on 127.0.0.1 (free port).

    Use as a context manager, or :meth:`start` / :meth:`stop`. ``endpoint`` is the
    base URL to hand to ``HfApi(endpoint=…)`` or the pod-side check. ``writer`` holds
    the repos' contents and the publishing routes; ``writer.faults`` injects faults
    (a dropped upload, a 500) at named routes.

    Args:
        tokens / repos: what the Hub knows.
        **writer_options: ``lfs_threshold_bytes``, ``multipart_threshold_bytes``,
            ``part_bytes``, ``storage_dir`` for :class:`HubWriter`.
    """

    def __init__(
        self,
        tokens: list[HubToken] | None = None,
        repos: list[HubRepo] | None = None,
        **writer_options: Any,
    ):
        self.tokens: dict[str, HubToken] = {t.token: t for t in tokens or []}
        self.repos: dict[tuple[str, str], HubRepo] = {
            (r.repo_type, r.repo_id): r for r in repos or []
        }
        self.requests: list[dict[str, Any]] = []
        self.writer = HubWriter(self, **writer_options)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``; only valid once started."""
        if self._server is None:
            raise RuntimeError("the hub emulator is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self, port: int = 0) -> HubEmulator:
        """Bind 127.0.0.1:``port`` (0 = a free port) and serve in a daemon thread."""
        handler = type("_BoundHandler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="hf-hub-emulator", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.writer.close()

    def __enter__(self) -> HubEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_text(self) -> str:
        """The request log as one JSON string (what a leak test searches)."""
        with self._lock:
            return json.dumps(self.requests)

    # -- decisions --------------------------------------------------------------------
    def _who(self, authorization: str | None) -> tuple[HubToken | None, bool]:
        """(token, presented): the known valid token, and whether any was sent."""
        if not authorization:
            return None, False
        scheme, _, value = authorization.partition(" ")
        known = self.tokens.get(value.strip()) if scheme.lower() == "bearer" else None
        return (known if known is not None and known.valid else None), True

    def can_read(self, repo: HubRepo, token: HubToken | None) -> bool:
        """A private repo is visible to its namespace only (the user, or org members)."""
        if not repo.private:
            return True
        namespace = repo.repo_id.split("/", 1)[0]
        return token is not None and (namespace == token.user or namespace in token.orgs)

    def gate(self, repo: HubRepo | None, token: HubToken | None, presented: bool) -> _Answer:
        """What the Hub answers for a repo's content given the caller's token."""
        if presented and token is None:
            return _Answer(401, None, _INVALID_CREDENTIALS)
        if repo is None or not self.can_read(repo, token):
            return _Answer(404 if token else 401, "RepoNotFound", "Repository not found")
        if not repo.gated:
            return _Answer(200)
        kind = repo.repo_type
        if token is None:
            return _Answer(
                401,
                "GatedRepo",
                f"Access to {kind} {repo.repo_id} is restricted. You must have access to it "
                "and be authenticated to access it. Please log in.",
            )
        if token.role == "fineGrained" and not token.can_read_gated:
            return _Answer(403, None, _SCOPE_MESSAGE)
        state = repo.access.get(token.user)
        if state == "accepted":
            return _Answer(200)
        if state == "pending":
            return _Answer(
                403,
                "GatedRepo",
                f"Your request to access {kind} {repo.repo_id} is awaiting a review from the "
                "repo authors.",
            )
        if state == "rejected":
            return _Answer(
                403,
                "GatedRepo",
                f"Your request to access {kind} {repo.repo_id} has been rejected by the repo's "
                "authors.",
            )
        if repo.unlisted_status == 401:
            return _Answer(
                401,
                "GatedRepo",
                f"Access to {kind} {repo.repo_id} is restricted. You must have access to it "
                "and be authenticated to access it. Please log in.",
            )
        return _Answer(
            403,
            "GatedRepo",
            f"Access to {kind} {repo.repo_id} is restricted and you are not in the authorized "
            f"list. Visit https://huggingface.co/{repo.repo_id} to ask for access.",
        )

    def whoami(self, token: HubToken) -> dict[str, Any]:
        """The ``/api/whoami-v2`` body for a valid token (shape of the real Hub's)."""
        access: dict[str, Any] = {
            "displayName": f"{token.user}-token",
            "role": token.role,
            "createdAt": "2025-01-01T00:00:00.000Z",
        }
        if token.role == "fineGrained":
            entities = [token.user, *[o for o in token.write_scopes if o != token.user]]
            access["fineGrained"] = {
                "canReadGatedRepos": token.can_read_gated,
                "global": ["discussion.write", "post.write"],
                "scoped": [
                    {
                        "entity": {
                            "_id": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
                            "type": "user" if name == token.user else "org",
                            "name": name,
                        },
                        "permissions": ["repo.content.read"]
                        + (["repo.write"] if name in token.write_scopes else []),
                    }
                    for name in entities
                ],
            }
        orgs = [
            {
                "type": "org",
                "id": uuid.uuid5(uuid.NAMESPACE_DNS, org).hex[:24],
                "name": org,
                "fullname": org.title(),
                "roleInOrg": role,
            }
            for org, role in sorted(token.orgs.items())
        ]
        return {
            "type": "user",
            "id": uuid.uuid5(uuid.NAMESPACE_DNS, token.user).hex[:24],
            "name": token.user,
            "fullname": token.user.title(),
            "email": f"{token.user}@example.com",
            "emailVerified": True,
            "canPay": False,
            "isPro": False,
            "orgs": orgs,
            "auth": {"type": "access_token", "accessToken": access},
        }

    def _record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)


_API_REPO = re.compile(
    r"^/api/(models|datasets)/([^/]+/[^/]+)"
    r"(?:/(auth-check(?:/write)?|revision|preupload|commit|paths-info|branch)(?:/(.+))?)?/?$"
)
_RESOLVE = re.compile(r"^/(?:(datasets)/)?(.+?)/resolve/([^/]+)/(.+)$")
_CHUNK_BYTES = 1 << 20


class _Dropped(Exception):
    """A fault closed the connection: no answer is sent."""


class _Handler(BaseHTTPRequestHandler):
    hub: HubEmulator
    protocol_version = "HTTP/1.1"
    server_version = "hf-hub-emulator"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        """Silence the default stderr access log (the hub keeps its own, redacted)."""

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._dispatch(head=False)

    def do_HEAD(self) -> None:  # noqa: N802 - stdlib name
        self._dispatch(head=True)

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self._dispatch(head=False)

    def do_PUT(self) -> None:  # noqa: N802 - stdlib name
        self._dispatch(head=False)

    # -- request bodies ---------------------------------------------------------------
    def _body_chunks(self):  # type: ignore[no-untyped-def]
        """Yield the request body in pieces (Content-Length or chunked framing)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return
                left = size
                while left:
                    piece = self.rfile.read(min(left, _CHUNK_BYTES))
                    if not piece:
                        return
                    left -= len(piece)
                    yield piece
                self.rfile.readline()
        left = int(self.headers.get("Content-Length") or 0)
        while left > 0:
            piece = self.rfile.read(min(left, _CHUNK_BYTES))
            if not piece:
                return
            left -= len(piece)
            yield piece

    def _body(self) -> bytes:
        return b"".join(self._body_chunks())

    def _json(self) -> Any:
        data = self._body()
        return json.loads(data) if data.strip() else {}

    def _receive(self, route: str, path: Any) -> None:
        """Stream the body into ``path``; a ``drop`` fault on ``route`` cuts it off."""
        fault = self.hub.writer.fault(route)
        if fault is not None and fault.action == "status":
            self._body()
            raise _StatusFault(fault.status)
        got = 0
        with open(path, "wb") as out:
            for piece in self._body_chunks():
                if fault is not None and got + len(piece) >= fault.after_bytes:
                    out.write(piece[: max(0, fault.after_bytes - got)])
                    self.hub.writer.count_bytes(route, fault.after_bytes - got)
                    self._drop()
                out.write(piece)
                got += len(piece)
                self.hub.writer.count_bytes(route, len(piece))
        if fault is not None:  # the body ended before the cut-off point
            self._drop()

    def _drop(self) -> None:
        self.close_connection = True
        with suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
        raise _Dropped()

    def _dispatch(self, head: bool) -> None:
        hub = self.hub
        token, presented = hub._who(self.headers.get("Authorization"))
        path = self.path.split("?", 1)[0]
        entry: dict[str, Any] = {
            "method": self.command,
            "path": path,
            "authorization": ("Bearer <redacted>" if presented else None),
            "user": token.user if token else None,
        }
        try:
            if self.command in ("POST", "PUT"):
                answer, body, extra = self._route_write(path, token, presented)
            else:
                answer, body, extra = self._route(path, token, presented, head)
        except _Dropped:
            entry["status"] = "dropped"
            hub._record(entry)
            return
        except _StatusFault as fault:
            answer, body, extra = _Answer(fault.status, None, "Internal Error"), b"", {}
        entry["status"] = answer.status
        entry["error_code"] = answer.error_code
        hub._record(entry)
        self._send(answer, body, extra, head)

    def _route_write(
        self, path: str, token: HubToken | None, presented: bool
    ) -> tuple[_Answer, bytes, dict[str, str]]:
        """POST and PUT: the publishing routes (``hf_hub_write.route_write``)."""
        return route_write(self, path, token, presented)

    def _route(
        self, path: str, token: HubToken | None, presented: bool, head: bool
    ) -> tuple[_Answer, bytes, dict[str, str]]:
        hub = self.hub
        if path == "/api/whoami-v2":
            if token is None:
                return _Answer(401, None, _INVALID_CREDENTIALS), b"", {}
            return _Answer(200), json.dumps(hub.whoami(token)).encode(), {}
        match = _API_REPO.match(path)
        if match and match.group(3) in (None, "revision", "auth-check", "auth-check/write"):
            kind = "model" if match.group(1) == "models" else "dataset"
            repo = hub.repos.get((kind, match.group(2)))
            if match.group(3) == "auth-check":
                answer = hub.gate(repo, token, presented)
                return answer, (b'{"ok": true}' if answer.status == 200 else b""), {}
            if match.group(3) == "auth-check/write":
                refused = hub.writer._write_refusal(repo, token)
                answer = refused or _Answer(200)
                return answer, (b'{"ok": true}' if answer.status == 200 else b""), {}
            if presented and token is None:
                return _Answer(401, None, _INVALID_CREDENTIALS), b"", {}
            if repo is None or not hub.can_read(repo, token):
                return (
                    _Answer(404 if token else 401, "RepoNotFound", "Repository not found"),
                    b"",
                    {},
                )
            rev = unquote(match.group(4) or "main")
            if hub.writer.tree(repo, rev) is None:
                return _Answer(404, "RevisionNotFound", f"Invalid rev id: {rev}"), b"", {}
            query = parse_qs(self.path.partition("?")[2])
            blobs = (query.get("blobs") or ["false"])[0].lower() == "true"
            info = {
                "_id": repo.sha[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.branches.get(rev, rev),
                "private": repo.private,
                "gated": "manual" if repo.gated else False,
                "siblings": hub.writer.siblings(repo, rev, blobs),
            }
            return _Answer(200), json.dumps(info).encode(), {}
        match = _RESOLVE.match(path)
        if match:
            kind = "dataset" if match.group(1) else "model"
            repo = hub.repos.get((kind, match.group(2)))
            answer = hub.gate(repo, token, presented)
            if answer.status != 200 or repo is None:
                return answer, b"", {}
            rev = unquote(match.group(3))
            stored = (hub.writer.tree(repo, rev) or {}).get(unquote(match.group(4)))
            commit = repo.branches.get(rev, rev)
            if stored is None:
                return (
                    _Answer(404, "EntryNotFound", "Entry not found"),
                    b"",
                    {"X-Repo-Commit": commit},
                )
            headers = {
                "ETag": f'"{stored.sha256 if stored.lfs else stored.blob_id}"',
                "X-Repo-Commit": commit,
                "Content-Type": "application/octet-stream",
            }
            return answer, hub.writer.content(stored), headers
        return _Answer(404, None, "Not Found"), b"", {}

    def _send(self, answer: _Answer, body: bytes, extra: dict[str, str], head: bool) -> None:
        if answer.status >= 400:
            payload: dict[str, Any] = {}
            if body:
                extra_fields = json.loads(body)  # e.g. the "url" of a 409 on repo create
                payload.update(extra_fields if isinstance(extra_fields, dict) else {})
            payload["error"] = answer.message
            body = json.dumps(payload).encode()
        self.send_response(answer.status)
        self.send_header("X-Request-Id", f"Root={uuid.uuid4().hex}")
        if answer.error_code:
            self.send_header("X-Error-Code", answer.error_code)
        if answer.message and answer.status >= 400:
            self.send_header("X-Error-Message", answer.message)
        for key, value in extra.items():
            self.send_header(key, value)
        if "Content-Type" not in extra:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


class _StatusFault(Exception):
    """A ``status`` fault: answer with this status instead of handling the request."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def _dump(data: Any) -> bytes:
    return b"" if data is None else json.dumps(data).encode()


@contextmanager
def running_hub(
    tokens: list[HubToken] | None = None, repos: list[HubRepo] | None = None, **writer_options: Any
) -> Iterator[HubEmulator]:
    """Serve a :class:`HubEmulator` for the duration of a ``with`` block."""
    hub = HubEmulator(tokens, repos, **writer_options)
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


def _from_config(config: dict[str, Any], **writer_options: Any) -> HubEmulator:
    tokens = [HubToken(**t) for t in config.get("tokens", [])]
    repos = []
    for r in config.get("repos", []):
        r = dict(r)
        r["files"] = {k: v.encode() for k, v in r.get("files", {"config.json": "{}"}).items()}
        repos.append(HubRepo(**r))
    return HubEmulator(tokens, repos, **writer_options)


_DEMO_CONFIG: dict[str, Any] = {
    "tokens": [
        {"token": "hf_demo_classic_read", "user": "alice", "role": "read"},
        {
            "token": "hf_demo_finegrained_nogated",
            "user": "alice",
            "role": "fineGrained",
            "can_read_gated": False,
        },
        {"token": "hf_demo_revoked", "user": "alice", "valid": False},
        # publishes to demo/… (prefect-runpod finetune --publish hf:demo/tiny-classifier)
        {"token": "hf_demo_write", "user": "alice", "role": "write", "orgs": {"demo": "write"}},
    ],
    "repos": [
        {"repo_id": "demo/public-model"},
        {"repo_id": "demo/gated-accepted", "gated": True, "access": {"alice": "accepted"}},
        {"repo_id": "demo/gated-unrequested", "gated": True},
        {"repo_id": "demo/gated-pending", "gated": True, "access": {"alice": "pending"}},
        {"repo_id": "demo/gated-rejected", "gated": True, "access": {"alice": "rejected"}},
    ],
}


def main(argv: list[str] | None = None) -> None:
    """Serve the emulator in the foreground until interrupted."""
    parser = argparse.ArgumentParser(description="Loopback Hugging Face Hub emulator.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--config", help="JSON file with 'tokens' and 'repos' lists")
    parser.add_argument(
        "--lfs-threshold-bytes",
        type=int,
        default=10 * 1024 * 1024,
        help="files this large or larger are stored in LFS (default 10 MiB, the Hub's rule)",
    )
    args = parser.parse_args(argv)
    config = _DEMO_CONFIG
    if args.config:
        with open(args.config, encoding="utf-8") as fh:
            config = json.load(fh)
    hub = _from_config(config, lfs_threshold_bytes=args.lfs_threshold_bytes).start(args.port)
    print(json.dumps({"endpoint": hub.endpoint}), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
