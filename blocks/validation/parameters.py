"""Every parameter of a fine-tune run, declared once (docs/architecture.md#the-run-parameters).

Each :class:`Parameter` holds the name, the type (as the flow's signature writes it),
the default (a named constant below), the help text, the CLI option and its group, and
the validation rule: a number's unit and range, or a fixed list of choices. The rest
comes from here: the CLI's options (``flows/cli/launch.py``), the flow's parameter
docs (:func:`document`), the labels in error messages (``options.label``), the number
rules (``numbers.NUMBER_RULES``) and the defaults ``tasks.preflight.validate_settings``
fills in. The flow keeps its flat Prefect signature; ``tests/blocks/validation`` holds
it to this table.

Imports neither Prefect nor paramiko: the CLI's ``--help`` builds its options from here.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar

if TYPE_CHECKING:  # pydantic is loaded by whoever builds a schema, not by the CLI's parser
    from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
    from pydantic_core import core_schema

__all__ = [
    "CLI_GROUPS",
    "DEFAULT_DOWNLOAD",
    "DEFAULT_HEARTBEAT_STALE_SECONDS",
    "DEFAULT_HF_TOKEN_ENV",
    "DEFAULT_MAX_POD_LOSSES",
    "DEFAULT_MAX_RUNTIME_SECONDS",
    "DEFAULT_NAME_PREFIX",
    "DEFAULT_PARITY_TOLERANCE",
    "DEFAULT_POD_LIFETIME_SECONDS",
    "DEFAULT_POD_POLL_SECONDS",
    "DEFAULT_PROVIDER",
    "DEFAULT_PTY_FRAMING",
    "DEFAULT_PTY_STREAMS",
    "DEFAULT_RECONNECT_BUDGET_SECONDS",
    "DEFAULT_TERMINATE_TIMEOUT_SECONDS",
    "DEFAULT_TRANSFER_METHOD",
    "FINETUNE_PARAMETERS",
    "Parameter",
    "ProviderName",
    "defaults",
    "document",
    "literal_choices",
    "number_parameters",
    "parameter",
]

DEFAULT_PROVIDER: Final = "local"
"""The embedded local pod: a rehearsal on this machine, nothing rented."""
DEFAULT_HF_TOKEN_ENV: Final = "HF_TOKEN"
"""The environment variable holding the Hugging Face token when no block names one."""
DEFAULT_TRANSFER_METHOD: Final = "auto"
"""Let the pod decide: s3 with a network volume, sftp with direct SSH, else pty."""
DEFAULT_PTY_FRAMING: Final = "auto"
"""Raw frames when a probe finds the gateway 8-bit clean, base64 otherwise."""
DEFAULT_PTY_STREAMS = 1
"""One PTY session per transfer."""
DEFAULT_MAX_RUNTIME_SECONDS = 3600.0
"""The training runtime cap, s (1 h)."""
DEFAULT_PARITY_TOLERANCE = 0.02
"""The allowed accuracy gap between in-training and standalone eval (a fraction)."""
DEFAULT_NAME_PREFIX: Final = "prft"
"""Pods are named ``<prefix>-<flow_run_id>``."""
DEFAULT_POD_POLL_SECONDS = 10.0
"""How often a run asks the provider whether its pod still lives, s."""
DEFAULT_TERMINATE_TIMEOUT_SECONDS = 120.0
"""How long a terminate waits for the provider to confirm the pod gone, s."""
DEFAULT_HEARTBEAT_STALE_SECONDS = 900.0
"""How old the flow's heartbeat may get before the pod removes itself, s (15 min)."""
DEFAULT_POD_LIFETIME_SECONDS = 6 * 3600.0
"""The dead-man's hard cap on a pod's life unless the run asks otherwise, s (6 h)."""
DEFAULT_RECONNECT_BUDGET_SECONDS = 120.0
"""How long a stage waits for a pod's SSH to come back, s."""
DEFAULT_DOWNLOAD: Final = "all"
"""Every output comes back through the gateway."""
DEFAULT_MAX_POD_LOSSES = 2
"""How many lost pods a run with checkpoints resumes after before it fails."""

_DAY_SECONDS = 24 * 3600.0


class _RegisteredProvider:
    """A provider name, checked against ``blocks.provider_registry`` when the value is
    validated (a provider registered later is accepted); its JSON schema is the enum of
    the names registered when the schema is made."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        from pydantic_core import core_schema

        def registered(value: str) -> str:
            from prefect_runpod.blocks.provider_registry import provider_names

            if value not in provider_names():
                raise ValueError(f"{value!r} is not one of: {', '.join(provider_names())}")
            return value

        return core_schema.no_info_after_validator_function(registered, core_schema.str_schema())

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        from prefect_runpod.blocks.provider_registry import provider_names

        return {"enum": list(provider_names()), "type": "string"}


ProviderName = Annotated[str, _RegisteredProvider]
"""The type of a ``provider`` parameter: a registered provider's name."""


