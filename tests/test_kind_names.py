"""Kinds are chosen by the packages that own them: no flow or task decides anything by a
provider's name (``runpod``, ``local``) or a publish kind's (``hf``, ``s3``). An AST
walk over ``flows/`` and ``tasks/`` finds none of those words in a comparison, in a
collection (a membership test, a choice list, a table keyed by kind), in a module or
class constant, or as a parameter's default, outside the exceptions named below, each
with why (docs/architecture.md#capabilities)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = frozenset({"runpod", "local", "hf", "s3"})

EXCEPTIONS: dict[str, str] = {
    "tasks/models.py:HFDiagnosis.where": (
        "where the Hugging Face diagnosis ran, this machine or the pod, not a provider"
    ),
    "tasks/hf_classify.py:classify_hf_access.where": "the same: the diagnosis ran on this machine",
    "tasks/hf_classify.py:diagnose_evidence.where": "the same: the diagnosis ran on this machine",
    "tasks/hf_classify.py:place_words": "the same: a diagnosis's place put into words",
    "flows/worker/worker.py:RunPodWorker.type": (
        "the work-pool type Prefect keys the worker by, not a provider chosen"
    ),
    "tasks/checksum.py:manifest_rows": (
        "the checksum-manifest table's column for the copy on this machine"
    ),
}
"""``path:scope`` -> why a kind word may appear there with another meaning."""


def _words_in(node: ast.AST) -> set[str]:
    return {
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in WORDS
    }


def _collections(node: ast.AST) -> list[ast.AST]:
    return [n for n in ast.walk(node) if isinstance(n, (ast.Tuple, ast.List, ast.Set))]


class _Finder(ast.NodeVisitor):
    def __init__(self, rel: str) -> None:
        self.rel = rel
        self.scopes: list[str] = []
        self.found: dict[str, set[str]] = {}

    def _hit(self, words: set[str], scope: str | None = None) -> None:
        if words:
            key = f"{self.rel}:{scope or '.'.join(self.scopes) or '<module>'}"
            self.found.setdefault(key, set()).update(words)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scopes.append(node.name)
        for stmt in node.body:  # class constants, fields' choices and defaults
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
                name = target.id if isinstance(target, ast.Name) else "?"
                words = _words_in(stmt.value) if stmt.value is not None else set()
                if isinstance(stmt, ast.AnnAssign):
                    words |= _words_in(stmt.annotation)
                self._hit(words, f"{'.'.join(self.scopes)}.{name}")
            else:
                self.visit(stmt)
        self.scopes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scopes.append(node.name)
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        pairs = list(
            zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
        )
        pairs += [
            (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
        ]
        for arg, default in pairs:
            self._hit(_words_in(default), f"{'.'.join(self.scopes)}.{arg.arg}")
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Compare(self, node: ast.Compare) -> None:
        self._hit(_words_in(node))
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        self._hit(set().union(*(_words_in(k) for k in node.keys if k is not None)))
        self.generic_visit(node)

    def visit_Tuple(self, node: ast.Tuple) -> None:
        self._hit(_words_in(node))

    visit_List = visit_Tuple  # type: ignore[assignment]
    visit_Set = visit_Tuple  # type: ignore[assignment]


def kind_names_in(source: str, rel: str) -> dict[str, set[str]]:
    """``path:scope -> words`` for every place a kind word decides something."""
    tree = ast.parse(source, filename=rel)
    finder = _Finder(rel)
    for stmt in tree.body:  # module constants
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            finder._hit(_words_in(stmt.value))
    finder.visit(tree)
    return finder.found


def test_the_walk_finds_what_it_should() -> None:
    sample = (
        "X = {'hf': 1}\n"
        "def f(p='local'):\n"
        "    if p == 'runpod': pass\n"
        "    return p in ('s3', 'auto')\n"
        "class M:\n"
        "    kind: str = 'hf'\n"
        "def g(x):\n"
        "    return x.where  # 'local' in a comment is nothing\n"
    )
    found = kind_names_in(sample, "m.py")
    assert found == {
        "m.py:<module>": {"hf"},
        "m.py:f.p": {"local"},
        "m.py:f": {"runpod", "s3"},
        "m.py:M.kind": {"hf"},
    }


def test_no_flow_or_task_decides_by_a_kind_name() -> None:
    found: dict[str, set[str]] = {}
    for top in ("flows", "tasks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found.update(kind_names_in(path.read_text(encoding="utf-8"), rel))
    unexplained = {k: sorted(v) for k, v in found.items() if k not in EXCEPTIONS}
    assert not unexplained, (
        "a flow or task chooses by a kind's name: ask the provider (supports(capability)) or "
        f"the publish kind instead, or name the place in EXCEPTIONS with why: {unexplained}"
    )
    stale = sorted(set(EXCEPTIONS) - set(found))
    assert not stale, f"no longer holds a kind word, drop the exception: {stale}"
