"""The eval-parity stage (docs/architecture.md#eval-parity): run the bundle's own
standalone eval on the pod, bring both eval JSONL files home, and compare them with
:func:`~prefect_runpod.tasks.parity_compare.compare_eval` (pure, in
:mod:`prefect_runpod.tasks.parity_compare`, which also says what the files hold and
which drifts it names).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import get_run_logger, task

from prefect_runpod.blocks.api_outbox import outbox
from prefect_runpod.blocks.exceptions import EvalParityError
from prefect_runpod.blocks.held_artifacts import hold_artifact
from prefect_runpod.blocks.secret_mask import redact
from prefect_runpod.tasks.models import ParityReport
from prefect_runpod.tasks.parity_compare import compare_eval, load_jsonl
from prefect_runpod.tasks.parity_render import (
    DEFAULT_OUTPUT_FORMAT,
    char_diff,
    render_parity_markdown,
)

if TYPE_CHECKING:  # the console package loads paramiko; comparing needs none of it
    from pydantic import SecretStr

    from prefect_runpod.blocks.console import CommandOutput, ConsoleLike
    from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
    from prefect_runpod.blocks.pod_handle import PodHandle
    from prefect_runpod.blocks.transfer.s3 import S3Target
    from prefect_runpod.tasks.bundle import BundleSpec

__all__ = [
    "DEFAULT_OUTPUT_FORMAT",
    "char_diff",
    "check_parity_on_pod",
    "eval_parity",
    "render_parity_markdown",
    "run_standalone_eval",
]


def run_standalone_eval(
    console: ConsoleLike,
    bundle_remote_dir: str,
    eval_command: str,
    python: str,
    timeout_seconds: float,
    output_path: str | None = None,
) -> CommandOutput:
    """Run the bundle's own, unmodified eval command on the pod, as the user would.

    Args:
        console: an open pod console (``PodConsole`` or any ``ConsoleLike``).
        bundle_remote_dir: the bundle's directory on the pod (the command runs there).
        eval_command: the ``eval`` template from ``bundle.toml`` (``{python}`` placeholder).
        python: the interpreter the env stage chose.
        timeout_seconds: the deadline for the whole eval, in seconds.
        output_path: the standalone JSONL path relative to the bundle; when given, a stale
            copy is removed first and its absence afterwards is an error.

    Returns:
        The console's result of the eval command (``output``, ``exit_code``).

    Raises:
        EvalParityError: the eval exited non-zero or wrote no ``output_path`` (the message
            carries the last lines of its output).
        CommandTimeoutError: (from the console) the eval ran past ``timeout_seconds``.
    """
    if not eval_command.strip():
        raise EvalParityError(
            "bundle.toml declares no eval command; add `eval = ...` to [job] or skip eval parity",
            stage="eval_parity",
        )
    command = eval_command.replace("{python}", python)
    script = f"cd {shlex.quote(bundle_remote_dir)} && "
    if output_path:
        script += f"rm -f {shlex.quote(output_path)} && "
    script += command
    if output_path:
        script += f" && test -s {shlex.quote(output_path)}"
    result = console.run(script, timeout_seconds=timeout_seconds, check=False)
    if result.exit_code != 0:
        tail = "\n".join(str(result.output).splitlines()[-15:])
        missing = f" or wrote no {output_path}" if output_path else ""
        raise EvalParityError(
            f"the standalone eval `{command}` exited {result.exit_code}{missing} in "
            f"{bundle_remote_dir}; fix the bundle's eval script. Last lines:\n{tail}",
            stage="eval_parity",
        )
    return result


@task(name="eval_parity")
def eval_parity(
    train_jsonl: str | Path,
    eval_jsonl: str | Path,
    output_format: str = DEFAULT_OUTPUT_FORMAT,
    tolerance: float = 0.02,
    max_divergent: int = 5,
    warn_only: bool = False,
    pod_id: str | None = None,
) -> ParityReport:
    """Compare the downloaded in-training and standalone eval JSONL files, publish the
    ``eval-parity`` markdown artifact, and return the report.

    Args:
        train_jsonl / eval_jsonl: local paths of the two eval files.
        output_format, tolerance, max_divergent: see ``compare_eval``.
        warn_only: log a failed verdict instead of raising.
        pod_id: the pod the evals ran on, for messages.

    Returns:
        The ``ParityReport``.

    Raises:
        EvalParityError: the verdict is ``fail`` and not ``warn_only`` (``report`` attached),
            or a file is missing or malformed (from ``load_jsonl``).
    """
    logger = get_run_logger()
    report = compare_eval(
        load_jsonl(train_jsonl), load_jsonl(eval_jsonl), output_format, tolerance, max_divergent
    )
    hold_artifact(
        "eval-parity",
        "markdown",
        redact(render_parity_markdown(report)),  # records quote the job's own text
        f"eval parity {report.verdict} on pod {pod_id or '-'}",
    )
    outbox().flush()  # in Prefect before the stage ends, unless the API is down
    logger.info(
        "%s eval parity %s: in-training %.3f vs standalone %.3f on %d records",
        pod_id or "-",
        report.verdict,
        report.accuracy_train,
        report.accuracy_eval,
        report.n_records,
    )
    if report.verdict == "fail":
        summary = "; ".join(report.reasons)
        if warn_only:
            logger.warning("%s eval parity failed (warn_only): %s", pod_id or "-", summary)
        else:
            raise EvalParityError(
                f"eval parity failed on pod {pod_id or '-'}: {summary}. See the eval-parity "
                "artifact; make the standalone eval use the training preprocessing and "
                "output parsing, or pass warn_only to accept it.",
                report=report,
                pod_id=pod_id,
                stage="eval_parity",
            )
    return report


def _copy_both(remote_bundle: str, parity_dir: str, bundle: BundleSpec) -> str:
    """The pod command that copies both eval files into ``parity_dir`` (as
    ``train.jsonl`` and ``standalone.jsonl``), so only they travel."""
    q = shlex.quote
    return (
        f"rm -rf {q(parity_dir)} && mkdir -p {q(parity_dir)} && "
        f"cp {q(remote_bundle + '/' + bundle.train_eval_jsonl)} {q(parity_dir)}/train.jsonl && "
        f"cp {q(remote_bundle + '/' + bundle.standalone_eval_jsonl)} {q(parity_dir)}/standalone.jsonl"
    )


def check_parity_on_pod(
    handle: PodHandle,
    private_key: SecretStr,
    bundle: BundleSpec,
    run_dir: str,
    python: str,
    local_dir: Path,
    *,
    timeout_seconds: float,
    tolerance: float = 0.02,
    warn_only: bool = False,
    transfer_method: str = "auto",
    hf_token: SecretStr | None = None,
    s3: S3Target | None = None,
    reconnect: ReconnectPolicy | None = None,
) -> ParityReport:
    """The whole ``eval_parity`` stage on a trained pod: run the bundle's own standalone
    eval there, bring both eval JSONL files home with a verified manifest, and compare
    them (``eval_parity``).

    The two files are copied on the pod into ``<run_dir>/parity`` (as ``train.jsonl``
    and ``standalone.jsonl``) so that only they travel, then downloaded into
    ``local_dir``.

    Args:
        handle: the pod.
        private_key: the SSH key (unwrapped only inside the console).
        bundle: the bundle spec: its ``eval`` command, both JSONL paths, ``output_format``.
        run_dir: the pod-side run directory; the trained bundle is ``<run_dir>/bundle``.
        python: the pod interpreter the env stage chose (``{python}`` in the command).
        local_dir: where the two JSONL files are downloaded.
        timeout_seconds: the deadline for the standalone eval, in seconds.
        tolerance / warn_only: as for ``eval_parity``.
        transfer_method: ``auto``, ``pty``, ``sftp``, ``s3`` or ``runpodctl``.
        hf_token: exported hidden as ``HF_TOKEN`` first: the eval may load a gated base
            model too.
        s3: the ``S3Target`` for ``transfer_method="s3"``.
        reconnect: the run's reconnect policy: a gateway outage is waited out and the
            step it cut off (the eval, which removes its stale output first, the copy,
            the download from its last verified chunk) runs again.

    Returns:
        The ``ParityReport`` (verdict ``pass``, or ``fail`` under ``warn_only``).

    Raises:
        EvalParityError: the eval failed or wrote nothing, or the verdict is ``fail``
            without ``warn_only`` (the report attached as ``.report``).
        ConsoleError: the copy on the pod failed. ConsoleConnectError and
            CommandTimeoutError come from the console, TransferError and
            ChecksumMismatchError from the download.

    Example:
        ```python
        @flow
        def parity(handle, key, bundle):
            return check_parity_on_pod(
                handle, key, bundle, "/workspace/prefect-runpod/run-1", "python3",
                Path("out/parity"), timeout_seconds=3600,
            )
        ```
    """
    from prefect_runpod.blocks.console import PodConsole
    from prefect_runpod.blocks.console.reconnect import resuming
    from prefect_runpod.blocks.transfer import download_dir

    remote_bundle = f"{run_dir}/bundle"
    parity_dir = f"{run_dir}/parity"
    with PodConsole.for_pod(handle, private_key, reconnect=reconnect) as console:
        steps = resuming(console)
        if hf_token is not None:
            console.set_secret_env("HF_TOKEN", hf_token)
        run_standalone_eval(
            steps,
            remote_bundle,
            bundle.eval,
            python,
            timeout_seconds=timeout_seconds,
            output_path=bundle.standalone_eval_jsonl,
        )
        steps.run(_copy_both(remote_bundle, parity_dir, bundle), check=True)
        download_dir(
            console,
            handle,
            parity_dir,
            local_dir,
            method=transfer_method,
            private_key=private_key,
            s3=s3,
        )
    return eval_parity(
        local_dir / "train.jsonl",
        local_dir / "standalone.jsonl",
        output_format=bundle.output_format,
        tolerance=tolerance,
        warn_only=warn_only,
        pod_id=handle.pod_id,
    )
