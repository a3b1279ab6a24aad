"""The command line before any command runs: ``--help``, ``--version`` and every usage or
argument error answer without importing Prefect, paramiko or httpx (measured in
``benchmarks/cockpit.py``: ``--help`` took 1.4 s, 1.0 s of it importing Prefect), nor
the transfer dispatcher or a run's records, which only the commands that use them load
(``pods`` was 1.02 x ``prefect flow-run ls``); a
subcommand's errors show that subcommand's usage; help texts say what a value is."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from prefect_runpod.flows.cli import EXIT_USAGE, build_parser, main

HEAVY = (
    "prefect",
    "paramiko",
    "httpx",
    "tenacity",
    "prefect_runpod.blocks.transfer.dispatch",
    "prefect_runpod.flows.run.report",
    "prefect_runpod.flows.run.cost_record",
)
RUN_ID = "6a1f0c2e-0000-4000-8000-000000000000"

# Each answers before any command opens the Prefect API: argparse's usage errors, and the
# commands' own checks of ids, numbers and names.
CASES = [
    (["--help"], 0),
    (["--version"], 0),
    *[([command, "--help"], 0) for command in (
        "finetune", "plan", "check", "status", "logs", "ssh", "pods", "terminate", "reaper",
        "cost", "server",
    )],
    ([], EXIT_USAGE),
    (["nope"], EXIT_USAGE),
    (["status", "--bogus"], EXIT_USAGE),
    (["status", "not-a-run-id"], EXIT_USAGE),
    (["status", "--limit", "ten"], EXIT_USAGE),
    (["logs"], EXIT_USAGE),
    (["logs", "not-a-run-id"], EXIT_USAGE),
    (["logs", RUN_ID, "--max-seconds", "nan"], EXIT_USAGE),
    (["ssh", "NOT_A_POD"], EXIT_USAGE),
    (["ssh", "not-a-run-id"], EXIT_USAGE),
    (["pods", "--name-prefix", "Bad"], EXIT_USAGE),
    (["pods", "--provider", "aws"], EXIT_USAGE),
    (["terminate"], EXIT_USAGE),
    (["terminate", "NOT_A_POD"], EXIT_USAGE),
    (["reaper", "--ttl-seconds", "nan"], EXIT_USAGE),
    (["reaper", "--name-prefix", "Bad"], EXIT_USAGE),
    (["cost", "not-a-run-id"], EXIT_USAGE),
    (["cost", "--since", "yesterday"], EXIT_USAGE),
    (["finetune", "--transfer", "carrier-pigeon"], EXIT_USAGE),
    (["finetune", "--max-cost-usd", "lots"], EXIT_USAGE),
    (["plan", "--pty-streams", "many"], EXIT_USAGE),
    (["server"], EXIT_USAGE),
    (["server", "restart"], EXIT_USAGE),
]  # fmt: skip

_PROBE = """
import contextlib, io, json, sys
from prefect_runpod.flows.cli import main
found = []
for argv, want in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    found.append([argv, code, [m for m in json.loads(sys.argv[2]) if m in sys.modules]])
print(json.dumps(found))
"""


def _probe(cases: list[tuple[list[str], int]], modules: list[str] | tuple[str, ...]):
    """Each case's argv, exit status and the ``modules`` loaded once it ran, from one
    fresh interpreter that runs ``cases`` in turn."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(cases), json.dumps(modules)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_help_and_every_argument_error_import_nothing_heavy():
    """One fresh interpreter runs every case in turn: ``sys.modules`` only grows, so the
    first case that shows a heavy module is the one that imported it."""
    for (argv, want), (_, code, heavy) in zip(CASES, _probe(CASES, HEAVY), strict=True):
        assert code == want, (argv, code)
        assert heavy == [], f"prefect-runpod {' '.join(argv)} imported {heavy}"


def test_help_loads_no_model_library():
    """``--help`` (each command's too) builds its options from the parameter table
    without pydantic or packaging (about 0.1 s of the 0.3 s it may take): only a command
    that checks a value loads them."""
    helps = [case for case in CASES if case[0][-1:] in (["--help"], ["--version"])]
    light = ["pydantic", "pydantic_core", "packaging.requirements", *HEAVY]
    for argv, code, loaded in _probe(helps, light):
        assert (code, loaded) == (0, []), f"prefect-runpod {' '.join(argv)} imported {loaded}"


def test_a_subcommands_error_shows_that_subcommands_usage(capsys):
    """argparse handed unknown options up to the top-level parser, whose usage
    (``prefect-runpod [-h] COMMAND ...``) said nothing about the command's options."""
    assert main(["status", "--bogus"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: prefect-runpod status [-h]")
    assert err.rstrip().endswith("prefect-runpod status: error: unrecognized arguments: --bogus")
    assert main(["finetune", "--bundle"]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("usage: prefect-runpod finetune [-h]")


def test_version_names_this_package_prefect_and_python(capsys):
    from importlib.metadata import version

    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    python = ".".join(str(n) for n in sys.version_info[:3])
    assert out == (
        f"prefect-runpod {version('prefect-runpod')} (Prefect {version('prefect')}, "
        f"Python {python})"
    )


def test_the_command_exits_with_its_heap_frozen():
    """``prefect-runpod`` (the installed script and ``python -m``) freezes the heap before
    Python's teardown, whose garbage collections over Prefect's modules took about 0.4 s
    of every command; the exit status is ``main``'s and the exit handlers still run."""
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="prefect-runpod")
    assert script.value == "prefect_runpod.flows.cli:console_main"
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
        "sys.argv = ['prefect-runpod', 'status', 'not-a-run-id']\n"
        "from prefect_runpod.flows.cli import console_main\n"
        "console_main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert (proc.returncode, proc.stdout) == (EXIT_USAGE, "frozen True\n"), proc.stderr


def _option(command: str, flag: str):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001
    return next(a for a in sub.choices[command]._actions if flag in a.option_strings)  # noqa: SLF001


@pytest.mark.parametrize("command", ["finetune", "plan"])
def test_the_concurrency_limit_option_says_it_takes_a_limits_name(command):
    option = _option(command, "--concurrency-limit")
    assert option.metavar == "LIMIT_NAME"
    assert option.help.startswith("the name of a Prefect global concurrency limit")


@pytest.mark.parametrize("where", [["--ephemeral", "status"], ["status", "--ephemeral"]])
def test_ephemeral_is_taken_before_or_after_the_command(where):
    assert build_parser().parse_args(where).ephemeral is True
    assert build_parser().parse_args(["status"]).ephemeral is False


def test_the_transfer_choices_are_the_registered_methods():
    """``--transfer`` lists its choices from ``blocks.defaults`` (no transfer code loaded
    for ``--help``): they must be the methods the registry holds."""
    from prefect_runpod.tasks.preflight import transfer_methods

    assert tuple(_option("finetune", "--transfer").choices) == transfer_methods()


@pytest.mark.parametrize("argv", [["finetune", "--max-cost", "2"], ["cost", "--lim", "5"]])
def test_an_abbreviated_option_is_refused_not_guessed(argv, capsys):
    """argparse took ``--max-cost 2`` as ``--max-cost-usd 2`` and ran the fine-tune: with real
    money an option is spelt out, or refused by name."""
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(argv)
    assert stopped.value.code == EXIT_USAGE
    assert f"unrecognized arguments: {argv[1]}" in capsys.readouterr().err
