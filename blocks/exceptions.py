"""Every error prefect-runpod raises, in one place.

The hierarchy, so a caller can pick what to catch::

    RunPodFlowError                     base: anything this package raises on purpose
    ├── SpecError                       bad input, raised before any pod exists (no spend)
    │   ├── SecretShapeError            a key or token holds whitespace or a control character
    │   └── LinksRefusedError           a tree holds links a transfer cannot carry (each named)
    ├── ProviderError                   the pod provider (RunPod API or the local pod) failed
    │   ├── CapacityError               no GPU of the requested types/clouds is free
    │   ├── ProviderAuthError           the API key was refused (HTTP 401); never retried
    │   ├── ProviderTransientError      5xx / "Something went wrong" / network; retried with backoff
    │   ├── PodGoneError                the pod is gone under the run (terminated outside, exited, host lost)
    │   ├── TerminateError              terminate could not be confirmed: the pod may still bill
    │   ├── RunPodAPIError              RunPod's REST v2 answered an RFC 9457 problem object
    │   └── AccountKeysError            a write that would drop an account SSH key, refused unsent
    ├── PodTimeoutError                 a bounded wait on a pod ran out
    ├── ConsoleError                    the PTY console failed
    │   ├── ConsoleConnectError         could not open the SSH session / PTY (``retryable`` or not)
    │   ├── CommandTimeoutError         one command passed its per-command deadline (Ctrl-C sent)
    │   └── ExecRefusedError            the gateway refused an exec/SFTP channel (PTY-only gateway)
    ├── TransferError                   a file transfer failed
    │   └── ChecksumMismatchError       a file's size/sha256 differs from its manifest entry
    ├── EnvError                        the pod's Python/torch/CUDA could not be made fit
    ├── HFAuthError                     Hugging Face access will fail; carries the diagnosis
    ├── TrainingError                   the training process exited non-zero or was killed
    ├── EvalParityError                 in-training and standalone eval disagree beyond tolerance
    ├── PublishError                    the pod could not publish the outputs to the Hub / S3
    └── BudgetExceededError             projected spend passed max_cost_usd, or runtime cap hit

    CancelRequested (a BaseException)   the flow run was set Cancelling in Prefect: a stop,
                                        like Ctrl-C, so no ``except Exception`` and no retry
                                        of a stage takes it for a failure

A published file whose copy at the destination differs from the pod's manifest is a
``ChecksumMismatchError`` (stage ``publish``), like any other file that arrived wrong.

Each message names the pod (when one exists) and the next step a person should
take, in the spirit of httpx's exceptions: the class says which phase failed. Every
message is redacted as the error is made (``blocks.secret_mask.redact``): an error's
text, which Prefect copies into state messages, events and results, never holds a
secret this process has read.

``GATEWAY_PTY_ERROR`` lives here too: the console recognises it to raise
``ExecRefusedError``, and the local pod's daemon, which must stay light (no paramiko,
no Prefect), writes it. This module imports nothing but ``secret_mask`` (standard
library only), so both can.
"""

from __future__ import annotations

__all__ = [
    "AccountKeysError",
    "BudgetExceededError",
    "CancelRequested",
    "CapacityError",
    "ChecksumMismatchError",
    "CommandTimeoutError",
    "DiskFullError",
    "ConsoleConnectError",
    "ConsoleError",
    "EnvError",
    "EvalParityError",
    "ExecRefusedError",
    "GATEWAY_PTY_ERROR",
    "LinksRefusedError",
    "HFAuthError",
    "PodGoneError",
    "PodTimeoutError",
    "ProviderAuthError",
    "ProviderError",
    "ProviderTransientError",
    "PublishError",
    "RunPodAPIError",
    "RunPodFlowError",
    "SecretShapeError",
    "SpecError",
    "TerminateError",
    "TrainingError",
    "TransferError",
]


class RunPodFlowError(Exception):
    """Base class of every error raised on purpose by prefect-runpod.

    Attributes:
        pod_id: the pod concerned, or None when no pod exists yet.
        stage: the stage that failed (``provision`` … ``terminate``), when known.
    """

    def __init__(self, message: str, *, pod_id: str | None = None, stage: str | None = None):
        from prefect_runpod.blocks.secret_mask import redact

        super().__init__(redact(message))
        self.pod_id = pod_id
        self.stage = stage


class SpecError(RunPodFlowError, ValueError):
    """Raised before provisioning when the run's input cannot work (bad name, env, GPU id,
    bundle path, budget). Nothing was created and nothing is billing."""


