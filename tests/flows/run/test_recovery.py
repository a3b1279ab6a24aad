"""Issue 25: which pod losses a run resumes after, and what its later pods are called."""

from __future__ import annotations

import pytest

from prefect_runpod.flows.run.names import attempt_pod_name, flow_run_id_from_pod_name
from prefect_runpod.flows.run.recovery import recoverable

RUN_ID = "0b5a2f4e-9c1d-4e7a-8f3b-2d6c9e1a7b40"


@pytest.mark.parametrize(
    ("cause", "ended_by", "outside_too", "resumes"),
    [
        ("exited", None, False, True),  # the container stopped
        ("host_lost", None, False, True),  # ERROR, a dead local pod daemon
        ("host_lost", "flow", False, True),  # unreachable, terminated by the run, confirmed
        ("terminated_outside", None, False, False),  # e.g. RunPod's console: ends the run
        ("terminated_outside", None, True, True),  # ... unless --recover-outside-terminate
        ("terminated_outside", "cli", True, False),  # `prefect-runpod terminate`: never
        ("host_lost", "deadman", False, False),  # the pod's dead-man switch: never
        ("host_lost", "reaper", True, False),
        ("unknown", None, True, False),  # the provider could not be asked: no loss
    ],
)
def test_which_losses_a_run_resumes_after(cause, ended_by, outside_too, resumes):
    assert recoverable(cause, ended_by, outside_too=outside_too) is resumes


def test_later_attempts_are_named_after_the_run_and_found_by_it():
    first = f"prft-{RUN_ID}"
    assert attempt_pod_name(first, 1) == first
    assert attempt_pod_name(first, 2) == f"{first}-a2"
    for number in (1, 2, 3):
        assert str(flow_run_id_from_pod_name(attempt_pod_name(first, number), "prft")) == RUN_ID


def test_a_bundle_changed_since_the_first_upload_is_named_file_by_file(tmp_path):
    """A later attempt resumes only with the code that trained the checkpoint."""
    from prefect_runpod.blocks.pod_side import manifest as tree_manifest
    from prefect_runpod.blocks.transfer.models import Manifest
    from prefect_runpod.flows.run.recovery import changed_bundle_files

    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text("{}\n")
    files = ["data/a.jsonl", "train.py"]
    uploaded = Manifest.model_validate(
        tree_manifest.compute_manifest(str(tmp_path), paths=files, select=True)
    )
    assert changed_bundle_files(uploaded, str(tmp_path), files) == []
    assert changed_bundle_files(None, str(tmp_path), files) == []
    (tmp_path / "train.py").write_text("print(2)\n")
    assert changed_bundle_files(uploaded, str(tmp_path), files) == ["train.py"]
    (tmp_path / "data" / "a.jsonl").unlink()
    assert changed_bundle_files(uploaded, str(tmp_path), files) == ["data/a.jsonl", "train.py"]


def test_the_runtime_cap_counts_the_training_of_every_pod():
    from prefect_runpod.flows.run.train_steps import runtime_left
    from prefect_runpod.tasks.models import StageRecord

    earlier = [StageRecord(name="train", seconds=700.0), StageRecord(name="env", seconds=50.0)]
    assert runtime_left(3600.0, []) == 3600.0
    assert runtime_left(3600.0, earlier) == 2900.0
    assert runtime_left(600.0, earlier) == 1.0  # spent: the next attempt stops at once


def _run_with(tmp_path, checkpoints: str = "checkpoints", gpu_count: int = 0):
    """What ``resume_checkpoint`` reads of a prepared run: its bundle, output dir and the
    pod it is about to rent (a real ``PodHandle`` with ``gpu_count`` GPUs)."""
    from types import SimpleNamespace

    from prefect_runpod.blocks.pod_handle import PodHandle

    bundle = SimpleNamespace(root=str(tmp_path / "b"), checkpoints=checkpoints, keep_checkpoints=2)
    planned = PodHandle(pod_id="pending", name="n", provider="runpod", gpu_count=gpu_count)
    return SimpleNamespace(
        settings=SimpleNamespace(bundle=bundle, output_dir=str(tmp_path / "o")),
        planned=SimpleNamespace(handle=planned),
    )


def _old_checkpoint(root, gpu_count: int | None):
    """A verified ``step-7`` in a run dir under ``root``, written on a pod with
    ``gpu_count`` GPUs (None: saved without its pod's count)."""
    from prefect_runpod.blocks.pod_side import manifest as tree_manifest
    from prefect_runpod.flows.run.checkpoints import CheckpointStore

    old = CheckpointStore(root / "old-run")
    pod = root / "pod" / "step-7"
    pod.mkdir(parents=True)
    (pod / "model.json").write_text("{}")
    tree = tree_manifest.compute_manifest(str(pod))
    folder, _ = old.staging("step-7", tree)
    (folder / "model.json").write_text("{}")
    written = None if gpu_count is None else {"pod_id": "p1", "attempt": 1, "gpu_count": gpu_count}
    assert old.accept("step-7", folder, tree, written_by=written)
    return old


def test_resume_from_is_checked_before_renting(tmp_path):
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.flows.run.recovery import resume_checkpoint

    assert resume_checkpoint(None, _run_with(tmp_path)) is None
    with pytest.raises(SpecError, match="declares checkpoints"):
        resume_checkpoint(str(tmp_path), _run_with(tmp_path, checkpoints=""))
    with pytest.raises(SpecError, match="no verified checkpoint"):
        resume_checkpoint(str(tmp_path / "nothing-here"), _run_with(tmp_path))