def _providers() -> tuple[str, ...]:
    from prefect_runpod.blocks.provider_registry import provider_names

    return provider_names()


def _transfer_methods() -> tuple[str, ...]:
    from prefect_runpod.blocks.transfer.registry import method_names

    return (DEFAULT_TRANSFER_METHOD, *method_names())


def _local_images() -> tuple[str, ...]:
    from prefect_runpod.blocks.local_pod.images import profile_names

    return profile_names()


@dataclass(frozen=True)
class Parameter:
    """One run parameter, as every entry point sees it.

    Attributes:
        name: the flow's parameter (``max_cost_usd``).
        annotation: its type as the flow's signature writes it (``float | None``).
        default: its default (one of the named constants, None or False).
        help: what it is, for the flow's docs and the CLI's help alike (RST ``code``).
        option: the ``prefect-runpod finetune`` option (``--max-cost-usd``), or None.
        group: the CLI's option group (one of ``CLI_GROUPS``).
        metavar: the CLI's placeholder for the value, when not the option's name.
        choices: a fixed list the value must be one of, or a function listing them
            (registered providers, transfer methods, image profiles).
        unit / meaning / example / gt / ge / lt / le / whole: a number's rule (unit
            ``s``, ``USD``, ``USD/h`` or ``""``; ``meaning`` and ``example`` for the
            message; the bounds; whole numbers only). ``meaning`` None: not a number rule.
        used_with / needed_by: the transfer methods that use the parameter, and those
            that cannot work without it (``s3_target_block``: used with ``auto`` and
            ``s3``, needed by ``s3``); empty for most.
    """

    name: str
    annotation: str
    default: Any
    help: str
    option: str | None
    group: str
    metavar: str | None = None
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    unit: str = ""
    meaning: str | None = None
    example: str = ""
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    whole: bool = False
    used_with: tuple[str, ...] = ()
    needed_by: tuple[str, ...] = ()

    def choice_list(self) -> tuple[str, ...] | None:
        """The choices, the function called (None when the parameter has none)."""
        return self.choices() if callable(self.choices) else self.choices

    @property
    def cli_help(self) -> str:
        """The help text as a terminal shows it: another parameter named in it
        (````publish````) becomes its option (``--publish``), other RST markup goes."""
        return _CODE.sub(lambda m: _OPTION_OF.get(m.group(1), m.group(1)), self.help)


CLI_GROUPS = ("source", "publish", "transfer", "limits", "local pod", "pod life", "blocks")
"""The option groups of ``prefect-runpod finetune --help``, in order."""

_MONTH_SECONDS = 30 * _DAY_SECONDS