class SecretShapeError(SpecError):
    """Raised when a secret holds whitespace or a control character — a newline that came
    along with a copy-paste, a space, a tab — where it is read (``RUNPOD_API_KEY``, a
    block's field, the Hugging Face token, ``PREFECT_API_KEY``), or when an HTTP
    library refused the header made from one. The message names the variable or block
    field and the problem, never the value; nothing was sent."""


class LinksRefusedError(SpecError):
    """Raised when a tree holds links a transfer cannot carry as links (absolute, leaving
    the tree, dangling), before any byte moves; the message names each one.

    Attributes:
        problems: ``(relative path, why)`` for each such link.
    """

    def __init__(self, message: str, *, problems: list[tuple[str, str]], **kw: object):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.problems = problems


class ProviderError(RunPodFlowError):
    """Raised when the pod provider (RunPod's API, or the local pod) answers with an error."""


class CapacityError(ProviderError):
    """Raised when none of the requested GPU types / clouds has a free machine.

    Mirrors RunPod's ``There are no longer any instances available…`` answer; carries
    ``attempts``, one line per GPU type/cloud tried."""

    def __init__(self, message: str, *, attempts: list[str] | None = None, **kw: object):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.attempts = list(attempts or [])


class ProviderAuthError(ProviderError):
    """Raised when the provider refuses the API key (HTTP 401). Never retried."""


class ProviderTransientError(ProviderError):
    """Raised for answers worth retrying: HTTP 5xx, ``Something went wrong…``
    (INTERNAL_SERVER_ERROR), connection errors and timeouts."""


class PodGoneError(ProviderError):
    """Raised when the provider says the run's pod no longer lives while the run still
    needs it — terminated from outside, exited, or its host lost — so waiting (for a
    reconnect, a training poll) would only spend time. The run stops at once; the
    message is one sentence naming the pod and what the provider said.

    Attributes:
        cause: ``terminated_outside``, ``exited`` or ``host_lost`` (empty when not known).
        seen_at: when the loss was observed (UTC), or None.
    """

    def __init__(
        self, message: str, *, cause: str = "", seen_at: object = None, **kw: object
    ) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.cause = cause
        self.seen_at = seen_at


class TerminateError(ProviderError):
    """Raised when terminate could not be confirmed. The pod may still be billing:
    the message gives the command to terminate it by hand."""


