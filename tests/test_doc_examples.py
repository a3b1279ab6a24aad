"""Every example in docs/reference/ runs: the block pages' examples against the Prefect
test server, the task pages' examples (each a flow on a local pod) too, slow-marked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "reference"
_PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _example(page: Path) -> str:
    """The page's Example: the last python block (the first is the signature)."""
    blocks = _PYTHON.findall(page.read_text(encoding="utf-8"))
    assert blocks, f"{page.name} has no python example"
    return blocks[-1]


def _run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> str:
    monkeypatch.chdir(tmp_path)
    code = compile(_example(page), str(page), "exec")
    exec(code, {"__name__": "__docs__"})  # noqa: S102 - the docs' own example
    return capsys.readouterr().out


def test_every_block_and_stage_has_a_page():
    from prefect_runpod.tasks.models import STAGES

    names = {p.stem for p in PAGES.glob("*.md")}
    assert {f"task-{s.replace('_', '-')}" for s in ("preflight", *STAGES)} <= names
    assert {
        "block-run-pod-credentials",
        "block-run-pod-pod-spec",
        "block-run-pod-ssh-key",
        "block-local-pod",
        "block-hugging-face-credentials",
        "block-s3-target",
    } <= names
    for page in PAGES.glob("*-*.md"):
        text = page.read_text(encoding="utf-8")
        assert "## Example" in text and ("## Args" in text or "## Fields" in text), page.name


@pytest.mark.parametrize("page", sorted(PAGES.glob("block-*.md")), ids=lambda p: p.stem)
def test_block_examples_run(page, prefect_server, tmp_path, monkeypatch, capsys):
    assert _run(page, tmp_path, monkeypatch, capsys).strip()


_NO_POD = ("task-preflight", "task-eval-parity", "task-checksum")


@pytest.mark.parametrize(
    "page",
    [p for p in sorted(PAGES.glob("task-*.md")) if p.stem in _NO_POD],
    ids=lambda p: p.stem,
)
def test_task_examples_without_a_pod_run(page, prefect_server, tmp_path, monkeypatch, capsys):
    assert _run(page, tmp_path, monkeypatch, capsys).strip()


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [
        p
        for p in sorted(PAGES.glob("task-*.md"))
        if p.stem not in _NO_POD and "```text" not in p.read_text()
    ],
    ids=lambda p: p.stem,
)
def test_task_examples_on_a_local_pod_run(page, prefect_server, tmp_path, monkeypatch, capsys):
    assert _run(page, tmp_path, monkeypatch, capsys).strip()
