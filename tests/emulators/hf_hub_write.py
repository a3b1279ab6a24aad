"""The write side of the loopback Hub: repos with commits and branches, an LFS store, and
the routes ``huggingface_hub`` calls to publish (``create_repo``, ``create_branch``,
``create_commit`` / ``upload_folder`` on the non-Xet path, ``get_paths_info``,
``model_info(files_metadata=True)``).

Routes, as huggingface_hub 2.4.0 sends them (``hf_api.py``, ``_commit_api.py``,
``lfs.py``):

* ``POST /api/repos/create`` — JSON ``{name, organization, visibility | private, type}``.
* ``POST /api/{models,datasets}/{id}/branch/{branch}`` — JSON ``{startingPoint?}``.
* ``POST /api/{type}s/{id}/preupload/{rev}`` — JSON ``{files: [{path, sample, size}]}`` →
  ``{files: [{path, uploadMode, shouldIgnore, oid?}]}``; ``oid`` is the file already at
  that path (sha256 for LFS, git blob sha1 for regular), so unchanged files are skipped.
* ``POST /{id}.git/info/lfs/objects/batch`` (``/datasets/{id}.git/…``) — the git-lfs batch
  API: objects already stored come back without ``actions`` (nothing to send again);
  others get a ``basic`` upload URL, or ``multipart`` part URLs plus ``chunk_size`` in
  the action's ``header`` when larger than ``multipart_threshold_bytes``.
* ``PUT /lfs-upload/{oid}`` (basic), ``PUT /lfs-upload/{oid}/part/{n}`` (answers an
  ``ETag``), ``POST /lfs-upload/{oid}`` (multipart completion ``{oid, parts}``). The
  store hashes what it receives and refuses an object whose sha256 or size differs.
* ``POST /api/{type}s/{id}/commit/{rev}`` — NDJSON: ``header``, ``file`` (base64
  content), ``lfsFile`` (``{path, algo, oid, size}``), ``deletedFile`` →
  ``{commitUrl, commitOid, success}``.
* ``POST /api/{type}s/{id}/paths-info/{rev}`` — form ``paths=…&expand=…`` → one record
  per existing path: ``{type, path, size, oid}`` plus ``lfs: {oid, size, pointerSize}``
  for LFS files (``oid`` of an LFS file is the blob id of its pointer, as in git).

**Regular or LFS — the stated rule.** A file of ``lfs_threshold_bytes`` or more
(default 10 MiB, the Hub's documented "files larger than 10MB go to LFS") is stored in
LFS, anything smaller as a regular blob. The real Hub also sends binary files and
``.gitattributes`` patterns to LFS; that is not emulated.

**Who may write** (the Hub's rules as its answers show them): a ``read`` token nowhere;
a ``write`` token in its user's namespace and in orgs where ``whoami`` lists the user
with ``roleInOrg`` ``admin``, ``write`` or ``contributor``; a fine-grained token only
in the namespaces it has ``repo.write`` for.

Refusals carry the Hub's status codes and messages. Sourced: the 403 from
``/api/repos/create`` "You don't have the rights to create a model under the namespace
"X"" (huggingface/deep-rl-class#508) and the 403 on the LFS batch URL
(deep-rl-class#506), ``RepoNotFound`` 404 for a missing repo. Texts marked INFERRED
below are our wording where no public source gives the Hub's exact one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

if TYPE_CHECKING:
    from tests.emulators.hf_hub import HubEmulator, HubRepo, HubToken, _Answer, _Handler

__all__ = ["HubFault", "HubWriter", "StoredFile", "git_blob_id", "lfs_pointer", "route_write"]

_LFS_BATCH = re.compile(r"^/(?:(datasets)/)?([^/]+/[^/]+)\.git/info/lfs/objects/batch$")
_LFS_UPLOAD = re.compile(r"^/lfs-upload/([0-9a-f]{64})(?:/part/(\d+))?$")
_WRITE_ACTIONS = ("preupload", "commit", "paths-info", "branch")

MiB = 1024 * 1024
_WRITE_ROLES = ("admin", "write", "contributor")
# INFERRED: the Hub's wording for a token that may read but not write a repo.
_NO_WRITE = "You don't have the rights to write to the repository {repo_id}"
# INFERRED: the answer to a commit naming an LFS object that was never uploaded.
_LFS_MISSING = "Your push was rejected because an LFS pointer pointed to a file that does not exist"
# INFERRED: a branch that does not exist.
_NO_REVISION = "Invalid rev id: {rev}"
_EXISTS = "You already created this model repo"  # the 409 body huggingface_hub tolerates


def git_blob_id(data: bytes) -> str:
    """git's object id of a blob: ``sha1(b"blob <size>\\0" + data)``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git stores in place of an LFS object."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