class RunPodAPIError(ProviderError):
    """Raised when RunPod's REST v2 API answers an error status with an RFC 9457 problem
    object (``application/problem+json``: ``title``, ``status``, ``detail``,
    ``errors[]``). ``runpod.errors.classify_exception`` maps it to what happens next; the
    message holds RunPod's own words, never the API key.

    Attributes:
        status: the HTTP status (400, 401, 404, 410, 422, 429, 5xx …).
        title: the problem's ``title`` (``Bad Request``).
        detail: the problem's ``detail`` (``There are no longer any instances …``).
        errors: the problem's ``errors`` (one line per request-validation failure).
        operation: what was asked (``POST /v2/pods``).
        retry_after_seconds: how long RunPod asked to wait (429), when it said.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        title: str = "",
        detail: str = "",
        errors: list[str] | None = None,
        operation: str = "",
        retry_after_seconds: float | None = None,
        **kw: object,
    ):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = list(errors or [])
        self.operation = operation
        self.retry_after_seconds = retry_after_seconds


class AccountKeysError(ProviderError):
    """Raised before a write to the RunPod account's SSH keys is sent when the new list
    is empty or misses a key the account held when it was read: ``PUT
    /v2/account/ssh-keys`` replaces the whole list, so such a write would lock someone
    out. ``missing`` holds the fingerprints (``SHA256:…``) the write would have dropped."""

    def __init__(self, message: str, *, missing: list[str] | None = None, **kw: object):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.missing = list(missing or [])


class PodTimeoutError(RunPodFlowError):
    """Raised when a bounded wait on a pod runs out.

    Attributes:
        last_status: the last status seen (e.g. ``desiredStatus=RUNNING runtime=null``).
        elapsed_seconds: how long the wait lasted.
    """

    def __init__(
        self,
        message: str,
        *,
        last_status: str | None = None,
        elapsed_seconds: float | None = None,
        **kw: object,
    ):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.last_status = last_status
        self.elapsed_seconds = elapsed_seconds


class ConsoleError(RunPodFlowError):
    """Raised when the PTY console to a pod fails."""


class ConsoleConnectError(ConsoleError):
    """Raised when the SSH connection or the PTY shell cannot be opened, or dropped.

    Attributes:
        retryable: True when waiting may help (refused, unreachable, timed out, dropped);
            False when it cannot (the host key is not the pinned one, the key was
            refused, the shell never held the console's setup).
    """

    def __init__(self, message: str, *, retryable: bool = True, **kw: object):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.retryable = retryable


class CommandTimeoutError(ConsoleError):
    """Raised when a console command passes its per-command deadline; Ctrl-C was sent.

    Attributes:
        command: the command (secrets never appear in it).
        output: what it printed before the deadline.
        timeout_seconds: the deadline.
    """

    def __init__(
        self,
        message: str,
        *,
        command: str = "",
        output: str = "",
        timeout_seconds: float = 0.0,
        **kw: object,
    ):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.command = command
        self.output = output
        self.timeout_seconds = timeout_seconds


GATEWAY_PTY_ERROR = "Error: Your SSH client doesn't support PTY"
"""What RunPod's proxied SSH gateway writes to a session without a PTY (an exec or
SFTP channel) before it closes it with exit status 1."""


class ExecRefusedError(ConsoleError):
    """Raised when a gateway refuses an exec or SFTP channel, as RunPod's proxied SSH
    gateway does (``GATEWAY_PTY_ERROR``)."""


class TransferError(RunPodFlowError):
    """Raised when a file transfer fails after its retries (disk full, dropped link)."""


class DiskFullError(TransferError):
    """Raised when a transfer cannot write for want of space; the message names the side
    (this machine or the pod) and the folder. A retry cannot fix it."""


class ChecksumMismatchError(TransferError):
    """Raised when a file's size or sha256 differs from its manifest entry after
    the retry. Attributes: ``path`` (relative), ``expected``, ``actual`` (sha256 hex)."""

    def __init__(
        self, message: str, *, path: str = "", expected: str = "", actual: str = "", **kw: object
    ):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.path = path
        self.expected = expected
        self.actual = actual


class EnvError(RunPodFlowError):
    """Raised when the pod's environment cannot run the job (driver too old for any
    wheel index, install failed, the re-probe did not prove the fix)."""


class HFAuthError(RunPodFlowError):
    """Raised when Hugging Face access will fail. ``diagnosis`` holds the cause, the
    evidence and the remediation (an ``HFDiagnosis``)."""

    def __init__(self, message: str, *, diagnosis: object = None, **kw: object):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.diagnosis = diagnosis


class TrainingError(RunPodFlowError):
    """Raised when training exits non-zero, is killed, or passes its runtime cap.
    The message carries the last log lines; ``report`` the partial ``TrainReport``."""

    def __init__(self, message: str, *, report: object = None, **kw: object):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.report = report


class EvalParityError(RunPodFlowError):
    """Raised when the in-training eval and the standalone eval disagree beyond the
    tolerance. ``report`` holds the ``ParityReport``."""

    def __init__(self, message: str, *, report: object = None, **kw: object):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.report = report


class PublishError(RunPodFlowError):
    """Raised when the pod could not publish its outputs (the Hub or S3 refused, was
    unreachable, or the publisher's tools are missing).

    Attributes:
        status: the destination's HTTP status, when it answered.
        retryable: False when the destination refused for good (a 4xx): rerunning the
            same thing would fail the same way.
    """

    def __init__(
        self, message: str, *, status: int | None = None, retryable: bool = True, **kw: object
    ):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.status = status
        self.retryable = retryable


class BudgetExceededError(RunPodFlowError):
    """Raised when projected spend passes ``max_cost_usd`` or the runtime passes
    ``max_runtime_seconds``; the flow then terminates the pod. ``report`` holds the
    partial ``TrainReport`` when training was stopped."""

    def __init__(self, message: str, *, report: object = None, **kw: object):
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.report = report


class CancelRequested(BaseException):
    """The run's flow run was set Cancelling (or Cancelled) in Prefect — the UI's Cancel,
    ``prefect flow-run cancel``, an automation — while the run went on: raised at the
    run's next boundary (``flows.run.cancel_watch``), so the run ends its pod and ends
    Cancelled whoever executes it (a runner that missed the cancel, the CLI, a script).
    Its text is the stop in a few words (``a cancel in Prefect``).

    Attributes:
        flow_run_id: the cancelled flow run.
    """

    def __init__(self, flow_run_id: str):
        super().__init__("a cancel in Prefect")
        self.flow_run_id = flow_run_id
