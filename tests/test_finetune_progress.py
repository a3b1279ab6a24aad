"""The demo's terminal progress: whole lines, forwards only, every 10 %."""

from __future__ import annotations

from prefect_runpod.flows.finetune import _progress_printer
from prefect_runpod.tasks.train import parse_progress


def test_progress_lines_go_forward_in_tenths(capsys):
    show = _progress_printer("lp-test")
    lines = []
    for step in range(1, 101):
        lines.append(f'{{"progress": {step / 100}, "step": {step}, "total": 100}}')
        lines.append(f"epoch {1 + (step - 1) // 20}/5")  # a coarser counter in between
    for line in lines:
        progress = parse_progress(line)
        assert progress is not None, line
        show(progress)
    printed = capsys.readouterr().err.strip().splitlines()
    percents = [int(p.split("]")[1].split("%")[0]) for p in printed]
    assert percents == sorted(percents) and len(set(percents)) == len(percents)
    assert percents[0] <= 10 and percents[-1] == 100
    assert 9 <= len(percents) <= 11
    assert all(p.startswith("lp-test training [") for p in printed)
    assert printed[-1].endswith("100% step 100/100")
