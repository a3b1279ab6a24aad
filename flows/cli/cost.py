"""``prefect-runpod cost [RUN_ID] [--since WHEN] [--reconcile]``: what runs cost, ours
beside RunPod's, with totals (like ``sky cost-report``).

Without ``RUN_ID`` it lists the latest ``finetune-costs`` record of recent runs (those
whose pod was created since ``--since``: ``7d``, ``24h``, ``30m`` or an ISO-8601 UTC
time), each with its pod, GPU, billed seconds, USD and RunPod's amount once known, and
the totals; with one it shows that run's record. ``--reconcile`` completes a record whose run could not
(docs/architecture.md#what-a-run-cost): a run SIGKILLed while its pod lived, a pod ended
by its dead-man, RunPod's bill that appeared after the run ended. It
asks the pod's provider (built from the run's own parameters) whether the pod is gone
and when, fills in RunPod's bill (REST v2 billing: its GPU, CPU and disk amounts shown
beside our estimate), writes a new version of the record and rewrites ``run-report.json``
when it can be reached from here. A local pod has no bill: it says so. A run whose pod
ended while Prefect still says it runs (its process was killed) is reported with the
command that marks it Crashed (``--mark-crashed``).

A subcommand module: ``add_parser`` registers it with the CLI, ``run`` checks its input
and carries it out through :mod:`.cost_report` (where ``reconcile`` and ``totals`` are),
imported only then: building the CLI's parser loads none of the run's records.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["add_parser", "parse_since", "run"]


def add_parser(
    sub: Any,  # argparse's _SubParsersAction
    provider_args: Callable[[argparse.ArgumentParser], None],
) -> argparse.ArgumentParser:
    """Register ``cost`` under the CLI's subcommands.

    Args:
        sub: the CLI's subparsers.
        provider_args: adds the provider options (``--provider``, blocks) the other
            commands share; here they override the run's own parameters.

    Returns:
        The ``cost`` parser.
    """
    cost = sub.add_parser(
        "cost",
        help="what runs cost (ours and RunPod's); --reconcile completes a record",
        description="Show the finetune-costs record of a run (or of recent runs): who ended "
        "the pod and when, billed seconds and USD (ours), RunPod's own bill beside it. "
        "--reconcile completes records that may still say 'billing': it asks the pod's "
        "provider whether the pod is gone and when, and RunPod's billing API for its bill.",
    )
    cost.add_argument("run_id", nargs="?", metavar="RUN_ID", help="the flow run id")
    cost.add_argument(
        "--reconcile",
        action="store_true",
        help="complete the record(s): the pod's end from its provider, RunPod's bill",
    )
    cost.add_argument(
        "--mark-crashed",
        action="store_true",
        help="with --reconcile: set a run Crashed whose pod ended while Prefect still says "
        "it runs (its process was killed)",
    )
    cost.add_argument(
        "--limit", type=int, default=20, help="recent runs to list (default 20, at most 1000)"
    )
    cost.add_argument(
        "--since",
        metavar="WHEN",
        help="only runs whose pod was created since then: 7d, 24h, 30m, or an ISO-8601 UTC "
        "time such as 2026-12-01T00:00:00Z",
    )
    cost.add_argument(
        "--json", action="store_true", help="print {runs: [records], totals: {...}} as JSON"
    )
    provider_args(cost)
    cost.set_defaults(provider=None)
    from prefect_runpod.flows.cli.common import api_args

    api_args(cost)
    return cost


_SINCE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SINCE_MAX_SECONDS = 100 * 365 * 86400
"""How far back ``--since`` may reach (100 years: further would leave the datetime range)."""


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """The moment ``--since`` names: a duration back from ``now`` (``30m``, ``24h``,
    ``7d``, ``2w``) or an ISO-8601 time (UTC when it carries no offset).

    Raises:
        SpecError: anything else, with the forms it takes.
    """
    from prefect_runpod.blocks.exceptions import SpecError

    value = text.strip()
    now = now or datetime.now(UTC)
    match = _SINCE.fullmatch(value.lower())
    if match:
        amount = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        if not amount <= _SINCE_MAX_SECONDS:
            raise SpecError(
                f"--since {text!r} reaches back more than {_SINCE_MAX_SECONDS // 86400} days: "
                "give a shorter duration (7d) or an ISO-8601 time"
            )
        return now - timedelta(seconds=amount)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SpecError(
            f"--since {text!r} is not a duration (30m, 24h, 7d, 2w) or an ISO-8601 time "
            "(2026-12-01T00:00:00Z)"
        ) from None
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    if when > now:
        raise SpecError(f"--since {text!r} is in the future: give a time before now")
    return when


def run(
    args: argparse.Namespace,
    api: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> int:
    """Carry out ``prefect-runpod cost``; returns the exit status (1 when a record still
    says its pod may be billing).

    Args:
        args: the parsed command line.
        api: opens the Prefect API for the command (the CLI's temporary server, or the
            configured one), once the input passed.
    """
    from prefect_runpod.blocks.validation import check_flow_run_id

    run_id = None if args.run_id is None else check_flow_run_id(args.run_id)
    args.since_at = None if args.since is None else parse_since(args.since)
    with api():
        from prefect_runpod.flows.cli.cost_report import show_costs

        return show_costs(args, run_id)
