"""Preflight: everything that can be checked before a pod exists, so a run that cannot
succeed spends nothing (docs/architecture.md#input-validation).

``validate_settings`` checks the run's parameters with the one validation layer
(``blocks/validation/``) and reads the bundle: which files it would upload, and
that none of them looks like a secret (``tasks/bundle_files.py``). It touches no
network and no Prefect API. ``check_transfer_before_renting`` and ``check_pod_disk``
hold the run against the pod that is about to be rented. None of it imports Prefect, so
the CLI checks a run's arguments before Prefect is loaded; the ``preflight`` task itself
(the access checks that need the network) is in ``tasks/preflight_access.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from prefect_runpod.blocks import validation as v
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.publish.base import publish_kind
from prefect_runpod.blocks.sizes import human_bytes
from prefect_runpod.blocks.transfer.dispatch import check_tree
from prefect_runpod.blocks.transfer.pty.options import PtyOptions
from prefect_runpod.blocks.validation import parameters as run_parameters
from prefect_runpod.blocks.validation.parameters import (
    DEFAULT_DOWNLOAD,
    DEFAULT_HEARTBEAT_STALE_SECONDS,
    DEFAULT_PARITY_TOLERANCE,
    DEFAULT_POD_LIFETIME_SECONDS,
    DEFAULT_POD_POLL_SECONDS,
    DEFAULT_PTY_FRAMING,
    DEFAULT_PTY_STREAMS,
    DEFAULT_RECONNECT_BUDGET_SECONDS,
    DEFAULT_TERMINATE_TIMEOUT_SECONDS,
    ProviderName,
)
from prefect_runpod.tasks.bundle import BundleSpec, load_bundle
from prefect_runpod.tasks.bundle_files import IGNORE_FILE, BundleFiles, select_bundle_files
from prefect_runpod.tasks.models import PublishTarget
from prefect_runpod.tasks.publish_target import check_download_choice, parse_publish_target

if TYPE_CHECKING:
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = [
    "RunSettings",
    "check_placement",
    "check_pod_disk",
    "check_transfer_before_renting",
    "transfer_methods",
    "validate_settings",
]

_BLOCK_PARAMS = (
    "runpod_credentials_block",
    "runpod_spec_block",
    "ssh_key_block",
    "s3_target_block",
    "hf_credentials_block",
    "hf_token_secret",
)


def transfer_methods() -> tuple[str, ...]:
    """``auto`` and every registered transfer method (``blocks.transfer.method_names``),
    in the order messages list them: what ``--transfer`` accepts."""
    from prefect_runpod.blocks.transfer.registry import method_names

    return ("auto", *method_names())


class RunSettings(BaseModel):
    """The validated settings of one run (the flow's parameters after preflight; each
    field's type and default are its parameter's, ``blocks.validation.parameters``).

    Attributes:
        bundle: the loaded bundle spec.
        provider: ``local`` or ``runpod``.
        model_id: the Hugging Face repo to check, or None (then ``hf_auth`` is Skipped).
        transfer_method: ``auto`` or a registered method (``transfer_methods()``).
        max_cost_usd: budget cap in USD, or None.
        max_runtime_seconds: the training runtime cap, in seconds.
        name_prefix: pods are named ``<name_prefix>-<flow_run_id>``.
        output_dir: local directory for downloads and the run report (absolute).
        parity_tolerance: the allowed accuracy gap (a fraction).
        heartbeat_stale_seconds / pod_lifetime_seconds: the dead-man switch, in seconds.
        pod_poll_seconds: how often the run asks the provider whether its pod lives, s.
        terminate_timeout_seconds: how long terminate waits for confirmation, s.
        hf_endpoint: the Hub URL given, or None (the block's, else huggingface.co).
        upload: the bundle files the upload sends, with their total bytes.
        publish: where the pod publishes the outputs, or None.
        download: what the ``download`` stage brings home: ``all``, ``eval`` or ``none``.
        follow_links: transfers copy what links leaving the tree point at instead of
            refusing them.
        reconnect_budget_seconds: how long each stage after ready waits for the pod's
            SSH to come back (s).
        pty_framing: how the ``pty`` method frames bytes: ``auto`` (raw frames when the
            probe finds every byte value crosses the gateway unchanged), ``raw`` or
            ``base64``.
        pty_streams: PTY sessions a ``pty`` transfer stripes large files over (1–16).
    """

    bundle: BundleSpec
    provider: ProviderName
    model_id: str | None
    transfer_method: str
    max_cost_usd: float | None
    max_runtime_seconds: float
    name_prefix: str
    output_dir: str
    parity_tolerance: float = DEFAULT_PARITY_TOLERANCE
    heartbeat_stale_seconds: float = DEFAULT_HEARTBEAT_STALE_SECONDS
    pod_lifetime_seconds: float = DEFAULT_POD_LIFETIME_SECONDS
    pod_poll_seconds: float = DEFAULT_POD_POLL_SECONDS
    terminate_timeout_seconds: float = DEFAULT_TERMINATE_TIMEOUT_SECONDS
    hf_endpoint: str | None = None
    upload: BundleFiles | None = None
    publish: PublishTarget | None = None
    download: Literal["all", "eval", "none"] = DEFAULT_DOWNLOAD
    follow_links: bool = False
    reconnect_budget_seconds: float = DEFAULT_RECONNECT_BUDGET_SECONDS
    pty_framing: Literal["auto", "raw", "base64"] = DEFAULT_PTY_FRAMING
    pty_streams: int = DEFAULT_PTY_STREAMS

    def transfer_options(self) -> PtyOptions:
        """The ``pty`` method's options for this run's transfers (other methods ignore
        them)."""
        return PtyOptions(framing=self.pty_framing, streams=self.pty_streams)


def _check_choices(given: dict[str, Any]) -> PublishTarget | None:
    """Every parameter that takes one of a list (the transfer method, the local pod's
    mode and image, the download choice), the publish target, the download choice
    against it, and the S3 target's use; returns the publish target.

    Raises:
        SpecError: the first one that does not hold.
    """
    for p in run_parameters.FINETUNE_PARAMETERS:
        allowed = p.choice_list() or run_parameters.literal_choices(p)
        if allowed and p.name != "provider" and given[p.name] is not None:
            v.check_choice(p.name, given[p.name], allowed)
    method, s3_block = given["transfer_method"], given["s3_target_block"]
    target = parse_publish_target(
        given["publish"], public=given["publish_public"], s3_target_block=s3_block
    )
    check_download_choice(given["download"], target)
    s3 = run_parameters.parameter("s3_target_block")
    publishes_there = target is not None and publish_kind(target.kind).uses_s3_target
    if s3_block and method not in s3.used_with and not publishes_there:
        raise SpecError(
            f"{v.label('s3_target_block')} is only used by --transfer s3 (or auto) and "
            f"--publish s3, and this run asks for {method!r}: drop it, or use "
            "--transfer s3."
        )
    if method in s3.needed_by and not s3_block:
        raise SpecError(
            f"transfer method {method!r} needs a saved S3Target block (a bucket or a RunPod "
            "network volume's S3 endpoint): save one and pass --s3-target NAME."
        )
    return target


def _check_names(given: dict[str, Any]) -> None:
    """Each saved block named among ``given`` (the run's parameters) has a block's name
    (loading it needs the Prefect API and comes later), then the pod-name prefix.

    Raises:
        SpecError: the first malformed name.
    """
    for param in _BLOCK_PARAMS:
        if given[param] is not None:
            v.check_block_name(given[param], param)
    v.check_name_prefix(given["name_prefix"])


def _check_limits(
    runtime: float,
    lifetime: float,
    concurrency_limit: str | None,
    hf_endpoint: str | None,
    gpu_type_ids: list[str] | None,
) -> str | None:
    """The runtime cap against the pod's lifetime, the concurrency limit's name, the Hub
    URL and the GPU type list; returns the Hub URL as checked.

    Raises:
        SpecError: the first one that does not hold.
    """
    if runtime > lifetime:
        raise SpecError(
            f"{v.label('max_runtime_seconds')} {runtime:g} s is longer than "
            f"{v.label('pod_lifetime_seconds')} {lifetime:g} s: the pod would remove itself "
            "before training could finish; raise the lifetime or lower the runtime cap."
        )
    if concurrency_limit is not None:
        v.check_limit_name(concurrency_limit)
    if hf_endpoint is not None:
        hf_endpoint = v.check_url(hf_endpoint, "hf_endpoint")
    if gpu_type_ids is not None and (
        not isinstance(gpu_type_ids, list) or not all(isinstance(g, str) for g in gpu_type_ids)
    ):
        raise SpecError(f"{v.label('gpu_type_ids')} must be a list of GPU type ids.")
    return hf_endpoint


def _check_bundle(
    output_dir: str | Path,
    bundle: str | Path,
    model_id: str | None,
    allow_secret_files: list[str] | None,
    follow_links: bool,
) -> tuple[Path, BundleSpec, str | None, BundleFiles]:
    """The output dir (writable), the bundle (``bundle.toml``), the model repo id (the
    bundle's own when none is given), and the files it would upload: none that looks
    like a secret, no link that leaves it or dangles. Returns ``(output dir, spec, repo
    id, files)``.

    Raises:
        SpecError: the first problem found.
    """
    for pattern in allow_secret_files or []:
        v.check_inside_path("allow_secret_files", pattern)
    out = v.check_output_dir(output_dir)
    spec = load_bundle(bundle)
    repo = model_id or spec.model_id or None
    if repo is not None:
        v.check_repo_id(repo)
    files = select_bundle_files(
        spec.root, allow_secret_files=list(allow_secret_files or []), skip_dirs=[out]
    )
    if not files.files:
        raise SpecError(
            f"the bundle {spec.root} has no file to upload after {IGNORE_FILE} and the "
            "built-in excludes: check the ignore file."
        )
    # The upload's own rule for links, on what it would send: none may leave the bundle
    # or dangle (each named), unless follow_links copies the escaping ones.
    check_tree(spec.root, follow_links=follow_links, paths=files.files)
    return out, spec, repo, files


def validate_settings(*, bundle: str | Path, output_dir: str | Path, **params: Any) -> RunSettings:
    """Check a run's input before anything is rented; reads the bundle, nothing else.

    Every check is one sentence naming the parameter (and its CLI option) and what to
    do; the first problem found is raised. Saved blocks are checked by name only here
    (loading them needs the Prefect API: ``flows/run/inputs.py`` does that next).

    Args:
        bundle: the bundle directory (the demo bundle's when the run names none).
        output_dir: where the run keeps its outputs and report.
        params: any other fine-tune parameter by name; a missing one takes its default
            (both from ``blocks.validation.parameters``, the flow's own table).

    Returns:
        The ``RunSettings``; ``model_id`` falls back to the bundle's own ``model_id``.

    Raises:
        TypeError: a parameter the flow does not have (a programming error).
        SpecError: a token in a parameter, an option of the other provider, an unknown
            transfer method, a number that is NaN/infinite/out of range, a malformed
            prefix, URL, block name or repo id, an output dir that cannot be written, a
            bad bundle, or bundle files that look like secrets.
    """
    unknown = sorted(set(params) - set(run_parameters.defaults()))
    if unknown:
        raise TypeError(f"validate_settings() got unexpected parameters: {', '.join(unknown)}")
    g: dict[str, Any] = {
        **run_parameters.defaults(),
        **params,
        "bundle": bundle,
        "output_dir": output_dir,
    }
    for name in ("bundle", "output_dir", "resume_from"):
        v.check_path_text(name, g[name])
    v.refuse_secret_values({k: val for k, val in g.items() if k != "hf_token_env"})
    v.check_env_name(g["hf_token_env"])
    v.check_provider_options(g["provider"], g)
    target = _check_choices(g)
    _check_names(g)
    number = {
        p.name: v.check_number(p.name, g[p.name], optional=p.default is None)
        for p in run_parameters.number_parameters()
    }
    runtime, lifetime = number["max_runtime_seconds"], number["pod_lifetime_seconds"]
    assert runtime is not None and lifetime is not None
    pty = PtyOptions(framing=g["pty_framing"], streams=g["pty_streams"])  # checked where made
    hf_endpoint = _check_limits(
        runtime, lifetime, g["concurrency_limit"], g["hf_endpoint"], g["gpu_type_ids"]
    )
    out, spec, repo, files = _check_bundle(
        g["output_dir"], g["bundle"], g["model_id"], g["allow_secret_files"], g["follow_links"]
    )
    return RunSettings(
        bundle=spec,
        provider=g["provider"],
        model_id=repo,
        transfer_method=g["transfer_method"],
        max_cost_usd=number["max_cost_usd"],
        max_runtime_seconds=runtime,
        name_prefix=g["name_prefix"],
        output_dir=str(out),
        parity_tolerance=number["parity_tolerance"],  # type: ignore[arg-type]
        heartbeat_stale_seconds=number["heartbeat_stale_seconds"],  # type: ignore[arg-type]
        pod_lifetime_seconds=lifetime,
        pod_poll_seconds=number["pod_poll_seconds"],  # type: ignore[arg-type]
        terminate_timeout_seconds=number["terminate_timeout_seconds"],  # type: ignore[arg-type]
        hf_endpoint=hf_endpoint,
        upload=files,
        publish=target,
        download=g["download"],
        follow_links=bool(g["follow_links"]),
        reconnect_budget_seconds=number["reconnect_budget_seconds"],  # type: ignore[arg-type]
        pty_framing=pty.framing,  # type: ignore[arg-type]
        pty_streams=pty.streams,
    )


def check_transfer_before_renting(
    transfer_method: str,
    planned: PodHandle,
    description: str,
    s3: Any = None,
    gateway_only: PodHandle | None = None,
) -> str:
    """Can the transfer method work with the pod about to be rented, and which will the
    run use? Decided by the run's own choice (``dispatch.pick_method``, which
    ``check_pod_end`` makes again once the pod runs) on what the pod will offer.

    Args:
        transfer_method: ``auto`` or a registered method.
        planned: a handle with the endpoints the pod will have (``flows.run.providers.planned_pod``).
        description: the pod in words, for the message (``a local pod in gateway mode``).
        s3: the loaded ``S3Target``, or None.
        gateway_only: the same pod when its host grants no public IP (RunPod's direct SSH
            shows only once the pod runs), or None when its endpoints are certain.

    Returns:
        The method the run will use (``pty``), or both outcomes in words when they differ
        (``sftp if the host grants a public IP for 22/tcp, else pty``).

    Raises:
        SpecError: the method cannot work with ``planned``: its own reason, prefixed with
            the pod.
    """
    from prefect_runpod.blocks.transfer.dispatch import pick_method

    try:
        chosen = pick_method(planned, transfer_method, s3)
    except SpecError as exc:
        reason = str(exc).replace(f"pod {planned.pod_id} ", "the pod ")
        raise SpecError(
            f"{v.label('transfer_method')} {transfer_method!r} cannot work with {description}, "
            f"checked before renting: {reason}."
        ) from None
    if gateway_only is None:
        return chosen
    granted = f"{chosen} if the host grants a public IP for 22/tcp"
    try:
        other = pick_method(gateway_only, transfer_method, s3)
    except SpecError:
        return f"{granted}; without one the run stops before uploading (the pod is ended)"
    return chosen if other == chosen else f"{granted}, else {other}"


def check_placement(provider: Any, requirements: list[str], s3: S3Target | None) -> str:
    """Hold the pod about to be rented against what its provider knows before renting
    (``RunPodProvider.check_placement``, the RunPod knowledge staying in ``blocks/runpod/``:
    GPU ids in its catalog, the bundle's CUDA floor against their hosts, a network
    volume's data centre — ``s3.region_name`` of a target with a mount path — against the
    data centres asked for). A provider without such a check (the local pod) places its
    pods itself. Returns one line; raises ``SpecError`` (nothing rented) on a problem, or
    when RunPod could not be asked."""
    from prefect_runpod.blocks.exceptions import EnvError, ProviderError
    from prefect_runpod.tasks.env_plan import cuda_floor_for_requirements

    placement = getattr(provider, "check_placement", None)
    if placement is None:
        return f"the {provider.provider_name} provider places its pods itself"
    try:
        floor = cuda_floor_for_requirements(requirements)
        volume = s3.region_name if s3 is not None and s3.volume_mount_path else None
        return str(placement(floor, volume))
    except EnvError as exc:
        raise SpecError(str(exc)) from None
    except ProviderError as exc:
        raise SpecError(
            f"the GPU types could not be checked against RunPod's catalog ({exc}); nothing "
            "was rented: try again, or `prefect-runpod check --provider runpod`"
        ) from None


def check_pod_disk(upload: BundleFiles, disk_bytes: int | None, description: str) -> str:
    """Hold the upload against the disk the pod will have where the bundle lands.

    Args:
        upload: the selected bundle files.
        disk_bytes: bytes available at the pod's workdir (None: unknown, not checked).
        description: where, in words (``the pod's 20 GB container disk``).

    Returns:
        One line for the log: file count, bytes, and the share of the disk.

    Raises:
        SpecError: the bundle is larger than that disk.
    """
    size = upload.total_bytes
    line = f"upload: {len(upload.files)} files, {size} bytes ({human_bytes(size)})"
    if upload.ignored_files:
        line += f", {upload.ignored_files} left out by {IGNORE_FILE} and the built-in excludes"
    if disk_bytes is None:
        return line
    if size > disk_bytes:
        raise SpecError(
            f"the bundle's {len(upload.files)} files hold {human_bytes(size)}, more than "
            f"{description} ({human_bytes(disk_bytes)}): leave large files out in {IGNORE_FILE}, "
            "or ask for a larger disk."
        )
    share = 100 * size / max(disk_bytes, 1)
    shown = f"{share:.2f}%" if share >= 0.01 else "under 0.01%"
    return f"{line}; {shown} of {description} ({human_bytes(disk_bytes)})"