def test_resume_from_a_checkpoint_folder_copies_it_into_the_run_verified(tmp_path):
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.pod_side import manifest as tree_manifest
    from prefect_runpod.flows.run.checkpoints import CheckpointStore
    from prefect_runpod.flows.run.recovery import resume_checkpoint

    old = CheckpointStore(tmp_path / "old-run")
    pod = tmp_path / "pod" / "step-7"
    pod.mkdir(parents=True)
    (pod / "model.json").write_text("{}")
    tree = tree_manifest.compute_manifest(str(pod))
    folder, _ = old.staging("step-7", tree)
    (folder / "model.json").write_text("{}")
    assert old.accept("step-7", folder, tree)
    run = _run_with(tmp_path)
    assert resume_checkpoint(str(old.root / "step-7"), run) == "step-7"
    assert CheckpointStore(tmp_path / "o").latest() == "step-7"
    (old.root / "step-7" / "model.json").write_text("{broken")  # no longer what verified
    with pytest.raises(SpecError, match="no verified checkpoint"):
        resume_checkpoint(str(old.root / "step-7"), _run_with(tmp_path / "x"))


def test_a_checkpoint_keeps_the_gpu_count_of_the_pod_that_wrote_it(tmp_path):
    old = _old_checkpoint(tmp_path, 2)
    assert old.written_gpu_count("step-7") == 2
    assert old.latest() == "step-7"  # the count is beside the manifest, not in its entries
    assert _old_checkpoint(tmp_path / "older", None).written_gpu_count("step-7") is None


def test_resume_from_onto_another_gpu_count_is_refused_before_renting(tmp_path):
    """Per-rank random state and data shards do not carry over to another GPU count."""
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.flows.run.checkpoints import CheckpointStore
    from prefect_runpod.flows.run.recovery import resume_checkpoint

    old = _old_checkpoint(tmp_path, 2)
    with pytest.raises(SpecError) as refused:
        resume_checkpoint(str(old.root.parent), _run_with(tmp_path / "a", gpu_count=1))
    text = str(refused.value)
    assert "step-7 was written on a pod with 2 GPUs and this pod has 1 GPU" in text
    assert "per-rank state" in text and "random generator state" in text
    assert "nothing was rented" in text
    assert CheckpointStore(tmp_path / "a" / "o").names() == []  # nothing copied either
    # The same count resumes.
    assert resume_checkpoint(str(old.root.parent), _run_with(tmp_path / "b", gpu_count=2)) == (
        "step-7"
    )


def test_the_gpu_count_refusal_says_why_and_passes_equal_or_unrecorded_counts():
    from prefect_runpod.flows.run.checkpoints import gpu_count_refusal

    assert gpu_count_refusal("step-3", 4, 4) is None
    assert gpu_count_refusal("step-3", None, 8) is None  # an older checkpoint: not known
    assert gpu_count_refusal("step-3", 0, 0) is None  # local pods
    refusal = gpu_count_refusal("step-3", 4, 8)
    assert refusal is not None and "with 4 GPUs and this pod has 8 GPUs" in refusal
    assert "resume on a pod with 4 GPUs" in (refusal or "")
    assert "with no GPU and this pod has 1 GPU" in (gpu_count_refusal("s", 0, 1) or "")


def test_steps_lost_counts_steps_never_epochs():
    """The demo prints ``epoch 4/6 done: …`` after its step lines: read last, it must not
    make the run think the job is at step 4 (and report 0 steps lost)."""
    from prefect_runpod.flows.run.train_steps import trained_step
    from prefect_runpod.tasks.train_log import parse_progress

    last = None
    for line in (
        '{"progress": 0.6667, "step": 80, "total": 120, "epoch": 4, "epochs": 6}',
        "epoch 4/6 done: eval_accuracy=0.9100",
        "epoch 4/6 [#############.......] 80/120 loss=0.1200",
    ):
        progress = parse_progress(line)
        assert progress is not None, line
        last = trained_step(progress, last)
    assert last == 80


def test_the_recovery_spend_cap_counts_what_the_lost_pods_billed_together():
    """``max_recovery_usd``: the run stops resuming once the pods it lost billed the cap
    together (at it or over it); no cap never stops it."""
    from prefect_runpod.flows.run.attempts import PodAttempt
    from prefect_runpod.flows.run.recovery import lost_spend, recovery_spend_refusal

    pods = [PodAttempt(number=1, usd=0.25), PodAttempt(number=2, usd=0.2), PodAttempt(number=3)]
    pods[2].usd = 5.0  # the pod running now is not a lost one
    assert lost_spend(pods, 1) == 0.25
    assert lost_spend(pods, 2) == pytest.approx(0.45)
    assert recovery_spend_refusal(0.45, None) is None
    assert recovery_spend_refusal(0.45, 0.5) is None
    refusal = recovery_spend_refusal(0.5, 0.5)
    assert (
        refusal
        == "the pods it lost billed 0.500000 USD together, at or over max_recovery_usd 0.5 USD"
    )
    assert "0.600000 USD" in (recovery_spend_refusal(0.6, 0.5) or "")
