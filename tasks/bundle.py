"""The training bundle: a directory with the job's code, data and a ``bundle.toml``.

``bundle.toml`` declares how the job runs on the pod::

    [job]
    train = "{python} -u train.py --out outputs"          # launched detached on the pod
    eval = "{python} -u eval.py --out outputs/eval_standalone.jsonl"  # the user's own eval
    outputs = "outputs"                                    # downloaded after training
    train_eval_jsonl = "outputs/eval_train.jsonl"          # in-training eval, JSONL
    standalone_eval_jsonl = "outputs/eval_standalone.jsonl"
    output_format = "<output>(.*?)</output>"               # what the model was trained to emit
    requirements = []                                      # pip specifiers; drive the env stage
    model_id = ""                                          # Hugging Face repo, "" for none
    expected_runtime_seconds = 600                         # what `plan` prices; 0: unknown
    checkpoints = "checkpoints"                            # optional: where the job checkpoints
    checkpoint_marker = ""                                 # "" : complete by atomic rename
    keep_checkpoints = 2                                   # verified checkpoints kept locally

``{python}`` is replaced by the interpreter the env stage chose. Paths are relative to
the bundle root (the pod-side bundle directory when run there).

A bundle that declares ``checkpoints`` can be resumed on a new pod
(docs/architecture.md#resuming-from-a-checkpoint): each checkpoint is a folder directly
under it, named with its step last (``step-4``), and only the job says it is complete —
by renaming ``step-4.tmp/`` to ``step-4/`` (the default) or, with ``checkpoint_marker``,
by writing that file inside it last. The train command then carries ``{resume_from}``
(replaced by the checkpoint's path, shell-quoted, or ``''`` for a fresh start); with
``resume_from_env = true`` the job reads ``PREFECT_RUNPOD_RESUME_FROM`` instead.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from prefect_runpod.blocks import validation as v
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation import pydantic_reason

__all__ = [
    "BUNDLE_FILE",
    "JOB_KEYS",
    "RESUME_ENV",
    "RESUME_PLACEHOLDER",
    "BundleSpec",
    "check_job_types",
    "demo_bundle",
    "load_bundle",
]

BUNDLE_FILE = "bundle.toml"

RESUME_PLACEHOLDER = "{resume_from}"
"""Replaced in ``train`` by the checkpoint to resume from (shell-quoted; ``''`` when none)."""

RESUME_ENV = "PREFECT_RUNPOD_RESUME_FROM"
"""The job's environment variable naming the checkpoint to resume from ("" when none)."""


