"""Everything a fine-tune run is checked against before a pod is rented, in one call
that the CLI (before Prefect starts a run) and the flow's ``preflight`` stage (for
deployments, the API and Python callers) share (docs/architecture.md#input-validation).

``prepare_run(params)``, in order:

1. ``tasks.preflight.validate_settings``: every parameter, the bundle and the files it
   would upload (no network, no Prefect API);
2. the saved blocks the run names, each loaded or refused with the saved names of its
   type listed (``blocks.validation.load_block``), and the provider built from them;
3. the Hugging Face token's source (``blocks.huggingface.resolve_hf_access``);
4. the pod about to be rented (``flows.run.providers.planned_pod``): the transfer method
   against what it will offer and this machine's end, the bundle's bytes against its disk;
5. where it would be placed (``tasks.preflight.check_placement``): on RunPod, the GPU ids
   against its catalog ("did you mean"), the CUDA floor against their hosts, a network
   volume's data centre against the data centres asked for.

Every secret read on the way — the RunPod key, the Hugging Face token, the S3 keys,
``PREFECT_API_KEY`` — is checked for its shape and registered for masking where it is
read (``blocks.secret_mask.check_secret``): whitespace or a control character in one
stops the run here, naming where it came from and never the value.

``check_run`` runs the same checks, recording each one instead of stopping at the first:
``prefect-runpod plan`` lists them (✔/✘ with the fix). Nothing here rents, uploads or
logs a secret.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.huggingface import HFAccess, resolve_hf_access
from prefect_runpod.blocks.keys import KeyPair
from prefect_runpod.blocks.provider import PodProvider
from prefect_runpod.blocks.secret_mask import check_prefect_api_key, check_secret
from prefect_runpod.blocks.validation import label, load_block
from prefect_runpod.flows.run.providers import PlannedPod, build_provider, planned_pod
from prefect_runpod.tasks.preflight import (
    RunSettings,
    check_placement,
    check_pod_disk,
    check_transfer_before_renting,
    validate_settings,
)

if TYPE_CHECKING:
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = [
    "Check",
    "PreparedRun",
    "check_concurrency_limit",
    "check_prefect_api_key",
    "check_run",
    "load_s3_target",
    "prepare_run",
    "settings_params",
]


@dataclass
class PreparedRun:
    """A run that passed every check before renting.

    Attributes:
        settings: the validated settings.
        provider: the pod provider built from the run's blocks or environment.
        keypair: the SSH key pair the pod is reached with.
        s3: the loaded ``S3Target``, or None.
        hf: the Hugging Face token (a ``SecretStr``), endpoint and where the token came from.
        planned: the pod about to be rented.
        upload_line: file count and bytes to upload, and their share of the pod's disk.
    """

    settings: RunSettings
    provider: PodProvider
    keypair: KeyPair
    s3: S3Target | None
    hf: HFAccess
    planned: PlannedPod
    upload_line: str


def settings_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The fine-tune parameters (``blocks.validation.parameters``) among a mapping (the
    flow's or the CLI's); missing ones keep their defaults."""
    from prefect_runpod.blocks.validation.parameters import defaults

    accepted = set(defaults())
    return {k: val for k, val in params.items() if k in accepted}


def check_concurrency_limit(name: str | None) -> None:
    """The global concurrency limit a run holds a slot of exists on the Prefect API
    (the flow takes its slot with ``strict=True``, which would fail only once the run
    had started).

    Raises:
        SpecError: no limit of that name, with the command that creates one.
    """
    if not name:
        return
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            raise SpecError(
                f"{label('concurrency_limit')}: the global concurrency limit {name!r} does "
                f"not exist: create it with `prefect gcl create {name} --limit 2`, or drop "
                "the option."
            ) from None


def load_s3_target(name: str) -> S3Target:
    """The saved ``S3Target`` named ``name`` (``s3_target_block``), its key pair checked
    for its shape and registered for masking.

    Raises:
        SpecError: no such block (the saved ones are listed).
        SecretShapeError: the access key id or the secret key holds whitespace or a
            control character (one trailing newline is stripped, and said).
    """
    from pydantic import SecretStr

    from prefect_runpod.blocks.transfer.s3 import S3Target

    block = load_block(S3Target, name, "s3_target_block")
    fix = "remove it and save the block again"
    if block.access_key_id:
        what = f"the access_key_id of the S3Target block {name!r}"
        block.access_key_id = check_secret(block.access_key_id, what, fix=fix)
    if block.secret_access_key is not None and block.secret_access_key.get_secret_value():
        what = f"the secret_access_key of the S3Target block {name!r}"
        value = check_secret(block.secret_access_key.get_secret_value(), what, fix=fix)
        block.secret_access_key = SecretStr(value)
    return block


@dataclass
class Check:
    """One named check before renting, as ``plan`` lists it.

    Attributes:
        name: what was checked (``inputs and bundle``, ``blocks and provider``…).
        ok: True when it passed.
        detail: what was found, or the problem with its fix (the error's own sentence).
        error: the error raised, when it failed.
    """

    name: str
    ok: bool
    detail: str
    error: SpecError | None = None


class _Stop(Exception):
    """A check failed and the caller wants only the first failure."""


