"""Every package that loads its public names lazily (PEP 562, ``blocks.lazy_exports``)
also imports them under ``if TYPE_CHECKING:``, so a type checker sees the real types
(``from prefect_runpod.blocks.transfer import upload_dir`` is the function, not
``Any``), and each typed import names the very object the lazy one loads."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAZY = {
    "prefect_runpod.blocks": ROOT / "blocks" / "__init__.py",
    "prefect_runpod.blocks.console": ROOT / "blocks" / "console" / "__init__.py",
    "prefect_runpod.blocks.local_pod": ROOT / "blocks" / "local_pod" / "__init__.py",
    "prefect_runpod.blocks.runpod": ROOT / "blocks" / "runpod" / "__init__.py",
    "prefect_runpod.blocks.transfer": ROOT / "blocks" / "transfer" / "__init__.py",
}


def typed_imports(init: Path) -> dict[str, str]:
    """``name -> module`` of every ``from MODULE import NAME`` under a top-level
    ``if TYPE_CHECKING:`` of ``init``."""
    found: dict[str, str] = {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for item in node.body:
                if isinstance(item, ast.ImportFrom) and item.module:
                    found.update({alias.name: item.module for alias in item.names})
    return found


def test_every_package_with_lazy_names_is_listed() -> None:
    users = {
        p.parent for p in (ROOT / "blocks").rglob("__init__.py") if "lazy_exports(" in p.read_text()
    }
    assert users == {p.parent for p in LAZY.values()}


@pytest.mark.parametrize("package", sorted(LAZY))
def test_lazy_names_are_typed_as_what_they_load(package: str) -> None:
    module = importlib.import_module(package)
    typed = typed_imports(LAZY[package])
    assert sorted(typed) == sorted(module.__all__), "typed imports and __all__ differ"
    for name, source in typed.items():
        assert getattr(module, name) is getattr(importlib.import_module(source), name), name
