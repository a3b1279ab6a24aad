"""A loopback package index (PEP 503) of tiny generated wheels, laid out like PyTorch's.

The wheels are the local pod's stand-ins (``prefect_runpod.blocks.local_pod.tiny_wheels``);
real pip installs from it, so the env stage's plan → apply → verify loop runs for real
without multi-GB downloads and without the internet:

* ``/whl/<tag>/`` and ``/whl/<tag>/torch/`` — like ``https://download.pytorch.org/whl/cu118``;
  each wheel is a pure-Python package named ``torch`` with ``__version__``
  (``2.5.1+cu118``), ``torch.version.cuda`` (``"11.8"``, None for ``cpu``) and
  ``torch.cuda.is_available()`` → False.
* ``/simple/`` — PyPI-like, with ``transformers`` (and ``peft``, ``accelerate``).
  The fake ``transformers`` behaves like the real one's import gate
  (``utils/import_utils.py``): when torch is older than its floor it logs
  ``Disabling PyTorch because PyTorch >= X is required but found Y`` and
  ``transformers.utils.is_torch_available()`` returns False.

Every request is logged in :attr:`WheelIndex.requests`. Loopback is a secure origin
for pip, so plain ``http://127.0.0.1`` needs no ``--trusted-host``.

Run standalone: ``python -m tests.emulators.wheel_index --port 8809``.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import re
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.local_pod.tiny_wheels import (
    TRANSFORMERS_TORCH_FLOOR,
    build_wheel,
    plain_files,
    torch_files,
    transformers_files,
)

__all__ = [
    "DEFAULT_SIMPLE",
    "DEFAULT_TORCH",
    "TRANSFORMERS_TORCH_FLOOR",
    "WheelIndex",
    "build_wheel",
]

DEFAULT_TORCH: dict[str, list[str]] = {
    "cu118": ["2.1.0", "2.5.1", "2.7.1"],
    "cu121": ["2.1.0", "2.5.1"],
    "cu124": ["2.4.1", "2.6.0"],
    "cu126": ["2.6.0", "2.8.0"],
    "cu128": ["2.7.1", "2.8.0"],
    "cpu": ["2.1.0", "2.5.1", "2.6.0", "2.8.0"],
}
"""Index tag → torch versions served there (a subset of the real matrix)."""

DEFAULT_SIMPLE: dict[str, list[str]] = {
    "transformers": ["4.46.3", "4.57.1", "5.0.0", "5.2.0", "5.20.0"],
    "peft": ["0.13.2"],
    "accelerate": ["1.1.0"],
}
"""Plain packages on ``/simple/``."""


@dataclass
class _Project:
    root: str  # URL prefix, e.g. "/whl/cu118" or "/simple"
    name: str
    files: list[tuple[str, str]]  # (file name, sha256)


class WheelIndex:
    """The index server: generates its wheels into a temp dir and serves them on
    127.0.0.1 (free port). Use as a context manager.

    Attributes:
        url: ``http://127.0.0.1:<port>`` once started.
        torch_base: ``{url}/whl`` — pass as the planner's torch index base.
        simple_url: ``{url}/simple`` — pass as pip's ``--index-url`` for other packages.
        requests: every path requested, in order.
    """

    def __init__(
        self,
        torch: dict[str, list[str]] | None = None,
        simple: dict[str, list[str]] | None = None,
    ):
        self._torch = torch or DEFAULT_TORCH
        self._simple = simple or DEFAULT_SIMPLE
        self._tmp = tempfile.TemporaryDirectory(prefix="wheel-index-")
        self.root = Path(self._tmp.name)
        self.projects: dict[str, _Project] = {}
        self.requests: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._generate()

    def _add(self, root: str, name: str, wheels: Iterable[tuple[str, bytes]]) -> None:
        folder = self.root / root.strip("/") / name
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for fname, data in wheels:
            (folder / fname).write_bytes(data)
            files.append((fname, hashlib.sha256(data).hexdigest()))
        self.projects[f"{root}/{name}"] = _Project(root, name, files)

    def _generate(self) -> None:
        for tag, versions in self._torch.items():
            self._add(
                f"/whl/{tag}",
                "torch",
                (build_wheel("torch", f"{v}+{tag}", torch_files(v, tag)) for v in versions),
            )
        for name, versions in self._simple.items():
            maker = transformers_files if name == "transformers" else None
            self._add(
                "/simple",
                name,
                (
                    build_wheel(name, v, maker(v) if maker else plain_files(name, v))
                    for v in versions
                ),
            )

    def page(self, path: str) -> str | None:
        """The PEP 503 HTML for an index or project path, None if unknown."""
        path = "/" + path.strip("/")
        if path in self.projects:
            project = self.projects[path]
            links = "".join(
                f'<a href="{html.escape(fname)}#sha256={digest}">{html.escape(fname)}</a><br>\n'
                for fname, digest in project.files
            )
            return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n"
        names = sorted(p.name for p in self.projects.values() if p.root == path)
        if names:
            links = "".join(f'<a href="{n}/">{n}</a><br>\n' for n in names)
            return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n"
        return None

    # -- lifecycle ------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the wheel index is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def torch_base(self) -> str:
        return f"{self.url}/whl"

    @property
    def simple_url(self) -> str:
        return f"{self.url}/simple"

    def start(self, port: int = 0) -> WheelIndex:
        """Serve on 127.0.0.1:``port`` (0 = free) in a daemon thread."""
        index = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any):
                super().__init__(*args, directory=str(index.root), **kwargs)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Keep stderr quiet; the index keeps its own log."""

            def do_GET(self) -> None:  # noqa: N802
                index.requests.append(self.path)
                path = self.path.split("?", 1)[0].split("#", 1)[0]
                if not re.search(r"\.whl$", path):
                    body = index.page(path)
                    if body is None:
                        self.send_error(404, "Not Found")
                        return
                    data = body.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                super().do_GET()

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="wheel-index", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, release the port and delete the generated wheels."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._tmp.cleanup()

    def __enter__(self) -> WheelIndex:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serve the default index in the foreground until interrupted."""
    parser = argparse.ArgumentParser(description="Loopback PEP 503 index of tiny wheels.")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    index = WheelIndex().start(args.port)
    print(json.dumps({"torch_base": index.torch_base, "simple": index.simple_url}), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        index.stop()


if __name__ == "__main__":
    main()