FINETUNE_PARAMETERS: tuple[Parameter, ...] = (
    Parameter("bundle", "str | None", None, "the bundle directory (with ``bundle.toml``); default the demo bundle.", "--bundle", "source"),
    Parameter("provider", "ProviderName", DEFAULT_PROVIDER, "where the pod runs: ``local`` (the embedded local pod, a loopback SSH server that behaves like RunPod's PTY-only gateway; the default) or ``runpod``.", "--provider", "source", choices=_providers),
    Parameter("model_id", "str | None", None, "the Hugging Face repo the job downloads (default: the bundle's); checked locally before any spend and again on the pod.", "--model-id", "source"),
    Parameter("hf_credentials_block", "str | None", None, "the name of a saved ``HuggingFaceCredentials`` block holding the Hugging Face token (and the Hub endpoint).", "--hf-credentials", "source", metavar="NAME"),
    Parameter("hf_token_secret", "str | None", None, "the name of a saved Prefect ``Secret`` block holding the Hugging Face token (instead of ``hf_credentials_block``).", "--hf-token-secret", "source", metavar="NAME"),
    Parameter("hf_token_env", "str", DEFAULT_HF_TOKEN_ENV, f"without either block, the environment variable of the process running the flow (the worker) that holds the token; default ``{DEFAULT_HF_TOKEN_ENV}``. A token is never a parameter: Prefect stores parameters as sent.", "--hf-token-env", "source", metavar="VAR"),
    Parameter("hf_endpoint", "str | None", None, "the Hugging Face Hub endpoint (default: the block's, else huggingface.co; a mirror or a test Hub), for the model check and for publishing.", "--hf-endpoint", "source"),
    Parameter("transfer_method", "str", DEFAULT_TRANSFER_METHOD, "how files travel to and from the pod: ``auto`` (s3 with ``s3_target_block``; with direct SSH rsync where both ends have it, else sftp; else pty), or a method by name: ``pty``, ``sftp``, ``rsync``, ``s3``, ``runpodctl``.", "--transfer", "transfer", choices=_transfer_methods),
    Parameter("follow_links", "bool", False, "copy what links that leave the bundle (or the outputs) point at, instead of refusing them (each named) before anything is rented; in-tree relative links always travel as links.", "--follow-links", "transfer"),
    Parameter("pty_framing", 'Literal["auto", "raw", "base64"]', DEFAULT_PTY_FRAMING, "how the ``pty`` method frames bytes: ``auto`` (raw frames when a probe finds that every byte value crosses the gateway unchanged, base64 otherwise), ``raw`` (or a clear error) or ``base64``.", "--pty-framing", "transfer"),
    Parameter("pty_streams", "int", DEFAULT_PTY_STREAMS, f"PTY sessions a ``pty`` transfer stripes large files over (1-16, default {DEFAULT_PTY_STREAMS}; more than 1 for a gateway that caps each session's bandwidth).", "--pty-streams", "transfer", meaning="how many PTY sessions a pty transfer stripes over", example="4", ge=1, le=16, whole=True),
    Parameter("max_cost_usd", "float | None", None, "the budget cap in USD: reaching it ends the run and terminates the pod.", "--max-cost-usd", "limits", unit="USD", meaning="the budget cap", example="2", gt=0, le=100_000),
    Parameter("max_runtime_seconds", "float", DEFAULT_MAX_RUNTIME_SECONDS, f"the training runtime cap in seconds (default {DEFAULT_MAX_RUNTIME_SECONDS:g}).", "--max-runtime-seconds", "limits", unit="s", meaning="the training runtime cap", example="3600", gt=0, le=_MONTH_SECONDS),
    Parameter("parity_tolerance", "float", DEFAULT_PARITY_TOLERANCE, f"the allowed accuracy gap between in-training and standalone eval (default {DEFAULT_PARITY_TOLERANCE:g}).", "--parity-tolerance", "limits", meaning="the allowed accuracy gap, a fraction", example="0.02", ge=0, lt=1),
    Parameter("parity_warn_only", "bool", False, "record an eval-parity failure without failing the run.", "--parity-warn-only", "limits"),
    Parameter("keep_pod_on_failure", "bool", False, "leave the pod up after a failure for inspection (the dead-man lifetime still ends it).", "--keep-pod-on-failure", "limits"),
    Parameter("name_prefix", "str", DEFAULT_NAME_PREFIX, f"pods are named ``<name_prefix>-<flow_run_id>`` (default ``{DEFAULT_NAME_PREFIX}``).", "--name-prefix", "limits"),
    Parameter("local_cost_per_hr", "float | None", None, "the local pod's pretend price in USD/h, to rehearse costs (e.g. 0.22; default 0); local provider only.", "--local-cost-per-hr", "local pod", unit="USD/h", meaning="the local pod's pretend price", example="0.22", ge=0, le=1000),
    Parameter("local_mode", 'Literal["gateway", "direct"] | None', None, "the local pod's SSH mode: ``gateway`` (PTY only, like RunPod; the default) or ``direct`` (exec and SFTP); local provider only.", "--local-mode", "local pod"),
    Parameter("local_image", "str | None", None, "the local pod's image profile, the login environment of a real image to rehearse on (``plain``, the default, ``runpod-pytorch``, ``conda``, ``fancy``, ``venv-python``; see docs/local-pod-images.md); local provider only.", "--local-image", "local pod", metavar="NAME", choices=_local_images),
    Parameter("output_dir", "str | None", None, "where downloads and ``run-report.json`` go (default ``./prefect-runpod-runs/<flow_run_id>``).", "--output-dir", "pod life"),
    Parameter("concurrency_limit", "str | None", None, "the name of a Prefect global concurrency limit (e.g. ``runpod-gpu``; ``prefect gcl create NAME --limit N``) whose slots cap how many pods live at once: a run holds one from provision to terminate.", "--concurrency-limit", "pod life", metavar="LIMIT_NAME"),
    Parameter("pod_poll_seconds", "float", DEFAULT_POD_POLL_SECONDS, f"how often the run asks the provider whether its pod still lives (default {DEFAULT_POD_POLL_SECONDS:g} s; it also asks before every reconnect); a pod gone under the run stops it at once.", "--pod-poll-seconds", "pod life", unit="s", meaning="how often the run asks the provider whether its pod still lives", example="10", gt=0, le=3600),
    Parameter("terminate_timeout_seconds", "float", DEFAULT_TERMINATE_TIMEOUT_SECONDS, f"how long terminate waits for the provider to confirm the pod gone (default {DEFAULT_TERMINATE_TIMEOUT_SECONDS:g} s); unconfirmed, the run fails saying the pod may still be billing.", "--terminate-timeout-seconds", "pod life", unit="s", meaning="how long terminate waits for the provider to confirm the pod gone", example="120", gt=0, le=3600),
    Parameter("heartbeat_stale_seconds", "float", DEFAULT_HEARTBEAT_STALE_SECONDS, f"the pod-side dead-man switch: the pod removes itself when the flow's heartbeat is older than this (default {DEFAULT_HEARTBEAT_STALE_SECONDS:g} s).", "--heartbeat-stale-seconds", "pod life", unit="s", meaning="how old the flow's heartbeat may get before the pod removes itself", example="900", gt=0, le=_MONTH_SECONDS),
    Parameter("pod_lifetime_seconds", "float", DEFAULT_POD_LIFETIME_SECONDS, f"the hard cap on the pod's life in seconds (default {DEFAULT_POD_LIFETIME_SECONDS:g}): the dead-man switch's; the reaper ends a pod past it plus 10 minutes.", "--pod-lifetime-seconds", "pod life", unit="s", meaning="the hard cap on the pod's life", example="21600", gt=0, le=_MONTH_SECONDS),
    Parameter("reconnect_budget_seconds", "float", DEFAULT_RECONNECT_BUDGET_SECONDS, f"once the pod is ready, how long each stage waits out a gateway that refuses or drops connections (default {DEFAULT_RECONNECT_BUDGET_SECONDS:g} s; backoff, the provider asked before each retry whether the pod still lives), the train stage and its kill path included; SSH down for the whole budget while the provider says the pod runs means its host is lost.", "--reconnect-budget-seconds", "pod life", unit="s", meaning="how long a stage waits for the pod's SSH to come back", example="120", gt=0, le=_DAY_SECONDS),
    Parameter("runpod_credentials_block", "str | None", None, "the name of a saved ``RunPodCredentials`` block (without one: ``RUNPOD_API_KEY``); RunPod only.", "--runpod-credentials", "blocks", metavar="NAME"),
    Parameter("runpod_spec_block", "str | None", None, "the name of a saved ``RunPodPodSpec`` block (GPU types, image, disks; without one: the defaults); RunPod only.", "--runpod-spec", "blocks", metavar="NAME"),
    Parameter("ssh_key_block", "str | None", None, "the name of a saved ``RunPodSSHKey`` block (without one: ``RUNPOD_SSH_KEY_PATH``, default ``~/.ssh/id_ed25519_runpod``); RunPod only.", "--ssh-key", "blocks", metavar="NAME"),
    Parameter("gpu_type_ids", "list[str] | None", None, "RunPod GPU type ids to fall back over, in order (overrides the spec block's list); on the CLI repeat the option, e.g. ``--gpu-type 'NVIDIA GeForce RTX 3090' --gpu-type 'NVIDIA GeForce RTX 4090'``.", "--gpu-type", "blocks", metavar="GPU_TYPE_ID"),
    Parameter("s3_target_block", "str | None", None, "the name of a saved ``S3Target`` block (a bucket, or a RunPod network volume's S3 endpoint) for ``transfer_method`` s3 (or auto) and ``publish`` s3.", "--s3-target", "blocks", metavar="NAME", used_with=(DEFAULT_TRANSFER_METHOD, "s3"), needed_by=("s3",)),
    Parameter("allow_secret_files", "list[str] | None", None, "bundle paths (gitignore patterns) that look like secrets and are uploaded anyway, on purpose; every other such file stops the run. On the CLI repeat the option.", "--allow-secret-file", "blocks", metavar="PATH"),
    Parameter("publish", "str | None", None, "ship the outputs from the pod itself, verified there from the destination's own records: ``hf:ORG/REPO[@BRANCH]`` (a Hub model repo, private unless ``publish_public``; the token needs write access) or ``s3[:PREFIX]`` (into the ``s3_target_block`` bucket); without it nothing is published (the stage is Skipped).", "--publish", "publish", metavar="TARGET"),
    Parameter("publish_public", "bool", False, "create the Hub repo public (default private).", "--publish-public", "publish"),
    Parameter("download", 'Literal["all", "eval", "none"]', DEFAULT_DOWNLOAD, "what comes back through the gateway: ``all`` outputs (the default), only the ``eval`` files, or ``none`` (only with ``publish``).", "--download", "publish"),
    Parameter("max_pod_losses", "int", DEFAULT_MAX_POD_LOSSES, f"for a bundle that declares ``checkpoints``: how many lost pods (EXITED, ERROR, host lost, unreachable and confirmed gone) the run resumes after, each time on a new pod from the last verified checkpoint (default {DEFAULT_MAX_POD_LOSSES}; 0 never resumes); one more loss fails the run with the checkpoint kept.", "--max-pod-losses", "pod life", meaning="how many lost pods a run resumes after", example="2", ge=0, le=100, whole=True),
    Parameter("max_recovery_usd", "float | None", None, "for a bundle that declares ``checkpoints``: the most the run may spend on pods it lost, in USD; before a lost pod is replaced, the run stops (its last verified checkpoint kept) when what the lost pods billed together is at this cap or over it; default no cap (``max_cost_usd`` still counts every pod).", "--max-recovery-usd", "pod life", unit="USD", meaning="the recovery spend cap", example="1", gt=0, le=100_000),
    Parameter("resume_from", "str | None", None, "continue a run whose own process died (its pod ended by the dead-man, the guardian or the reaper) from its last verified checkpoint: the flow run id of that run (its output dir is found from its cost record), the run's output dir, or one checkpoint folder in it; the checkpoint is verified before anything is rented and the bundle must declare ``checkpoints``.", "--resume-from", "pod life", metavar="RUN_ID|PATH"),
    Parameter("recover_outside_terminate", "bool", False, "also resume after a pod ended outside the run (a 404 or TERMINATED no layer of the run caused, e.g. from RunPod's console); a terminate by ``prefect-runpod terminate`` or by the run's caps always ends the run.", "--recover-outside-terminate", "pod life"),
    Parameter("overwrite", "bool", False, "write into an ``output_dir`` that already holds files (an earlier run's): without it such a folder is refused before anything is rented; files there that the run does not bring are named, never counted as verified.", "--overwrite", "pod life"),
)  # fmt: skip
"""The fine-tune flow's parameters, in the order of its signature."""

