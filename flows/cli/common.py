"""What every ``prefect-runpod`` command shares: the exit statuses, the provider options,
the Prefect API a command opens, quiet console tracebacks, and the output helpers
(a rich table, or the same rows as JSON with ``--json``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "EXIT_FAILED",
    "EXIT_USAGE",
    "PROVIDER_PARAMETERS",
    "add_parameter_options",
    "age_text",
    "api",
    "api_args",
    "api_for_blocks",
    "names_saved_block",
    "print_json",
    "print_ssh_lines",
    "print_table",
    "provider_args",
    "provider_params",
    "quiet_console_tracebacks",
]

EXIT_FAILED = 1
"""A run (or a command) that started and failed; for ``plan``/``check``: a precondition fails."""
EXIT_USAGE = 2
"""Bad input, refused before anything started: nothing was rented."""


def add_parameter_options(parser: argparse.ArgumentParser, names: list[str]) -> None:
    """Add the CLI option of each run parameter in ``names``, as its one declaration says
    (``blocks.validation.parameters``): the option, its help, its default, its type or
    choices, and ``dest`` = the parameter's name. A ``bool`` is a flag, a ``list`` an
    option to repeat.

    Raises:
        KeyError: a name that is no run parameter (a programming error).
    """
    from prefect_runpod.blocks.validation.parameters import literal_choices, parameter

    for name in names:
        p = parameter(name)
        assert p.option is not None, name
        kw: dict[str, Any] = {"dest": p.name, "help": p.cli_help}
        if p.annotation == "bool":
            kw["action"] = "store_true"
        elif p.annotation.startswith("list["):
            kw["action"] = "append"
        else:
            kw["default"] = p.default
            number = p.annotation.split(" ")[0]
            if number in ("float", "int"):
                kw["type"] = float if number == "float" else int
            choices = p.choice_list() or literal_choices(p)
            if choices:
                kw["choices"] = choices
        if p.metavar:
            kw["metavar"] = p.metavar
        parser.add_argument(p.option, **kw)


PROVIDER_PARAMETERS = [
    "provider",
    "name_prefix",
    "runpod_credentials_block",
    "runpod_spec_block",
    "ssh_key_block",
]
"""The run parameters that pick a provider and its saved blocks, for the commands that
list and end pods."""


def provider_args(p: argparse.ArgumentParser) -> None:
    """Add the options that pick a provider and its saved blocks (``--provider``,
    ``--name-prefix``, ``--runpod-credentials``, ``--runpod-spec``, ``--ssh-key``)."""
    add_parameter_options(p, PROVIDER_PARAMETERS)


def provider_params(args: argparse.Namespace) -> dict[str, Any]:
    """The provider's parameters (as ``flows.run.providers.build_provider`` takes them) from
    the options ``provider_args`` added.

    Raises:
        SpecError: a malformed ``--name-prefix``.
    """
    from prefect_runpod.blocks.validation import check_name_prefix

    check_name_prefix(args.name_prefix)
    return {name: getattr(args, name) for name in PROVIDER_PARAMETERS if name != "name_prefix"}


def _named_blocks(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v and k.endswith(("_block", "_secret"))}


def names_saved_block(params: dict[str, Any]) -> bool:
    """Whether a command's parameters name a saved block (read from the Prefect API, so
    the API is opened before they are checked)."""
    return bool(_named_blocks(params))


def api_for_blocks(params: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
    """The Prefect API when ``params`` name a saved block (to read it), else nothing: input
    that names no block is checked without a server, and a name that cannot be a block's
    is refused before one starts.

    Raises:
        SpecError: a block name of the wrong shape (``check_block_name``).
    """
    named = _named_blocks(params)
    if not named:
        return contextlib.nullcontext()
    from prefect_runpod.blocks.validation import check_block_name

    for param, name in named.items():
        check_block_name(name, param)
    return api()


def api_args(p: argparse.ArgumentParser, *, top_level: bool = False) -> None:
    """Add ``--ephemeral`` (a temporary Prefect server for this command alone, instead of
    the one prefect-runpod keeps in the background). Given before the command or after it;
    ``PREFECT_RUNPOD_EPHEMERAL=1`` does the same."""
    p.add_argument(
        "--ephemeral",
        action="store_true",
        # a subcommand's own default would overwrite the one given before the command
        default=False if top_level else argparse.SUPPRESS,
        help="without PREFECT_API_URL: start a temporary Prefect server for this command "
        "alone (its UI links stop working when the command ends) instead of using the one "
        "prefect-runpod keeps in the background",
    )


def api() -> contextlib.AbstractContextManager[str]:
    """The Prefect API for a command that needs one, opened only once its input passed:
    the configured one, else the local server prefect-runpod keeps (started on first
    use), else with ``--ephemeral`` a temporary one (``flows.cli.session.prefect_api``)."""
    from prefect_runpod.flows.cli.session import prefect_api

    return prefect_api()


class _NoTraceback(logging.Formatter):
    """A console formatter that leaves tracebacks out: the run's summary names the error,
    and the full traceback still reaches the Prefect API's logs."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def quiet_console_tracebacks(verbosity: str = "normal") -> None:
    """Set up Prefect's console handlers for a command (idempotent): a formatter without
    tracebacks, and the ``flows.run.logs.ConsoleFilter`` for ``verbosity`` (``quiet``,
    ``normal``, ``verbose``; see ``--quiet`` / ``--verbose``)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    from prefect_runpod.flows.run.logs import ConsoleFilter

    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if not isinstance(handler, PrefectConsoleHandler):
                continue
            if not isinstance(handler.formatter, _NoTraceback):
                handler.setFormatter(_NoTraceback(handler.formatter))
            for old in [f for f in handler.filters if isinstance(f, ConsoleFilter)]:
                handler.removeFilter(old)
            handler.addFilter(ConsoleFilter(verbosity))  # type: ignore[arg-type]


def print_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout (datetimes as ISO-8601 text)."""
    print(json.dumps(data, indent=2, default=str))


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, empty: str = ""
) -> None:
    """Print rows as a rich table on stdout, or ``empty`` (one line) when there are none.

    Args:
        title: the table's title.
        columns: the header, units in the names (``USD/h``, ``age``).
        rows: one sequence of cells per row, in ``columns``' order (None shows ``-``).
        empty: what to print (on stderr) instead of an empty table.
    """
    from rich.console import Console
    from rich.table import Table

    if not rows and empty:
        print(empty, file=sys.stderr)  # stdout stays empty: no rows
        return
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("-" if cell is None else str(cell) for cell in row))
    width = None if sys.stdout.isatty() else 200
    Console(width=width, soft_wrap=False).print(table)


def print_ssh_lines(ways_in: Sequence[tuple[str, str | None]]) -> None:
    """After a table, each live pod's ssh line on a line of its own, under a ``# label``
    line (a shell ignores it when both are pasted): a table cell folds a long line, which
    then fails when pasted. Nothing when no pod is live.

    Args:
        ways_in: ``(label, ssh line or None)`` per row, in the table's order.
    """
    shown = [(label, line) for label, line in ways_in if line]
    if not shown:
        return
    print("\nget in with (the pod's host key pinned; paste as it is):")
    for label, line in shown:
        print(f"# {label}")
        print(line)


def age_text(since: datetime | None, now: datetime | None = None) -> str:
    """How long ago ``since`` was, as a person reads it: ``42s``, ``7m``, ``3h05m``, ``2d4h``.

    Args:
        since: a UTC time, or None (``-``).
        now: the present (default: now, UTC).
    """
    if since is None:
        return "-"
    seconds = max(0, int(((now or datetime.now(UTC)) - since).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"