def check_run(
    params: Mapping[str, Any],
    *,
    demo_bundle: Path,
    run_name: str,
    settings: RunSettings | None = None,
    first_failure: bool = False,
    before_blocks: Callable[[], Any] | None = None,
) -> tuple[PreparedRun | None, list[Check]]:
    """Every check of ``prepare_run``, each one recorded, none stopping the others that do
    not depend on it (the provider is built even when the bundle is bad, so ``plan``
    lists every problem at once).

    Args:
        params / demo_bundle / run_name / settings: as for ``prepare_run``.
        first_failure: stop at the first check that fails (``prepare_run``).
        before_blocks: called once before the first check that reads saved blocks (the
            CLI opens the Prefect API there, so input that fails first starts nothing).

    Returns:
        The ``PreparedRun`` when every check passed (else None), and the checks in order.
    """
    checks: list[Check] = []
    try:
        return _checked(
            params, demo_bundle, run_name, checks, settings, first_failure, before_blocks
        )
    except _Stop:
        return None, checks


def _checked(
    params: Mapping[str, Any],
    demo_bundle: Path,
    run_name: str,
    checks: list[Check],
    settings: RunSettings | None,
    first_failure: bool,
    before_blocks: Callable[[], Any] | None,
) -> tuple[PreparedRun | None, list[Check]]:
    check_prefect_api_key()  # Prefect has used it already; here it is registered

    def step(name: str, fn: Callable[[], Any], describe: Callable[[Any], str]) -> Any:
        try:
            value = fn()
        except SpecError as exc:
            checks.append(Check(name, False, str(exc), exc))
            if first_failure:
                raise _Stop from None
            return None
        checks.append(Check(name, True, describe(value)))
        return value

    values = settings_params(params)
    values["bundle"] = demo_bundle if params.get("bundle") is None else params["bundle"]
    given = settings
    settings = step(
        "inputs and bundle",
        lambda: given if given is not None else validate_settings(**values),
        lambda st: (
            f"bundle {st.bundle.root}: {len(st.upload.files) if st.upload else 0} files "
            "to upload, none that looks like a secret"
        ),
    )
    if before_blocks is not None:
        before_blocks()
    built = step(
        "blocks and provider",
        lambda: build_provider(dict(params)),
        lambda pk: (
            f"{pk[0].provider_name} provider built from "
            + (", ".join(f"{k}={params[k]!r}" for k in _BLOCKS if params.get(k)) or "the defaults")
        ),
    )
    s3 = None
    if params.get("s3_target_block"):
        s3 = step(
            "S3 target",
            lambda: load_s3_target(params["s3_target_block"]),
            lambda _: f"S3Target block {params['s3_target_block']!r} loaded",
        )
    endpoint = settings.hf_endpoint if settings is not None else params.get("hf_endpoint")
    hf: HFAccess | None = step(
        "Hugging Face token",
        lambda: resolve_hf_access(
            credentials_block=params.get("hf_credentials_block"),
            token_secret=params.get("hf_token_secret"),
            token_env=params.get("hf_token_env") or "HF_TOKEN",
            endpoint=endpoint,
        ),
        lambda access: (
            f"token from {access.source}"
            if access.token is not None
            else "no token (public models only; a gated repo or --publish needs one)"
        ),
    )
    if settings is None or built is None:
        return None, checks
    provider, keypair = built
    plan = planned_pod(provider, run_name)
    step(
        "transfer method",
        lambda: check_transfer_before_renting(
            settings.transfer_method, plan.handle, plan.description, s3, plan.gateway_only
        ),
        lambda method: f"{method} (asked {settings.transfer_method!r}) with {plan.description}",
    )
    assert settings.upload is not None
    upload = settings.upload
    line = step(
        "pod disk",
        lambda: check_pod_disk(upload, plan.disk_bytes, plan.disk_description),
        lambda text: text,
    )
    step(
        "GPU types and placement",
        lambda: check_placement(provider, settings.bundle.requirements, s3),
        lambda text: text,
    )
    if not all(c.ok for c in checks) or hf is None:
        return None, checks
    return PreparedRun(settings, provider, keypair, s3, hf, plan, line), checks


_BLOCKS = ("runpod_credentials_block", "runpod_spec_block", "ssh_key_block")


def prepare_run(
    params: Mapping[str, Any],
    *,
    demo_bundle: Path,
    run_name: str,
    settings: RunSettings | None = None,
    before_blocks: Callable[[], Any] | None = None,
) -> PreparedRun:
    """Check a fine-tune run's parameters against everything known before renting.

    Args:
        params: the flow's parameters by name (``bundle`` None means the demo bundle;
            ``output_dir`` None means ``./prefect-runpod-runs/<flow_run_id>``, given
            here already resolved by the caller).
        demo_bundle: the bundle used when ``params["bundle"]`` is None.
        run_name: the pod's name to be (``<prefix>-<flow_run_id>``), for the plan.
        settings: the ``RunSettings`` ``validate_settings`` made of these parameters
            already (the CLI's argument phase), so the bundle is not read twice.
        before_blocks: see ``check_run``.

    Returns:
        The ``PreparedRun``.

    Raises:
        SpecError: the first problem found (see the module docstring); nothing was rented.
    """
    prepared, checks = check_run(
        params,
        demo_bundle=demo_bundle,
        run_name=run_name,
        settings=settings,
        first_failure=True,
        before_blocks=before_blocks,
    )
    for check in checks:
        if check.error is not None:
            raise check.error
    assert prepared is not None
    return prepared