@dataclass
class StoredFile:
    """One file in a commit: ``lfs`` files keep their bytes in the LFS store."""

    size: int
    sha256: str
    lfs: bool
    content: bytes | None = None  # regular files only

    @property
    def blob_id(self) -> str:
        """The git blob id the Hub reports (``oid``): of the content, or of the pointer."""
        if self.lfs:
            return git_blob_id(lfs_pointer(self.sha256, self.size))
        return git_blob_id(self.content or b"")


@dataclass
class HubFault:
    """A fault on a named route, fired on its ``nth`` call (1-based) and once only.

    Attributes:
        route: ``lfs_put`` (a basic upload), ``lfs_part`` (a multipart part), ``commit``,
            ``preupload`` or ``batch``.
        nth: which call of that route fires it.
        action: ``drop`` (read ``after_bytes`` of the body, then close the connection
            without answering — a dropped link) or ``status`` (answer ``status``).
        after_bytes: for ``drop``.
        status: for ``status`` (e.g. 500).
    """

    route: str
    nth: int = 1
    action: str = "drop"
    after_bytes: int = 0
    status: int = 500
    fired: bool = False


class HubWriter:
    """Repo contents, the LFS store and the write routes of one :class:`HubEmulator`.

    Args:
        hub: the emulator (tokens, repos, endpoint).
        lfs_threshold_bytes: files this large or larger are stored in LFS.
        multipart_threshold_bytes / part_bytes: LFS objects above the threshold are
            uploaded in parts of ``part_bytes``.
        storage_dir: where LFS objects are kept (a temporary folder by default).
    """

    def __init__(
        self,
        hub: HubEmulator,
        *,
        lfs_threshold_bytes: int = 10 * MiB,
        multipart_threshold_bytes: int = 64 * MiB,
        part_bytes: int = 16 * MiB,
        storage_dir: Path | None = None,
    ):
        self.hub = hub
        self.lfs_threshold_bytes = lfs_threshold_bytes
        self.multipart_threshold_bytes = multipart_threshold_bytes
        self.part_bytes = part_bytes
        self._own_dir = storage_dir is None
        self.dir = Path(storage_dir or tempfile.mkdtemp(prefix="hub-lfs-"))
        self.faults: list[HubFault] = []
        self.calls: dict[str, int] = {}
        self.received_bytes: dict[str, int] = {}  # route → body bytes read
        self._lock = threading.Lock()

    def close(self) -> None:
        """Remove the LFS store when it is the writer's own."""
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- state ------------------------------------------------------------------------
    def tree(self, repo: HubRepo, rev: str) -> dict[str, StoredFile] | None:
        """The files of ``repo`` at a branch or commit id; None when unknown."""
        if not repo.commits:
            repo.commits[repo.sha] = {
                name: self._stored(data) for name, data in sorted(repo.files.items())
            }
            repo.branches.setdefault("main", repo.sha)
        oid = repo.branches.get(rev, rev)
        return repo.commits.get(oid)

    def _stored(self, data: bytes) -> StoredFile:
        sha = hashlib.sha256(data).hexdigest()
        if len(data) >= self.lfs_threshold_bytes:
            self._lfs_path(sha).write_bytes(data)
            return StoredFile(len(data), sha, True)
        return StoredFile(len(data), sha, False, data)

    def content(self, stored: StoredFile) -> bytes:
        """A stored file's bytes."""
        if stored.lfs:
            return self._lfs_path(stored.sha256).read_bytes()
        return stored.content or b""

    def _lfs_path(self, sha256: str) -> Path:
        return self.dir / sha256

    def has_object(self, sha256: str, size: int) -> bool:
        """Whether the LFS store holds that object, whole."""
        path = self._lfs_path(sha256)
        return path.is_file() and path.stat().st_size == size

    def can_write(self, token: HubToken | None, namespace: str) -> bool:
        """The Hub's write rule (module docstring)."""
        if token is None or token.role == "read":
            return False
        member = namespace == token.user or token.orgs.get(namespace) in _WRITE_ROLES
        if token.role == "fineGrained":
            return member and namespace in token.write_scopes
        return member

    def fault(self, route: str) -> HubFault | None:
        """Count a call of ``route`` and return the fault to fire now, if any."""
        with self._lock:
            self.calls[route] = self.calls.get(route, 0) + 1
            for f in self.faults:
                if f.route == route and not f.fired and f.nth == self.calls[route]:
                    f.fired = True
                    return f
        return None

    def count_bytes(self, route: str, n: int) -> None:
        with self._lock:
            self.received_bytes[route] = self.received_bytes.get(route, 0) + n

    # -- routes -----------------------------------------------------------------------
    def create_repo(self, token: HubToken | None, presented: bool, body: dict[str, Any]) -> Any:
        """``POST /api/repos/create``."""
        from tests.emulators.hf_hub import HubRepo, _Answer

        if token is None:
            return _Answer(401, None, "Invalid credentials in Authorization header"), None
        name = str(body.get("name") or "")
        namespace = str(body.get("organization") or token.user)
        kind = str(body.get("type") or "model")
        repo_id = f"{namespace}/{name}"
        if (kind, repo_id) in self.hub.repos:
            return _Answer(409, None, _EXISTS), {"error": _EXISTS, "url": self._url(repo_id)}
        if not self.can_write(token, namespace):
            return _Answer(
                403,
                None,
                f'You don\'t have the rights to create a {kind} under the namespace "{namespace}"',
            ), None
        private = body.get("visibility") == "private" or bool(body.get("private"))
        repo = HubRepo(repo_id, repo_type=kind, files={}, private=private)  # type: ignore[arg-type]
        repo.commits[repo.sha] = {}
        repo.branches["main"] = repo.sha
        self.hub.repos[(kind, repo_id)] = repo
        return _Answer(200), {"url": self._url(repo_id), "name": repo_id, "id": repo.sha[:24]}

    def create_branch(
        self, repo: HubRepo | None, token: HubToken | None, branch: str, body: dict[str, Any]
    ) -> Any:
        """``POST /api/{type}s/{id}/branch/{branch}``."""
        refused = self._write_refusal(repo, token)
        if refused or repo is None:
            return refused, None
        self.tree(repo, "main")
        if branch in repo.branches:
            return self._answer(409, None, "Reference already exists"), None  # INFERRED
        start = str(body.get("startingPoint") or "main")
        repo.branches[branch] = repo.branches.get(start, start)
        return self._answer(200), {}

    def preupload(
        self, repo: HubRepo | None, token: HubToken | None, rev: str, body: dict[str, Any]
    ) -> Any:
        """``POST /api/{type}s/{id}/preupload/{rev}``."""
        refused = self._write_refusal(repo, token)
        if refused or repo is None:
            return refused, None
        tree = self.tree(repo, rev) or {}
        files = []
        for item in body.get("files") or []:
            size = int(item.get("size") or 0)
            lfs = size >= self.lfs_threshold_bytes
            answer: dict[str, Any] = {
                "path": item["path"],
                "uploadMode": "lfs" if lfs else "regular",
                "shouldIgnore": False,
            }
            old = tree.get(item["path"])
            if old is not None and old.lfs == lfs:
                answer["oid"] = old.sha256 if lfs else old.blob_id
            files.append(answer)
        return self._answer(200), {"files": files, "commitOid": repo.branches.get(rev, rev)}

    def lfs_batch(self, repo: HubRepo | None, token: HubToken | None, body: dict[str, Any]) -> Any:
        """``POST /{id}.git/info/lfs/objects/batch`` (upload operation)."""
        refused = self._write_refusal(repo, token)
        if refused:
            return refused, None
        objects = []
        for obj in body.get("objects") or []:
            oid, size = str(obj["oid"]), int(obj["size"])
            record: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if not self.has_object(oid, size):
                href = f"{self.hub.endpoint}/lfs-upload/{oid}"
                if size > self.multipart_threshold_bytes:
                    parts = -(-size // self.part_bytes)
                    header = {"chunk_size": str(self.part_bytes)}
                    header.update({str(n): f"{href}/part/{n}" for n in range(1, parts + 1)})
                    record["actions"] = {"upload": {"href": href, "header": header}}
                else:
                    record["actions"] = {"upload": {"href": href}}
            objects.append(record)
        return self._answer(200), {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}

    def store_object(self, oid: str, data_path: Path) -> _Answer:
        """Keep a received LFS object after checking its sha256 against ``oid``."""
        digest = _sha256_file(data_path)
        if digest != oid:
            data_path.unlink(missing_ok=True)
            return self._answer(400, None, f"sha256 mismatch: expected {oid}, got {digest}")
        data_path.replace(self._lfs_path(oid))
        return self._answer(200)

    def part_path(self, oid: str, n: int) -> Path:
        """Where part ``n`` of an object in progress is kept."""
        return self.dir / f"{oid}.part{n}"

    def complete(self, oid: str, body: dict[str, Any]) -> _Answer:
        """``POST /lfs-upload/{oid}``: join the listed parts, then check the whole."""
        joined = self.dir / f"{oid}.joining"
        with joined.open("wb") as out:
            for part in sorted(body.get("parts") or [], key=lambda p: int(p["partNumber"])):
                path = self.part_path(oid, int(part["partNumber"]))
                if not path.is_file() or _etag(path) != part.get("etag"):
                    return self._answer(400, None, f"part {part['partNumber']} of {oid} is missing")
                with path.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        for path in self.dir.glob(f"{oid}.part*"):
            path.unlink()
        return self.store_object(oid, joined)

    def commit(
        self, repo: HubRepo | None, token: HubToken | None, rev: str, lines: list[dict[str, Any]]
    ) -> Any:
        """``POST /api/{type}s/{id}/commit/{rev}`` with the NDJSON payload."""
        refused = self._write_refusal(repo, token)
        if refused or repo is None:
            return refused, None
        tree = self.tree(repo, rev)
        if tree is None or rev not in repo.branches:
            return self._answer(404, "RevisionNotFound", _NO_REVISION.format(rev=rev)), None
        new = dict(tree)
        for line in lines:
            value = line.get("value") or {}
            if line.get("key") == "file":
                data = base64.b64decode(value["content"])
                new[value["path"]] = StoredFile(
                    len(data), hashlib.sha256(data).hexdigest(), False, data
                )
            elif line.get("key") == "lfsFile":
                oid, size = str(value["oid"]), int(value["size"])
                if not self.has_object(oid, size):
                    return self._answer(400, None, _LFS_MISSING), None
                new[value["path"]] = StoredFile(size, oid, True)
            elif line.get("key") in ("deletedFile", "deletedFolder"):
                gone = value["path"].rstrip("/")
                new = {p: f for p, f in new.items() if p != gone and not p.startswith(gone + "/")}
        oid = hashlib.sha1(uuid.uuid4().bytes).hexdigest()
        repo.commits[oid] = new
        repo.branches[rev] = oid
        if rev == "main":
            repo.sha = oid
        url = f"{self._url(repo.repo_id)}/commit/{oid}"
        return self._answer(200), {"commitUrl": url, "commitOid": oid, "success": True}

    def paths_info(self, repo: HubRepo, rev: str, form: bytes) -> Any:
        """``POST /api/{type}s/{id}/paths-info/{rev}`` (access already checked)."""
        tree = self.tree(repo, rev)
        if tree is None:
            return self._answer(404, "RevisionNotFound", _NO_REVISION.format(rev=rev)), None
        fields = parse_qs(form.decode("utf-8"), keep_blank_values=True)
        out = []
        for path in fields.get("paths", []):
            stored = tree.get(path)
            if stored is None:
                continue
            record: dict[str, Any] = {
                "type": "file",
                "path": path,
                "size": stored.size,
                "oid": stored.blob_id,
            }
            if stored.lfs:
                pointer = lfs_pointer(stored.sha256, stored.size)
                record["lfs"] = {
                    "oid": stored.sha256,
                    "size": stored.size,
                    "pointerSize": len(pointer),
                }
            out.append(record)
        return self._answer(200), out

    def siblings(self, repo: HubRepo, rev: str, blobs: bool) -> list[dict[str, Any]]:
        """``siblings`` of ``model_info`` (with ``blobs=True``: size, blob id, LFS)."""
        tree = self.tree(repo, rev) or {}
        out = []
        for path, stored in sorted(tree.items()):
            item: dict[str, Any] = {"rfilename": path}
            if blobs:
                item.update({"size": stored.size, "blobId": stored.blob_id})
                if stored.lfs:
                    pointer = lfs_pointer(stored.sha256, stored.size)
                    item["lfs"] = {
                        "size": stored.size,
                        "sha256": stored.sha256,
                        "pointerSize": len(pointer),
                    }
            out.append(item)
        return out

    # -- helpers ----------------------------------------------------------------------
    def _write_refusal(self, repo: HubRepo | None, token: HubToken | None) -> _Answer | None:
        if token is None:
            return self._answer(401, None, "Invalid credentials in Authorization header")
        if repo is None or not self.hub.can_read(repo, token):
            return self._answer(404, "RepoNotFound", "Repository not found")
        namespace = repo.repo_id.split("/", 1)[0]
        if not self.can_write(token, namespace):
            return self._answer(403, None, _NO_WRITE.format(repo_id=repo.repo_id))
        return None

    def _url(self, repo_id: str) -> str:
        return f"{self.hub.endpoint}/{repo_id}"

    @staticmethod
    def _answer(status: int, code: str | None = None, message: str | None = None) -> _Answer:
        from tests.emulators.hf_hub import _Answer

        return _Answer(status, code, message)


def _digest_file(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sha256_file(path: Path) -> str:
    return _digest_file(path, "sha256")


def _etag(path: Path) -> str:
    """A part's ETag: the md5 of its bytes, quoted, as S3 answers."""
    return f'"{_digest_file(path, "md5")}"'


def parse_ndjson(body: bytes) -> list[dict[str, Any]]:
    """The lines of a commit payload."""
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def route_write(
    handler: _Handler, path: str, token: HubToken | None, presented: bool
) -> tuple[_Answer, bytes, dict[str, str]]:
    """Answer a POST or PUT: the publishing routes (module docstring), with the
    writer's faults fired at their named routes.

    Args:
        handler: the request handler (it reads the body and can drop the connection).
        path: the request path without its query.
        token / presented: the caller's known token, and whether any was sent.

    Returns:
        ``(answer, body, extra headers)``.
    """
    from urllib.parse import unquote

    from tests.emulators.hf_hub import _API_REPO, _INVALID_CREDENTIALS, _Answer, _dump

    hub, writer = handler.hub, handler.hub.writer
    if presented and token is None and not path.startswith("/lfs-upload/"):
        handler._body()
        return _Answer(401, None, _INVALID_CREDENTIALS), b"", {}
    if path == "/api/validate-yaml":
        handler._body()
        return _Answer(200), b'{"errors": [], "warnings": []}', {}
    if path == "/api/repos/create":
        answer, data = writer.create_repo(token, presented, handler._json())
        return answer, _dump(data), {}
    match = _LFS_BATCH.match(path)
    if match:
        kind = "dataset" if match.group(1) else "model"
        body = handler._json()
        fault = writer.fault("batch")
        if fault is not None:
            return _Answer(fault.status, None, "Internal Error"), b"", {}
        answer, data = writer.lfs_batch(hub.repos.get((kind, match.group(2))), token, body)
        return answer, _dump(data), {"Content-Type": "application/vnd.git-lfs+json"}
    match = _LFS_UPLOAD.match(path)
    if match:
        return _lfs_upload(handler, match.group(1), match.group(2))
    match = _API_REPO.match(path)
    if not match or match.group(3) not in _WRITE_ACTIONS:
        handler._body()
        return _Answer(404, None, "Not Found"), b"", {}
    kind = "model" if match.group(1) == "models" else "dataset"
    repo = hub.repos.get((kind, match.group(2)))
    action, rev = match.group(3), unquote(match.group(4) or "main")
    if action in ("preupload", "commit"):
        fault = writer.fault(action)
        if fault is not None:
            handler._body()
            return _Answer(fault.status, None, "Internal Error"), b"", {}
    if action == "preupload":
        answer, data = writer.preupload(repo, token, rev, handler._json())
    elif action == "commit":
        answer, data = writer.commit(repo, token, rev, parse_ndjson(handler._body()))
    elif action == "branch":
        answer, data = writer.create_branch(repo, token, rev, handler._json())
    else:
        form = handler._body()
        if repo is None or not hub.can_read(repo, token):
            return _Answer(404 if token else 401, "RepoNotFound", "Repository not found"), b"", {}
        answer, data = writer.paths_info(repo, rev, form)
    return answer, _dump(data), {}


def _lfs_upload(
    handler: _Handler, oid: str, part: str | None
) -> tuple[_Answer, bytes, dict[str, str]]:
    """A basic upload (PUT), a multipart part (PUT …/part/N) or the completion (POST)."""
    from tests.emulators.hf_hub import _Answer

    writer = handler.hub.writer
    if part is not None:
        target = writer.part_path(oid, int(part))
        handler._receive("lfs_part", target)
        return _Answer(200), b"", {"ETag": _etag(target)}
    if handler.command == "POST":  # multipart completion
        return writer.complete(oid, handler._json()), b"{}", {}
    incoming = writer.dir / f"{oid}.incoming"
    handler._receive("lfs_put", incoming)
    return writer.store_object(oid, incoming), b"", {}