_BY_NAME = {p.name: p for p in FINETUNE_PARAMETERS}
_OPTION_OF = {p.name: p.option for p in FINETUNE_PARAMETERS if p.option}
_CODE = re.compile(r"``([^`]+)``")


def parameter(name: str) -> Parameter:
    """The parameter called ``name``. Raises KeyError for an unknown one."""
    return _BY_NAME[name]


def defaults() -> dict[str, Any]:
    """Every parameter's default, by name (a fresh dict)."""
    return {p.name: p.default for p in FINETUNE_PARAMETERS}


def literal_choices(param: Parameter) -> tuple[str, ...] | None:
    """The values of a ``Literal[...]`` annotation (``pty_framing``, ``download``,
    ``local_mode``), else None."""
    text = param.annotation
    if not text.startswith("Literal["):
        return None
    inside = text[len("Literal[") : text.index("]")]
    return tuple(part.strip().strip("\"'") for part in inside.split(","))


def number_parameters() -> Iterator[Parameter]:
    """The parameters that carry a number rule."""
    return (p for p in FINETUNE_PARAMETERS if p.meaning is not None)


_F = TypeVar("_F", bound=Callable[..., Any])


def document(fn: _F) -> _F:
    """Write the fine-tune flow's ``Args:`` section from the table: ``fn``'s docstring
    keeps its own summary, ``Returns:`` and ``Raises:``; the line ``Args:`` is replaced
    by one entry per parameter (its help, wrapped as Google style wants). Prefect reads
    the result for the deployment's parameter descriptions.

    Returns:
        ``fn`` itself, its ``__doc__`` rewritten.
    """
    doc = inspect.cleandoc(fn.__doc__ or "")
    head, marker, tail = doc.partition("\nArgs:\n")
    if not marker:
        raise ValueError(f"{fn.__name__}'s docstring has no 'Args:' line to fill in")
    entries = []
    for p in FINETUNE_PARAMETERS:
        entries.append(
            textwrap.fill(
                f"{p.name}: {p.help}",
                width=88,
                initial_indent="    ",
                subsequent_indent="        ",
                break_on_hyphens=False,
            )
        )
    fn.__doc__ = f"{head}\nArgs:\n" + "\n".join(entries) + "\n" + tail
    return fn
