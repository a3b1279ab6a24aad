"""docs/worker.md's job-variable table names every variable the pool has, with its
default."""

from __future__ import annotations

import re
from pathlib import Path

from prefect_runpod.flows.worker.config import POD_FIELDS

DOC = Path(__file__).resolve().parents[3] / "docs" / "worker.md"


def _shown(default: object) -> str:
    if default is None:
        return "none"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def test_every_job_variable_is_in_the_table_with_its_default() -> None:
    rows = {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `([a-z_]+)` \| ([^|]+) \|", DOC.read_text(), re.M)
    }
    for name, (_, default, _) in POD_FIELDS.items():
        assert name in rows, f"docs/worker.md's table lacks {name}"
        assert rows[name] == _shown(default), (name, rows[name], _shown(default))
    assert set(rows) - set(POD_FIELDS) == set(), set(rows) - set(POD_FIELDS)
