"""``bundle.toml``'s ``[job]`` keys keep their TOML types (issue 24): every boolean and
numeric key is refused when written as another type, however pydantic would read it
(``"yes"`` and ``1`` as true, ``"2"`` as 2); the values as written otherwise pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.tasks.bundle import BundleSpec, load_bundle

TYPED = {
    name: field.annotation
    for name, field in BundleSpec.model_fields.items()
    if field.annotation in (bool, int, float)
}
"""Every boolean and numeric key of ``[job]``, from the model (a new one is checked too)."""

WRONG = {bool: ['"yes"', "1", "0.0"], int: ['"2"', "2.0", "true"], float: ['"600"', "true"]}
RIGHT = {bool: "true", int: "3", float: "600"}


def _load(tmp_path: Path, line: str) -> BundleSpec:
    (tmp_path / "bundle.toml").write_text(f'[job]\ntrain = "{{python}} train.py"\n{line}\n')
    return load_bundle(tmp_path)


def test_the_typed_keys_are_the_three_known() -> None:
    assert {
        "expected_runtime_seconds": float,
        "keep_checkpoints": int,
        "resume_from_env": bool,
    } == TYPED


@pytest.mark.parametrize(("key", "written"), [(k, w) for k, t in TYPED.items() for w in WRONG[t]])
def test_a_typed_key_written_as_another_type_is_refused(
    tmp_path: Path, key: str, written: str
) -> None:
    with pytest.raises(SpecError) as err:
        _load(tmp_path, f"{key} = {written}")
    message = str(err.value)
    assert f"[job] {key} = {written} is " in message and f"but {key} must be " in message
    assert "\n" not in message


@pytest.mark.parametrize("key", sorted(TYPED))
def test_a_typed_key_written_as_its_type_passes(tmp_path: Path, key: str) -> None:
    spec = _load(tmp_path, f"{key} = {RIGHT[TYPED[key]]}")
    assert isinstance(getattr(spec, key), TYPED[key])
