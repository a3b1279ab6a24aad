"""Issue 25: the checkpoint contract in ``bundle.toml`` is checked before anything is
rented; a bundle that declares no checkpoints is read exactly as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.tasks.bundle import RESUME_ENV, load_bundle


def _bundle(tmp_path: Path, job: str) -> Path:
    (tmp_path / "bundle.toml").write_text("[job]\n" + job)
    return tmp_path


def test_a_bundle_without_checkpoints_reads_as_before(tmp_path):
    spec = load_bundle(_bundle(tmp_path, 'train = "{python} train.py"\n'))
    assert (spec.checkpoints, spec.checkpoint_marker, spec.resume_from_env) == ("", "", False)
    assert spec.command(spec.train, "python3") == "python3 train.py"


def test_checkpoints_with_a_placeholder_resume_from_a_quoted_path(tmp_path):
    spec = load_bundle(
        _bundle(
            tmp_path,
            'train = "{python} train.py --resume {resume_from}"\n'
            'checkpoints = "out/ck"\ncheckpoint_marker = "COMPLETE"\nkeep_checkpoints = 3\n',
        )
    )
    assert (spec.checkpoints, spec.checkpoint_marker, spec.keep_checkpoints) == (
        "out/ck",
        "COMPLETE",
        3,
    )
    assert spec.command(spec.train, "py") == "py train.py --resume ''"
    assert spec.command(spec.train, "py", "out/ck/step 4") == "py train.py --resume 'out/ck/step 4'"


@pytest.mark.parametrize(
    ("job", "words"),
    [
        ('train = "t"\ncheckpoints = "ck"\n', "needs a way to resume"),
        ('train = "t {resume_from}"\n', "no checkpoints folder is declared"),
        ('train = "t"\ncheckpoint_marker = "DONE"\n', "no checkpoints folder is declared"),
        ('train = "t {resume_from}"\ncheckpoints = "/abs"\n', "relative path inside"),
        ('train = "t {resume_from}"\ncheckpoints = "../up"\n', "relative path inside"),
        (
            'train = "t {resume_from}"\ncheckpoints = "ck"\ncheckpoint_marker = "a/b"\n',
            "plain file",
        ),
        (
            'train = "t {resume_from}"\ncheckpoints = "ck"\nkeep_checkpoints = 0\n',
            "keep_checkpoints",
        ),
    ],
)
def test_a_broken_contract_is_refused_before_renting(tmp_path, job, words):
    with pytest.raises(SpecError, match=words):
        load_bundle(_bundle(tmp_path, job))


def test_the_job_may_read_the_checkpoint_from_its_environment_instead(tmp_path):
    spec = load_bundle(
        _bundle(tmp_path, 'train = "t"\ncheckpoints = "ck"\nresume_from_env = true\n')
    )
    assert spec.resume_from_env and RESUME_ENV == "PREFECT_RUNPOD_RESUME_FROM"
