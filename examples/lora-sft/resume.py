"""Checkpoints the LoRA fine-tune resumes from, laid out as the Hugging Face Trainer
lays out its own (``checkpoint-<step>/``):

- ``adapter_model.safetensors`` / ``adapter_config.json``: the LoRA adapter (peft);
- ``optimizer.pt`` / ``scheduler.pt``: the optimizer's and the learning-rate
  scheduler's ``state_dict``;
- ``rng_state.pth``: every random generator the run draws from — Python's ``random``,
  the data order's own ``random.Random``, torch's CPU generator and each CUDA device's;
- ``trainer_state.json``: the step and the epoch it ends;
- ``COMPLETE``, written last: the checkpoint is whole (the bundle's
  ``checkpoint_marker``; a checkpoint without it is never resumed from).

Everything is saved so that ``torch.load(..., weights_only=True)`` — torch 2.6's
default — loads it: tensors, numbers, strings, lists, tuples and dicts only (Python's
``random`` state is a tuple of ints), so no pickle of arbitrary objects is trusted.
A run resumed from a checkpoint ends with the adapter an uninterrupted run trains.
"""

import json
import os
import random
import shutil

import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file

MARKER = "COMPLETE"
RNG_STATE = "rng_state.pth"
TRAINER_STATE = "trainer_state.json"


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def save(folder, step, epoch, model, optimizer, scheduler, data_rng, keep=3):
    """Write ``folder/checkpoint-<step>/`` whole, ``COMPLETE`` last; keep the newest
    ``keep`` complete ones. Returns the checkpoint's path."""
    path = os.path.join(folder, f"checkpoint-{step}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    model.save_pretrained(path)
    torch.save(optimizer.state_dict(), os.path.join(path, "optimizer.pt"))
    torch.save(scheduler.state_dict(), os.path.join(path, "scheduler.pt"))
    rng = {
        "python": random.getstate(),
        "data": data_rng.getstate(),
        "cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    torch.save(rng, os.path.join(path, RNG_STATE))
    with open(os.path.join(path, TRAINER_STATE), "w", encoding="utf-8") as fh:
        json.dump({"global_step": step, "epoch": epoch}, fh, sort_keys=True)
    with open(os.path.join(path, MARKER), "w", encoding="utf-8") as fh:
        fh.write(str(step))  # last: the checkpoint is complete
    done = sorted(
        (int(n.split("-", 1)[1]), n)
        for n in os.listdir(folder)
        if n.startswith("checkpoint-") and n.split("-", 1)[1].isdigit()
        and os.path.exists(os.path.join(folder, n, MARKER))
    )  # fmt: skip
    for _, name in done[:-keep]:
        shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
    return path


def load(path, model, optimizer, scheduler, data_rng):
    """Restore a ``save`` checkpoint into a freshly built model, optimizer, scheduler
    and data generator; returns ``(step, epoch)``.

    Raises:
        ValueError: ``path`` has no ``COMPLETE`` marker (not whole: never resumed from).
    """
    if not os.path.exists(os.path.join(path, MARKER)):
        raise ValueError(f"{path} has no {MARKER} marker: it is not a complete checkpoint")
    set_peft_model_state_dict(model, load_file(os.path.join(path, "adapter_model.safetensors")))
    optimizer.load_state_dict(_load(os.path.join(path, "optimizer.pt")))
    scheduler.load_state_dict(_load(os.path.join(path, "scheduler.pt")))
    with open(os.path.join(path, TRAINER_STATE), encoding="utf-8") as fh:
        state = json.load(fh)
    rng_file = os.path.join(path, RNG_STATE)
    if os.path.exists(rng_file):
        rng = _load(rng_file)
        random.setstate(_as_tuple(rng["python"]))
        data_rng.setstate(_as_tuple(rng["data"]))
        torch.set_rng_state(rng["cpu"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    else:
        print(
            f"warning: {path} holds no {RNG_STATE}: the data order and dropout will differ",
            flush=True,
        )
    return state["global_step"], state["epoch"]


def _as_tuple(state):
    """``random.getstate()``'s shape (``(version, (ints…), gauss)``) from what was saved."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
