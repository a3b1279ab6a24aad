"""The code stays in pieces a reader can hold: no product module over
``MAX_MODULE_LINES`` lines and no function over ``MAX_FUNCTION_LINES`` (from its first
decorator to its last line, docstring included), outside the exceptions named below,
each with why (docs/architecture.md#layers-and-packages).

The product is ``flows/``, ``tasks/``, ``blocks/`` and ``deployments/``. Functions of
the pod-side scripts (``blocks/pod_side/``) are not held to the function limit: each is
a standalone stdlib script run on the pod. The fine-tune flow's signature and docstring
are not counted either: they are its flat Prefect parameters, one per run parameter,
declared and held to ``blocks/validation/parameters.py`` elsewhere; its body is. An
exception that no longer applies fails too, so the table only ever shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("flows", "tasks", "blocks", "deployments")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100
POD_SIDE = "blocks/pod_side/"

MODULE_EXCEPTIONS: dict[str, str] = {
    "blocks/pod_side/manifest.py": (
        "one stdlib script run by path on the pod and imported by the flow: one file keeps "
        "both ends one implementation without cross-file import fallbacks"
    ),
    "blocks/pod_side/watchdog.py": (
        "the dead-man switch runs alone on the pod as one stdlib script: nothing it needs "
        "to end the pod may live in another file"
    ),
}
"""Module path -> why it may be longer than ``MAX_MODULE_LINES``."""

FUNCTION_EXCEPTIONS: dict[str, str] = {}
"""``path:function`` -> why it may be longer than ``MAX_FUNCTION_LINES``."""

BODY_ONLY: dict[str, str] = {
    "flows/finetune.py:finetune": (
        "the flow's flat Prefect parameters and their docs, generated from and held to "
        "the run-parameter schema"
    ),
}
"""``path:function`` whose signature and docstring are not counted, with why."""


def product_modules() -> list[Path]:
    """Every Python module of the product, sorted."""
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py"))


def long_modules() -> dict[str, int]:
    """``path -> lines`` of every product module over ``MAX_MODULE_LINES``."""
    found = {}
    for path in product_modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            found[path.relative_to(ROOT).as_posix()] = lines
    return found


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, body_only: bool = False) -> int:
    """Lines from the function's first decorator (or ``def``) to its last line; with
    ``body_only``, from its first statement after the docstring."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    if body_only:
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        first = body[0].lineno if body else node.end_lineno or node.lineno
    assert node.end_lineno is not None
    return node.end_lineno - first + 1


def long_functions() -> dict[str, int]:
    """``path:name -> lines`` of every function (methods and nested ones included) over
    ``MAX_FUNCTION_LINES`` outside the pod-side scripts."""
    found = {}
    for path in product_modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(POD_SIDE):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = function_lines(node, f"{rel}:{node.name}" in BODY_ONLY)
                if lines > MAX_FUNCTION_LINES:
                    found[f"{rel}:{node.name}"] = lines
    return found


def test_the_measures_see_what_they_should() -> None:
    tree = ast.parse("@dec\ndef f():\n    '''doc\n    more'''\n    return 1\n")
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    assert function_lines(node) == 5
    assert function_lines(node, body_only=True) == 1
    assert any(p.as_posix().endswith("flows/finetune.py") for p in product_modules())
    assert "blocks/pod_side/watchdog.py" in long_modules()
    for name in BODY_ONLY:
        path, function = name.split(":")
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        (flow,) = [n for n in ast.walk(tree) if getattr(n, "name", None) == function]
        assert isinstance(flow, ast.FunctionDef)
        assert function_lines(flow) > function_lines(flow, body_only=True) > 0, name


def test_no_module_is_too_long() -> None:
    found = long_modules()
    unexplained = {p: n for p, n in found.items() if p not in MODULE_EXCEPTIONS}
    assert not unexplained, (
        f"modules over {MAX_MODULE_LINES} lines: split them by concern, or name them in "
        f"MODULE_EXCEPTIONS with why: {unexplained}"
    )
    stale = sorted(set(MODULE_EXCEPTIONS) - set(found))
    assert not stale, f"no longer over {MAX_MODULE_LINES} lines, drop the exception: {stale}"


def test_no_function_is_too_long() -> None:
    found = long_functions()
    unexplained = {f: n for f, n in found.items() if f not in FUNCTION_EXCEPTIONS}
    assert not unexplained, (
        f"functions over {MAX_FUNCTION_LINES} lines: split them by concern, or name them in "
        f"FUNCTION_EXCEPTIONS with why: {unexplained}"
    )
    stale = sorted(set(FUNCTION_EXCEPTIONS) - set(found))
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines, drop the exception: {stale}"


def test_every_exception_says_why() -> None:
    for name, why in {**MODULE_EXCEPTIONS, **FUNCTION_EXCEPTIONS, **BODY_ONLY}.items():
        assert why.strip() and "\n" not in why, name
