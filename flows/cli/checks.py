"""Before renting: ``check`` (is this machine set up? like ``sky check``) and ``plan``
(would this fine-tune start, and what would it cost? nothing is rented).

Both print one line per check, ``✔`` or ``✘`` with the fix, and exit 0 when every
required check passed, 1 when one failed; argparse's own usage errors exit 2.

- ``check``: the Prefect API, the local tools, the Hugging Face token (``whoami``), and
  RunPod's key (the account's SSH keys read through the client the credentials choose:
  the line says which API answered, REST v2 or the GraphQL fallback) and whether those
  keys hold ours (required with ``--provider runpod``; shown with ``-`` otherwise).
- ``plan`` takes ``finetune``'s options and runs the same pre-rent checks the run does
  (``flows.run.inputs.check_run``: inputs, bundle, blocks, provider, token source,
  transfer method against the pod to rent, disk, the GPU ids and CUDA floor against
  RunPod's catalog), the local Hugging Face diagnosis (``tasks.preflight``), the CUDA
  floor from the bundle's requirements and, on RunPod, the account's SSH key; then the
  price: the GPU types in failover order with USD/h and availability (one read of REST
  v2's catalog; over GraphQL the SDK's prices beside it), and an estimate from the
  bundle's ``expected_runtime_seconds``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.secret_mask import error_text
from prefect_runpod.flows.cli.common import (
    EXIT_FAILED,
    add_parameter_options,
    api,
    api_args,
    print_json,
    print_table,
)

__all__ = ["Item", "add_parsers", "run_check", "run_plan"]


@dataclass
class Item:
    """One line of ``check`` or ``plan``.

    Attributes:
        name: what was checked.
        ok: True passed, False failed, None not applicable here (``-``).
        detail: what was found, or the problem with its fix.
        required: whether a failure fails the command.
    """

    name: str
    ok: bool | None
    detail: str
    required: bool = True

    @property
    def mark(self) -> str:
        """``✔``, ``✘`` or ``-``."""
        return "-" if self.ok is None else "✔" if self.ok else "✘"


def add_parsers(sub: Any) -> None:
    """Register ``check`` and ``plan`` under the CLI's subcommands."""
    from prefect_runpod.flows.cli.launch import add_finetune_options

    check = sub.add_parser(
        "check",
        help="is this machine ready? Prefect API, tools, HF token, RunPod key and SSH key",
        description="Check what runs need on this machine, each with ✔ or ✘ and the fix: "
        "the Prefect API, the local tools, the Hugging Face token, and RunPod's API key and "
        "the account's SSH key. Exit 0 when all required checks pass, 1 when one fails.",
    )
    add_parameter_options(
        check,
        [
            "provider",
            "runpod_credentials_block",
            "ssh_key_block",
            "hf_credentials_block",
            "hf_token_secret",
            "hf_token_env",
            "hf_endpoint",
        ],
    )
    check.add_argument("--json", action="store_true", help="print the checks as JSON")
    api_args(check)

    plan = sub.add_parser(
        "plan",
        help="every precondition of a fine-tune and its price; rents nothing",
        description="Take finetune's options and check everything that can be checked "
        "before renting (the run's own pre-rent checks, the Hugging Face diagnosis, the CUDA "
        "floor, the account's SSH key), then price it: GPU types in failover order with "
        "USD/h and availability, and an estimate from the bundle's expected_runtime_seconds. "
        "Exit 0: finetune would start; 1: a precondition fails (each ✘ with its fix).",
    )
    add_finetune_options(plan)
    api_args(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")


def _show(title: str, items: list[Item], as_json: bool, extra: dict[str, Any] | None = None) -> int:
    failed = [i for i in items if i.ok is False and i.required]
    if as_json:
        print_json(
            {"ok": not failed, "checks": [asdict(i) | {"mark": i.mark} for i in items]}
            | (extra or {})
        )
    else:
        print(title)
        for item in items:
            print(f"  {item.mark} {item.name}: {item.detail}")
    return EXIT_FAILED if failed else 0


def _hf_item(access: Any) -> Item:
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.huggingface import whoami_evidence

    if access.token is None:
        return Item(
            "Hugging Face token",
            None,
            "none configured: public models only; for a gated model set HF_TOKEN or save a "
            "HuggingFaceCredentials block (--hf-credentials NAME)",
            required=False,
        )
    try:
        who = whoami_evidence(access.token, access.endpoint)
    except SpecError as exc:  # the token's header was refused before anything was sent
        return Item("Hugging Face token", False, f"{access.source}: {exc}")
    if who.get("status") == 200:
        return Item(
            "Hugging Face token",
            True,
            f"{access.source}: user {who.get('user')}, role {who.get('role') or '?'}",
        )
    if who.get("status") is None:
        return Item(
            "Hugging Face token",
            False,
            f"{access.source}: the Hub did not answer ({who.get('message')}); check the network "
            "or --hf-endpoint",
        )
    return Item(
        "Hugging Face token",
        False,
        f"{access.source}: the Hub refused it (HTTP {who.get('status')}: {who.get('message')}); "
        "create a new token at https://huggingface.co/settings/tokens",
    )


def _account_items(args: argparse.Namespace) -> list[Item]:
    """The account checks of every provider that has an account (``Capability.ACCOUNT``:
    RunPod's API key and the account's SSH key), required for the chosen provider,
    shown with ``-`` on failure otherwise."""
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.provider import Capability
    from prefect_runpod.blocks.provider_registry import provider_class, provider_names
    from prefect_runpod.flows.run.providers import build_provider

    items: list[Item] = []
    for name in provider_names():
        kind = provider_class(name)
        if not kind.supports(Capability.ACCOUNT):
            continue
        required = args.provider == name
        own = kind.option_names() if kind.supports(Capability.OPTIONS) else ()
        params = {"provider": name, **{option: getattr(args, option, None) for option in own}}
        try:
            provider, _ = build_provider(params, need_ssh_key=True)
        except SpecError as exc:
            what = f"{kind.display_name} key and SSH key"
            items.append(Item(what, False if required else None, str(exc), required))
            continue
        items.extend(
            Item(c.name, c.ok, c.detail, required)
            for c in provider.account_checks()  # type: ignore[attr-defined]
        )
    return items


def run_check(args: argparse.Namespace) -> int:
    """``prefect-runpod check``; 0 when every required check passed, else 1."""
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.huggingface import resolve_hf_access

    items: list[Item] = []
    try:
        with api() as url:
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as client:
                failure = client.api_healthcheck()
            where = url or "PREFECT_API_URL"
            items.append(
                Item(
                    "Prefect API",
                    failure is None,
                    f"{where} answered"
                    if failure is None
                    else f"{failure}; start one with `prefect server start`",
                )
            )
            try:
                access = resolve_hf_access(
                    credentials_block=args.hf_credentials_block,
                    token_secret=args.hf_token_secret,
                    token_env=args.hf_token_env,
                    endpoint=args.hf_endpoint,
                )
                items.append(_hf_item(access))
            except SpecError as exc:
                items.append(Item("Hugging Face token", False, str(exc)))
            items.extend(_account_items(args))
    except RuntimeError as exc:  # the temporary server did not start
        items.append(Item("Prefect API", False, f"{exc}; set PREFECT_API_URL to a running server"))
    ssh = shutil.which("ssh")
    items.append(
        Item(
            "OpenSSH client",
            ssh is not None,
            ssh or "not found: install openssh-client (`prefect-runpod ssh` runs it)",
            required=False,
        )
    )
    items.append(
        Item("Python", sys.version_info >= (3, 11), f"{sys.version.split()[0]} at {sys.executable}")
    )
    return _show("prefect-runpod check", items, args.json)


def _price_rows(provider: Any, expected_seconds: float) -> tuple[list[dict[str, Any]], str | None]:
    """The provider's offers (``Capability.PRICES``) in failover order with USD/h,
    availability and the estimate; and why availability is missing, when it is. None
    of it for a provider without prices."""
    from prefect_runpod.blocks.costs import cost_usd
    from prefect_runpod.blocks.provider import Capability

    if not provider.supports(Capability.PRICES):
        return [], None
    found = provider.offers()
    rows = [
        {
            "gpu_type": offer.gpu_type,
            "usd_per_hr": offer.usd_per_hr,
            "availability": offer.availability,
            "estimate_usd": None
            if offer.usd_per_hr is None
            else round(cost_usd(offer.usd_per_hr, expected_seconds), 6),
        }
        for offer in found.offers
    ]
    return rows, found.note


def _output_dir_item(out: Path, overwrite: bool) -> Item:
    """The plan's row for an output dir given on the command line: empty, or overwritten."""
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.validation import check_output_dir_unused

    try:
        check_output_dir_unused(out, overwrite=overwrite)
    except SpecError as exc:
        return Item("output dir", False, str(exc))
    held = out.is_dir() and any(out.iterdir())
    return Item("output dir", True, f"{out} ({'written over: --overwrite' if held else 'empty'})")


def run_plan(args: argparse.Namespace) -> int:
    """``prefect-runpod plan [finetune's options]``; 0 when ``finetune`` would start, else 1."""
    from prefect_runpod.blocks.exceptions import HFAuthError, SpecError
    from prefect_runpod.blocks.provider import Capability
    from prefect_runpod.flows.cli.launch import finetune_params
    from prefect_runpod.flows.finetune import demo_bundle
    from prefect_runpod.flows.run.inputs import check_run
    from prefect_runpod.tasks.env_plan import cuda_floor_for_requirements
    from prefect_runpod.tasks.preflight_access import preflight

    params = finetune_params(args)
    out = args.output_dir or Path.cwd() / "prefect-runpod-runs"
    with api():
        prepared, checks = check_run(
            {**params, "output_dir": out},
            demo_bundle=demo_bundle(),
            run_name=f"{args.name_prefix}-<flow_run_id>",
        )
        items = [Item(c.name, c.ok, c.detail) for c in checks]
        if args.output_dir is not None and prepared is not None:
            items.append(_output_dir_item(Path(prepared.settings.output_dir), args.overwrite))
        prices: list[dict[str, Any]] = []
        note = None
        if prepared is not None:
            settings = prepared.settings
            try:
                found = preflight.fn(settings, prepared.hf.token, prepared.hf.endpoint, prepared.s3)
                what = "; ".join(f"{d.cause.value} ({d.where})" for d in found) or (
                    "no model id and no publish target: nothing to check on the Hub"
                )
                items.append(Item("Hugging Face access", True, what))
            except (HFAuthError, SpecError) as exc:
                items.append(Item("Hugging Face access", False, str(exc)))
            floor = cuda_floor_for_requirements(settings.bundle.requirements)
            items.append(
                Item(
                    "CUDA floor",
                    True,
                    f"hosts with CUDA {min(floor, key=_version)} or newer (minCudaVersion)"
                    if floor
                    else "none: the bundle's requirements need no particular driver",
                )
            )
            if prepared.provider.supports(Capability.ACCOUNT):
                account = prepared.provider.account_checks(key_only=True)  # type: ignore[attr-defined]
                items.extend(Item(c.name, c.ok, c.detail) for c in account)
            try:
                prices, note = _price_rows(
                    prepared.provider, settings.bundle.expected_runtime_seconds
                )
            except Exception as exc:  # a price we cannot read is a failed check, said
                items.append(Item("price", False, error_text(exc)))
    expected = prepared.settings.bundle.expected_runtime_seconds if prepared else 0.0
    code = _show(
        "prefect-runpod plan (nothing is rented)",
        items,
        args.json,
        {"prices": prices, "expected_runtime_seconds": expected, "note": note},
    )
    if prices and not args.json:
        print_table(
            "GPU types in failover order (the first available one is rented)",
            ["GPU type", "USD/h", "availability", f"estimate USD ({expected:g} s)"],
            [
                [
                    r["gpu_type"],
                    "-" if r["usd_per_hr"] is None else f"{r['usd_per_hr']:.3f}",
                    r["availability"],
                    "-" if r["estimate_usd"] is None else f"{r['estimate_usd']:.4f}",
                ]
                for r in prices
            ],
        )
        if note:
            print(note)
        if not expected:
            print("no estimate: set expected_runtime_seconds in the bundle's bundle.toml")
    if not args.json:
        print("finetune would start" if code == 0 else "finetune would NOT start: fix each ✘")
    return code


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))