class BundleSpec(BaseModel):
    """The ``[job]`` table of a bundle (see the module docstring for the file format).

    Attributes:
        root: the local bundle directory (absolute).
        train: training command template (``{python}`` placeholder allowed).
        eval: standalone eval command template, or "" for none.
        outputs: relative directory downloaded after training (checkpoint, eval JSONL).
        train_eval_jsonl / standalone_eval_jsonl: relative paths of the two eval JSONL files.
        output_format: regex with one group: the label the model emits.
        requirements: pip requirement specifiers the job needs.
        model_id: Hugging Face repo id the job downloads, "" for none.
        expected_runtime_seconds: how long training is expected to take on the pod, in
            seconds (0 when unknown): ``prefect-runpod plan`` prices the run from it.
        checkpoints: relative folder the job writes its checkpoints in, "" for none (the
            run cannot resume; nothing below changes what it does).
        checkpoint_marker: a file name the job writes last inside a complete checkpoint;
            "" when the job completes one by renaming ``NAME.tmp/`` to ``NAME/``.
        keep_checkpoints: how many verified checkpoints the run keeps locally (>= 1).
        resume_from_env: the job reads ``PREFECT_RUNPOD_RESUME_FROM`` rather than a
            ``{resume_from}`` argument in ``train``.
    """

    root: str
    train: str
    eval: str = ""
    outputs: str = "outputs"
    train_eval_jsonl: str = "outputs/eval_train.jsonl"
    standalone_eval_jsonl: str = "outputs/eval_standalone.jsonl"
    output_format: str = "<output>(.*?)</output>"
    requirements: list[str] = Field(default_factory=list)
    model_id: str = ""
    expected_runtime_seconds: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    checkpoints: str = ""
    checkpoint_marker: str = ""
    keep_checkpoints: int = Field(default=2, ge=1)
    resume_from_env: bool = False

    @field_validator("outputs", "train_eval_jsonl", "standalone_eval_jsonl")
    @classmethod
    def _relative(cls, value: str) -> str:
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts or not value.strip():
            raise ValueError(f"{value!r} must be a relative path inside the bundle")
        return cls._printable(value)

    @staticmethod
    def _printable(value: str) -> str:
        """A path or file name without a control character (a NUL ends the name the
        pod's tools see; a newline splits the listings read back line by line)."""
        found = v.control_character(value)
        if found:
            raise ValueError(f"{value!r} holds a control character ({found}): remove it")
        return value

    @field_validator("checkpoints")
    @classmethod
    def _checkpoint_folder(cls, value: str) -> str:
        return cls._relative(value) if value else value

    @field_validator("checkpoint_marker")
    @classmethod
    def _marker_name(cls, value: str) -> str:
        if value and (value in (".", "..") or "/" in value or value != value.strip()):
            raise ValueError(f"checkpoint_marker {value!r} must be a plain file name")
        return cls._printable(value)

    @model_validator(mode="after")
    def _resume_contract(self) -> BundleSpec:
        placeholder = RESUME_PLACEHOLDER in self.train
        if self.checkpoints and not (placeholder or self.resume_from_env):
            raise ValueError(
                f"checkpoints = {self.checkpoints!r} needs a way to resume: put "
                f"{RESUME_PLACEHOLDER} in 'train' or set resume_from_env = true"
            )
        if not self.checkpoints and (placeholder or self.checkpoint_marker):
            raise ValueError(
                f"'train' uses {RESUME_PLACEHOLDER} or checkpoint_marker is set, but no "
                'checkpoints folder is declared: add checkpoints = "<folder>"'
            )
        return self

    @field_validator("train", "eval")
    @classmethod
    def _plain_command(cls, value: str, info: ValidationInfo) -> str:
        return v.check_command(str(info.field_name), value)

    @field_validator("requirements")
    @classmethod
    def _pip_specifiers(cls, value: list[str]) -> list[str]:
        return [v.check_requirement(item) for item in value]

    @field_validator("output_format")
    @classmethod
    def _one_group(cls, value: str) -> str:
        try:
            compiled = re.compile(value, re.DOTALL)
        except re.error as exc:
            raise ValueError(f"output_format {value!r} is not a valid regex: {exc}") from exc
        if compiled.groups != 1:
            raise ValueError(f"output_format {value!r} must have exactly one capture group")
        return value

    def command(self, template: str, python: str, resume_from: str = "") -> str:
        """A command template with ``{python}`` replaced by the chosen interpreter and
        ``{resume_from}`` by ``resume_from`` shell-quoted (``''`` for a fresh start)."""
        return template.replace("{python}", python).replace(
            RESUME_PLACEHOLDER, shlex.quote(resume_from)
        )


JOB_KEYS: frozenset[str] = frozenset(BundleSpec.model_fields) - {"root"}
"""The keys ``[job]`` may hold: the ``BundleSpec`` fields (a new key is a new field);
any other key is refused, with the nearest known one."""


BUNDLE_TABLES: frozenset[str] = frozenset({"job"})
"""The tables ``bundle.toml`` may hold at its top level; another (a misspelt ``[jobs]``
beside ``[job]``) is refused, with the nearest known one."""


_TOML_TYPES: dict[object, str] = {
    bool: "a boolean (true or false, unquoted)",
    int: "a whole number (unquoted, e.g. 2)",
    float: "a number (unquoted, e.g. 600)",
}
"""What a ``[job]`` key of each Python type must be written as in TOML."""


