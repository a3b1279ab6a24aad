"""The one sentence a worker's flow run is Crashed with when its pod failed it."""

from __future__ import annotations

from prefect_runpod.blocks.exceptions import PodGoneError, PodTimeoutError, TransferError
from prefect_runpod.flows.worker.worker import crash_sentence

NAME = "prft-0b6a4d1e-2f4c-4a8e-9d7b-0c1d2e3f4a5b"


def test_a_lost_pod_is_named_with_what_the_provider_said() -> None:
    exc = PodGoneError(
        "pod abc123 was terminated outside the run (EXITED).", cause="terminated_outside"
    )
    assert crash_sentence(exc, "abc123", NAME) == (
        f"pod abc123 ({NAME}) was lost under the flow run: pod abc123 was terminated "
        "outside the run (EXITED)"
    )


def test_a_pod_that_never_boots_says_so() -> None:
    exc = PodTimeoutError("pod abc123 not ready after 600 s (CREATED)", pod_id="abc123")
    assert crash_sentence(exc, "abc123", NAME) == (
        f"pod abc123 ({NAME}) never booted, its image may not start or the host has no "
        "capacity: pod abc123 not ready after 600 s (CREATED)"
    )


def test_any_other_failure_keeps_its_own_sentence() -> None:
    assert crash_sentence(TransferError("the upload broke."), "abc123", NAME) == (
        "TransferError: the upload broke"
    )
