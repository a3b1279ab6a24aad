"""``prefect-runpod server start|stop|status``: the Prefect server prefect-runpod keeps in
the background when no API is configured (``flows.cli.local_server``; docs/cli.md#the-prefect-server).

``start`` starts it (or says it already runs), ``stop`` ends it (its data stays, and the
next command that needs the API starts it again), ``status`` says whether it runs,
where, which Prefect runs it and where its runs are kept, and which API the other
commands use (a configured ``PREFECT_API_URL`` always wins).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from prefect_runpod.flows.cli.common import EXIT_FAILED
from prefect_runpod.flows.cli.session import EPHEMERAL_VAR

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register ``server`` (``start``, ``stop``, ``status``) under the CLI's subcommands."""
    server = sub.add_parser(
        "server",
        help="the Prefect server prefect-runpod keeps in the background: start, stop, status",
        description="Without PREFECT_API_URL, the first command that needs Prefect's API "
        "starts one Prefect server in the background (loopback, its own database under "
        "~/.prefect-runpod/server) and every later command reuses it, so runs and their "
        "pages in the Prefect UI stay. These commands manage it; a configured "
        "PREFECT_API_URL (your own server, Prefect Cloud) always wins.",
    )
    actions = server.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("start", help="start it (or say that it runs)")
    actions.add_parser("stop", help="stop it; its runs stay for the next start")
    status = actions.add_parser("status", help="whether it runs, where, and which API is used")
    status.add_argument("--json", action="store_true", help="print the status as JSON")


def _configured_api() -> str | None:
    """The API URL the other commands use instead of the local server, when one is set
    (the environment or the active Prefect profile)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return str(url) if url else None


def run(args: argparse.Namespace) -> int:
    """Carry out ``prefect-runpod server ACTION``; exit 0, or 1 when the server did not
    start."""
    from prefect_runpod.flows.cli import local_server as ls

    home = ls.server_home()
    if args.action == "stop":
        stopped = ls.stop_server(home)
        if stopped is None:
            print(f"no prefect-runpod Prefect server runs (its data is in {home})")
        else:
            print(
                f"stopped the Prefect server at {stopped.ui_url} (pid {stopped.pid}); its runs "
                f"stay in {home} for the next start"
            )
        return 0
    if args.action == "start":
        from prefect_runpod.flows.cli.arguments import make_home

        make_home(home, "the Prefect server's home", "PREFECT_RUNPOD_HOME")  # else exit 2
        try:
            record = ls.ensure_server(say=lambda line: print(line, file=sys.stderr, flush=True))
        except ls.ServerStartError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(
            f"the Prefect server runs at {record.ui_url} (pid {record.pid}, Prefect "
            f"{record.prefect_version}); runs kept in {home}"
        )
        _note_configured()
        return 0
    return _status(args, home)


def _note_configured() -> None:
    configured = _configured_api()
    if configured:
        print(
            f"note: PREFECT_API_URL is set ({configured}): commands use that server, not this one",
            file=sys.stderr,
        )


def _status(args: argparse.Namespace, home: Any) -> int:
    from prefect_runpod.flows.cli import local_server as ls

    record = ls.read_live_record(home)
    configured = _configured_api()
    ephemeral = os.environ.get(EPHEMERAL_VAR, "").strip().lower()
    data: dict[str, Any] = {
        "running": record is not None,
        "home": str(home),
        "installed_prefect_version": ls.installed_prefect_version(),
        "server": asdict(record) if record is not None else None,
        "configured_api_url": configured,
        "commands_use": configured
        or ("a temporary server per command" if ephemeral in ("1", "true", "yes") else None)
        or (record.api_url if record is not None else "this server, started on first use"),
    }
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    if record is None:
        print(f"no prefect-runpod Prefect server runs; its data is in {home}")
    else:
        print(
            f"the Prefect server runs at {record.ui_url} (pid {record.pid}, Prefect "
            f"{record.prefect_version}, since {record.started_at}); runs kept in {home}, "
            f"log {record.log_path}"
        )
    print(f"commands use: {data['commands_use']}")
    return 0
