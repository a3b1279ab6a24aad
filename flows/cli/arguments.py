"""The CLI's argument phase: everything decidable from the command line and the files it
names, checked before Prefect is imported (docs/architecture.md#input-validation).

``spell_negative_values`` lets a value that starts with ``-`` reach its option
(argparse would read ``--since -5d`` or ``--max-runtime-seconds -inf`` as an option
and answer "expected one argument"); ``check_arguments`` then applies the validation
layer to the parsed arguments of any command: every number with a rule, every id and
prefix, ``cost --since``, and for ``finetune`` the run's parameters and bundle
(``tasks.preflight.validate_settings``). What needs the Prefect API (saved blocks, the
concurrency limit, the API itself) comes after, in ``flows.run.inputs``.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prefect_runpod.blocks import validation as v

__all__ = [
    "check_api_url",
    "check_arguments",
    "make_home",
    "make_prefect_home",
    "spell_negative_values",
]

_NEGATIVE_VALUE = re.compile(r"-(\d|\.\d|inf|nan)", re.IGNORECASE)


def _check_block_name(block: Any, name: str) -> str:
    return v.check_block_name(block, name)


_ID_CHECKS: dict[str, Callable[[Any], Any]] = {
    "name_prefix": v.check_name_prefix,
    "pod_id": v.check_pod_id,
    "run_id": v.check_flow_run_id,
    "run": v.check_flow_run_id,
    "concurrency_limit": v.check_limit_name,
    "hf_token_env": v.check_env_name,
    "hf_endpoint": lambda url: v.check_url(url, "hf_endpoint"),
    **{
        name: functools.partial(_check_block_name, name=name)
        for name in (
            "runpod_credentials_block",
            "runpod_spec_block",
            "ssh_key_block",
            "hf_credentials_block",
            "hf_token_secret",
            "s3_target_block",
        )
    },
}
"""Arguments checked by name in every command that has them (``status RUN`` and ``logs
RUN`` take a flow run id, ``terminate POD_ID`` a pod id, ``pods``, ``ssh``, ``reaper``
and ``cost`` the provider's saved blocks), so a malformed one is refused before the
Prefect API is opened to look it up."""


def spell_negative_values(argv: Sequence[str]) -> list[str]:
    """``--option -5d`` written as ``--option=-5d``, so argparse gives a value that
    starts with a minus sign (``-5``, ``-0.5``, ``-inf``, ``-1e3``, ``-5d``) to its
    option, and the validation layer refuses it with its own sentence. Nothing after
    ``--`` is touched.

    Args:
        argv: the command line, without the program name.

    Returns:
        The same arguments, each such pair joined.
    """
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out.extend(args[i:])
            break
        if (
            arg.startswith("--")
            and "=" not in arg
            and i + 1 < len(args)
            and _NEGATIVE_VALUE.match(args[i + 1])
        ):
            out.append(f"{arg}={args[i + 1]}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def check_arguments(args: argparse.Namespace) -> None:
    """Check a parsed command line with the validation layer, without Prefect.

    Every argument whose name has a number rule (``validation.NUMBER_RULES``: ``--limit``,
    ``--max-seconds``, ``--ttl-seconds``, the run's numbers) or an id rule is checked;
    ``cost --since`` is read; ``finetune`` checks its parameters and bundle and keeps the
    ``RunSettings`` on ``args.settings`` for the run.

    Raises:
        SpecError: the first problem, one sentence (the CLI exits 2).
    """
    for name, value in vars(args).items():
        if value is None:
            continue
        if name in v.NUMBER_RULES:
            v.check_number(name, value)
        elif name in _ID_CHECKS:
            _ID_CHECKS[name](value)
    if args.command == "cost" and args.since is not None:
        from prefect_runpod.flows.cli.cost import parse_since

        parse_since(args.since)
    if args.command == "finetune":
        args.settings = _finetune_settings(args)


def _finetune_settings(args: argparse.Namespace) -> Any:
    from prefect_runpod.blocks.validation.parameters import FINETUNE_PARAMETERS
    from prefect_runpod.tasks.preflight import validate_settings

    params = {p.name: getattr(args, p.name) for p in FINETUNE_PARAMETERS}
    if params["bundle"] is None:
        from prefect_runpod.tasks.bundle import demo_bundle

        params["bundle"] = demo_bundle()
    given = params["output_dir"] is not None
    if not given:
        params["output_dir"] = Path.cwd() / "prefect-runpod-runs"
    settings = validate_settings(**params)
    if given:  # an earlier run's files there are not written over without --overwrite
        v.check_output_dir_unused(Path(settings.output_dir), overwrite=bool(params["overwrite"]))
    return settings


def check_api_url(environ: dict[str, str] | None = None) -> None:
    """``PREFECT_API_URL``, when the environment sets it, is an ``http(s)`` URL, checked
    before Prefect is imported: Prefect reads it when it loads its settings, and a value
    it cannot parse (``http://[::1``) fails that load with a traceback. Whether the API
    answers is checked later, once Prefect is loaded (``flows.cli.session.check_prefect_api``).

    Args:
        environ: the environment (default: this process's).

    Raises:
        SpecError: it is set and malformed, in one sentence.
    """
    url = (os.environ if environ is None else environ).get("PREFECT_API_URL")
    if url:
        v.check_url(url, "PREFECT_API_URL", example="http://127.0.0.1:4200/api")


def make_prefect_home(home: str | Path | None = None) -> Path:
    """Make Prefect's home folder (``PREFECT_HOME``, else ``~/.prefect``), before Prefect
    is imported: Prefect only warns when it cannot, then fails later with a traceback
    (and without its parent folder it retries its database for minutes).

    Args:
        home: the folder (default: as Prefect picks it from the environment).

    Returns:
        The folder.

    Raises:
        SpecError: it cannot be created (a read-only HOME), in one sentence.
    """
    path = Path(home or os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    return make_home(path, "Prefect's home", "PREFECT_HOME")


def make_home(path: Path, what: str, variable: str) -> Path:
    """Make a folder a command keeps its state in (with its parents), or say in one
    sentence why it cannot be made and which variable moves it.

    Args:
        path: the folder.
        what: what it is, for the message (``Prefect's home``).
        variable: the environment variable that puts it elsewhere (``PREFECT_HOME``).

    Returns:
        The folder.

    Raises:
        SpecError: it cannot be created (a read-only or missing HOME).
    """
    from prefect_runpod.blocks.exceptions import SpecError

    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(
            f"{what} {path} cannot be created ({exc.strerror}): make HOME writable, "
            f"or set {variable} to a folder this user can write"
        ) from None
    return path
