"""The one validation layer for what a person or a pipeline asks of prefect-runpod
(docs/architecture.md#input-validation).

The CLI, the fine-tune flow's parameters, the blocks, the reaper and every later
command check their input here, so a limit is written once and cannot disagree between
two entry points. Everything is a plain function (or a pydantic type built from one)
that raises ``SpecError`` with one sentence: what was wrong and what to do. None of it
rents, writes or sends anything; only :func:`load_block` and :func:`saved_block_names`
talk to the Prefect API.

A module for each kind of input, every public name re-exported here:

- ``numbers``    :data:`NUMBER_RULES`, :func:`check_number`, :func:`constrained`, :func:`check_choice`
- ``names``      the pod-name prefix, block names, repo ids, env names, limits, pod and flow run ids, UTC times
- ``locations``  URLs and the output dir
- ``options``    each parameter's CLI option (:func:`label`), options of the other provider
- ``secrets``    token shapes, no token in a parameter
- ``text``       empty paths, control characters in commands, file names that cannot travel, table keys, pip specifiers
- ``blocks``     saved blocks (:func:`load_block`), pydantic's errors as our sentences

Matches are whole-string (``re.fullmatch``), never prefix matches. Importing the
package loads pydantic but not Prefect.
"""

from __future__ import annotations

from prefect_runpod.blocks.validation.blocks import load_block, pydantic_reason, saved_block_names
from prefect_runpod.blocks.validation.locations import (
    check_output_dir,
    check_output_dir_unused,
    check_url,
)
from prefect_runpod.blocks.validation.names import (
    FLOW_RUN_ID_CHARS,
    NAME_PREFIX_MAX_CHARS,
    POD_NAME_MAX_CHARS,
    check_block_name,
    check_env_name,
    check_flow_run_id,
    check_limit_name,
    check_name_prefix,
    check_pod_id,
    check_repo_id,
    is_env_name,
    utc_timestamp,
)
from prefect_runpod.blocks.validation.numbers import (
    NUMBER_RULES,
    NumberRule,
    check_choice,
    check_number,
    constrained,
)
from prefect_runpod.blocks.validation.options import (
    OPTIONS,
    check_provider_options,
    label,
    provider_options,
)
from prefect_runpod.blocks.validation.secrets import (
    SECRET_ENV_NAME,
    TOKEN_SHAPES,
    TokenShape,
    find_token_shape,
    refuse_secret_values,
)
from prefect_runpod.blocks.validation.text import (
    check_command,
    check_inside_path,
    check_path_text,
    check_requirement,
    check_table_keys,
    control_character,
    file_name_problem,
    shown_name,
)

__all__ = [
    "FLOW_RUN_ID_CHARS",
    "NAME_PREFIX_MAX_CHARS",
    "NUMBER_RULES",
    "OPTIONS",
    "POD_NAME_MAX_CHARS",
    "SECRET_ENV_NAME",
    "TOKEN_SHAPES",
    "NumberRule",
    "TokenShape",
    "check_block_name",
    "check_choice",
    "check_command",
    "check_env_name",
    "check_flow_run_id",
    "check_inside_path",
    "check_limit_name",
    "check_name_prefix",
    "check_number",
    "check_output_dir",
    "check_output_dir_unused",
    "check_path_text",
    "check_pod_id",
    "check_provider_options",
    "check_repo_id",
    "check_requirement",
    "check_table_keys",
    "check_url",
    "constrained",
    "control_character",
    "file_name_problem",
    "find_token_shape",
    "is_env_name",
    "label",
    "provider_options",
    "load_block",
    "pydantic_reason",
    "refuse_secret_values",
    "saved_block_names",
    "shown_name",
    "utc_timestamp",
]
