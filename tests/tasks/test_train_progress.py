"""The fine-tune's terminal progress (the train stage's ``terminal_progress_bar``):
whole lines, forwards only, every 10 %, each naming the pod."""

from __future__ import annotations

import io

from prefect_runpod.tasks.train import Progress, parse_progress, terminal_progress_bar


def test_progress_lines_go_forward_in_tenths(capsys):
    show = terminal_progress_bar(pod_id="lp-test")
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


def test_the_flows_lines_are_unchanged(capsys):
    """The exact lines the fine-tune flow printed before the display moved to the train
    stage: first progress, then every 10 whole percent, 100 % once, no ``\\r``."""
    show = terminal_progress_bar(pod_id="lp-abc123")
    for progress in [
        Progress(0.0, 0, 200),
        Progress(0.004, 1, 250),
        Progress(0.099, 99, 1000),
        Progress(0.1, 100, 1000),
        Progress(0.155, 31, 200),
        Progress(0.2, 2, 10, unit="epoch"),
        Progress(0.15, 3, 20),  # backwards: never shown
        Progress(0.347, unit="fraction"),
        Progress(0.58, 58, 100),  # 57.99… % is 57 whole percent
        Progress(0.999, 999, 1000),
        Progress(1.0, 100, 100),
        Progress(1.0, 100, 100),
    ]:
        show(progress)
    assert capsys.readouterr().err == (
        "lp-abc123 training [....................]   0% step 0/200\n"
        "lp-abc123 training [##..................]  10% step 100/1000\n"
        "lp-abc123 training [####................]  20% epoch 2/10\n"
        "lp-abc123 training [######..............]  34%\n"
        "lp-abc123 training [###########.........]  57% step 58/100\n"
        "lp-abc123 training [###################.]  99% step 999/1000\n"
        "lp-abc123 training [####################] 100% step 100/100\n"
    )


def test_step_percent_sets_the_spacing(capsys):
    show = terminal_progress_bar(pod_id="pod9", step_percent=25)
    for percent in range(0, 101, 3):
        show(Progress(percent / 100, percent, 100))
    assert capsys.readouterr().err == (
        "pod9 training [....................]   0% step 0/100\n"
        "pod9 training [#####...............]  27% step 27/100\n"
        "pod9 training [##########..........]  54% step 54/100\n"
        "pod9 training [################....]  81% step 81/100\n"
    )


def test_stream_and_width_without_a_pod():
    screen = io.StringIO()
    draw = terminal_progress_bar(screen, width=10)
    draw(Progress(0.4, 40, 100))
    draw(Progress(1.0, 100, 100))
    assert screen.getvalue() == (
        "training [####......]  40% step 40/100\ntraining [##########] 100% step 100/100\n"
    )