def check_job_types(job: dict[str, Any], spec_file: Path) -> None:
    """Refuse a boolean or numeric ``[job]`` key written as another TOML type: pydantic
    would read ``resume_from_env = "yes"`` (or ``1``) as true, ``keep_checkpoints = "2"``
    and ``expected_runtime_seconds = true`` as numbers.

    Args:
        job: the ``[job]`` table as ``tomllib`` read it.
        spec_file: the ``bundle.toml`` it came from, for the message.

    Raises:
        SpecError: naming the key, the value as written and the TOML type expected.
    """
    for key, value in job.items():
        field = BundleSpec.model_fields.get(key)
        want = field.annotation if field is not None else None
        if want not in _TOML_TYPES:
            continue
        if isinstance(value, bool):
            ok = want is bool
        else:
            ok = isinstance(value, int) if want is int else isinstance(value, (int, float))
            ok = ok and want is not bool
        if not ok:
            raise SpecError(
                f"{spec_file} is invalid: [job] {key} = {_as_written(value)} is "
                f"{_toml_kind(value)}, but {key} must be {_TOML_TYPES[want]}; fix the file"
            )


def _as_written(value: object) -> str:
    """A TOML value roughly as the file writes it (strings quoted, escapes shown)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = (
        json.dumps(value, default=str, ensure_ascii=False)
        if isinstance(value, (str, list, dict))
        else repr(value)
    )
    return text if len(text) <= 60 else text[:57] + "..."


def _toml_kind(value: object) -> str:
    kinds: list[tuple[type, str]] = [(bool, "a boolean"), (str, "a string")]
    kinds += [(int, "a whole number"), (float, "a decimal number"), (list, "an array")]
    kinds.append((dict, "a table"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "a date or time")


def load_bundle(path: str | Path) -> BundleSpec:
    """Read and validate ``<path>/bundle.toml``.

    Args:
        path: the bundle directory.

    Returns:
        The validated ``BundleSpec`` with ``root`` set to the absolute directory.

    Raises:
        SpecError: when the directory or its ``bundle.toml`` is missing, unreadable, or
            invalid (the message names the file and the field).
    """
    root = Path(path).expanduser().resolve()
    spec_file = root / BUNDLE_FILE
    if root.exists() and not root.is_dir():
        raise SpecError(f"bundle {root} is a file, not a directory: pass --bundle DIR")
    if not root.is_dir():
        raise SpecError(f"bundle directory {root} does not exist: pass --bundle DIR")
    if not spec_file.is_file():
        raise SpecError(
            f"{spec_file} is missing: a bundle declares its job in {BUNDLE_FILE} "
            "(a [job] table with a 'train' command); add one, or pass another --bundle"
        )
    try:
        data = tomllib.loads(spec_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"{spec_file} cannot be read ({exc}): fix the file") from None
    v.check_table_keys(data, BUNDLE_TABLES, "the top level", spec_file)  # [jobs], [Job]
    job = data.get("job")
    if not isinstance(job, dict) or not job.get("train"):
        raise SpecError(f"{spec_file} needs a [job] table with a 'train' command: add one")
    v.check_table_keys(job, JOB_KEYS, "[job]", spec_file)
    check_job_types(job, spec_file)
    try:
        return BundleSpec(root=str(root), **job)
    except ValueError as exc:
        raise SpecError(f"{spec_file} is invalid: {pydantic_reason(exc)}; fix the file") from None


def demo_bundle() -> Path:
    """The stdlib-only demo bundle shipped with the project (used when no bundle is given);
    installed as the package ``prefect_runpod.examples.demo``."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("prefect_runpod.examples.demo")
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if (Path(location) / "bundle.toml").is_file():
                return Path(location)
    return Path(__file__).resolve().parent.parent / "examples" / "demo"
