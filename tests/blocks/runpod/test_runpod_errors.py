"""The RunPod error classifier: each exact RunPod string maps to one action."""

from __future__ import annotations

import pytest
import requests
from runpod.error import AuthenticationError, QueryError

from prefect_runpod.blocks.exceptions import (
    CapacityError,
    ProviderAuthError,
    ProviderError,
    ProviderTransientError,
    SpecError,
)
from prefect_runpod.blocks.runpod.errors import (
    CAPACITY_MESSAGE,
    HOST_GPUS_BUSY_MESSAGE,
    NOT_FOUND_TO_TERMINATE_MESSAGE,
    SOMETHING_WENT_WRONG_MESSAGE,
    UNAUTHORIZED_MESSAGE,
    UNKNOWN_GPU_MESSAGE,
    ErrorKind,
    FailoverAction,
    classify_exception,
    classify_message,
    to_provider_error,
)


@pytest.mark.parametrize(
    ("message", "kind", "action"),
    [
        (CAPACITY_MESSAGE, ErrorKind.CAPACITY, FailoverAction.NEXT_OPTION),
        (
            "There are no longer any instances available with the request specifications. "
            "Please try again later.",
            ErrorKind.CAPACITY,
            FailoverAction.NEXT_OPTION,
        ),
        (HOST_GPUS_BUSY_MESSAGE, ErrorKind.HOST_GPUS_BUSY, FailoverAction.RECREATE),
        (SOMETHING_WENT_WRONG_MESSAGE, ErrorKind.TRANSIENT, FailoverAction.RETRY),
        (NOT_FOUND_TO_TERMINATE_MESSAGE, ErrorKind.NOT_FOUND, FailoverAction.GONE),
        (UNKNOWN_GPU_MESSAGE, ErrorKind.UNKNOWN_GPU, FailoverAction.STOP),
        (
            'Field "allowedCudaVersions" is not defined by type "PodResumeInput".',
            ErrorKind.INVALID_REQUEST,
            FailoverAction.STOP,
        ),
        ("Syntax Error: Unterminated string.", ErrorKind.INVALID_REQUEST, FailoverAction.STOP),
        ("Insufficient funds, probably", ErrorKind.UNKNOWN, FailoverAction.STOP),
    ],
)
def test_exact_runpod_strings(message: str, kind: ErrorKind, action: FailoverAction) -> None:
    classified = classify_message(message)
    assert (classified.kind, classified.action, classified.message) == (kind, action, message)


def test_internal_server_error_code_is_transient_whatever_the_text() -> None:
    assert classify_message("boom", code="INTERNAL_SERVER_ERROR").action is FailoverAction.RETRY


def test_every_kind_has_an_action() -> None:
    """Like httpx's mapping test: no kind is left without a decision."""
    from prefect_runpod.blocks.runpod.errors import _ACTIONS

    assert set(_ACTIONS) == set(ErrorKind)


class TestClassifyException:
    def test_sdk_401(self) -> None:
        classified = classify_exception(AuthenticationError(UNAUTHORIZED_MESSAGE))
        assert (classified.kind, classified.action) == (ErrorKind.AUTH, FailoverAction.STOP)

    def test_sdk_query_error_keeps_runpod_text(self) -> None:
        classified = classify_exception(QueryError(CAPACITY_MESSAGE, "mutation {…}"))
        assert classified.kind is ErrorKind.CAPACITY

    def test_sdk_unknown_gpu_value_error(self) -> None:
        assert classify_exception(ValueError(UNKNOWN_GPU_MESSAGE)).kind is ErrorKind.UNKNOWN_GPU

    @pytest.mark.parametrize(
        "exc",
        [
            requests.exceptions.ConnectionError("refused"),
            requests.exceptions.JSONDecodeError("Expecting value", "<html>502</html>", 0),
        ],
    )
    def test_network_and_non_json_5xx_are_transient(self, exc: Exception) -> None:
        assert classify_exception(exc).action is FailoverAction.RETRY

    def test_a_read_timeout_may_have_been_carried_out(self) -> None:
        """The request went out: a create is resolved by reading, never sent again."""
        classified = classify_exception(requests.exceptions.ReadTimeout("slow"))
        assert (classified.kind, classified.action) == (
            ErrorKind.ANSWER_LOST,
            FailoverAction.RESOLVE,
        )


class TestToProviderError:
    @pytest.mark.parametrize(
        ("message", "cls"),
        [
            (UNAUTHORIZED_MESSAGE, ProviderAuthError),
            (CAPACITY_MESSAGE, CapacityError),
            (SOMETHING_WENT_WRONG_MESSAGE, ProviderTransientError),
            (UNKNOWN_GPU_MESSAGE, SpecError),
            ("unheard of", ProviderError),
        ],
    )
    def test_class_per_kind(self, message: str, cls: type[Exception]) -> None:
        exc = to_provider_error(classify_message(message), what="create pod prft-1", pod_id="p1")
        assert type(exc) is cls
        assert "create pod prft-1" in str(exc)

    def test_auth_message_says_what_to_fix(self) -> None:
        exc = to_provider_error(classify_message(UNAUTHORIZED_MESSAGE), what="list pods")
        assert "api_key" in str(exc) and "401" in str(exc)

    def test_capacity_keeps_attempts(self) -> None:
        exc = to_provider_error(
            classify_message(CAPACITY_MESSAGE), what="create", attempts=["a: capacity"]
        )
        assert isinstance(exc, CapacityError) and exc.attempts == ["a: capacity"]


def test_no_answer_names_the_host_it_could_not_reach() -> None:
    request = requests.Request("POST", "https://api.runpod.io/graphql").prepare()
    exc = requests.exceptions.ConnectionError("Name or service not known", request=request)
    classified = classify_exception(exc)
    assert classified.action is FailoverAction.RETRY
    assert "cannot reach api.runpod.io" in classified.message
    served = requests.exceptions.HTTPError("502", response=requests.Response())
    assert "cannot reach" not in classify_exception(served).message


def test_the_real_sdk_against_a_closed_port_says_cannot_reach(monkeypatch) -> None:
    from pydantic import SecretStr

    from prefect_runpod.blocks.exceptions import ProviderTransientError
    from prefect_runpod.blocks.runpod.blocks import RunPodCredentials, RunPodPodSpec
    from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey
    from tests.fixtures.prefect_server import free_port

    port = free_port()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", f"http://127.0.0.1:{port}")
    provider = RunPodPodSpec().get_provider(
        RunPodCredentials(api_key=SecretStr("rpa_" + "k" * 24)),
        RunPodSSHKey.generate(),
        retry_initial_delay_seconds=0.01,
        retry_max_attempts=2,
    )
    with pytest.raises(ProviderTransientError, match=f"cannot reach 127.0.0.1:{port}"):
        provider.list("prft")


class TestThroughTheRealSDK:
    """Issue 14: the SDK hides HTTP status codes, so each class of answer is classified by
    exception type plus RunPod's text, in one place; one test per class, through the real
    ``runpod`` SDK against the emulator."""

    @pytest.fixture
    def runpod_api(self) -> str:
        """The emulator keeps GraphQL served for these (the SDK's API, the fallback)."""
        return "graphql"

    @pytest.fixture
    def client(self, runpod_emulator):  # type: ignore[no-untyped-def]
        from pydantic import SecretStr

        from prefect_runpod.blocks.runpod.client import RunPodClient

        return RunPodClient(SecretStr(runpod_emulator.api_key))

    def _raised(self, call) -> BaseException:  # type: ignore[no-untyped-def]
        with pytest.raises(Exception) as info:
            call()
        return info.value

    def test_401_is_authentication_error_and_stops(self, runpod_emulator) -> None:  # type: ignore[no-untyped-def]
        from pydantic import SecretStr

        from prefect_runpod.blocks.runpod.client import RunPodClient

        exc = self._raised(RunPodClient(SecretStr("rpa_" + "x" * 24)).get_pods)
        assert isinstance(exc, AuthenticationError)
        classified = classify_exception(exc)
        assert (classified.kind, classified.action) == (ErrorKind.AUTH, FailoverAction.STOP)
        assert classified.message == UNAUTHORIZED_MESSAGE

    def test_graphql_validation_is_a_query_error_and_stops(self, client) -> None:  # type: ignore[no-untyped-def]
        """HTTP 400 with ``errors``: the SDK raises the same QueryError as for HTTP 200."""
        exc = self._raised(lambda: client.query('query { pod(input: {podId: "x"}) { nope } }'))
        assert isinstance(exc, QueryError)
        classified = classify_exception(exc)
        assert (classified.kind, classified.action) == (
            ErrorKind.INVALID_REQUEST,
            FailoverAction.STOP,
        )
        assert "Cannot query field 'nope'" in classified.message

    def test_a_malformed_id_inlined_by_the_sdk_is_a_syntax_error_and_stops(self, client) -> None:  # type: ignore[no-untyped-def]
        exc = self._raised(lambda: client.terminate_pod('abc"def'))
        assert isinstance(exc, QueryError)
        assert classify_exception(exc).action is FailoverAction.STOP

    def test_runpods_own_message_keeps_its_text(self, runpod_emulator, client) -> None:  # type: ignore[no-untyped-def]
        exc = self._raised(lambda: client.terminate_pod("doesnotexist00"))
        assert isinstance(exc, QueryError)
        classified = classify_exception(exc)
        assert classified.action is FailoverAction.GONE
        assert classified.message == NOT_FOUND_TO_TERMINATE_MESSAGE

    def test_a_non_json_body_is_retried_and_named(self, runpod_emulator, client) -> None:  # type: ignore[no-untyped-def]
        runpod_emulator.faults.http_5xx["myself"] = 1
        exc = self._raised(client.get_pods)
        assert isinstance(exc, requests.exceptions.JSONDecodeError)
        classified = classify_exception(exc)
        assert classified.action is FailoverAction.RETRY
        assert "not JSON" in classified.message and "cannot reach" not in classified.message

    def test_an_answer_with_neither_data_nor_errors_stops(self, runpod_emulator, client) -> None:  # type: ignore[no-untyped-def]
        runpod_emulator.faults.empty_answers["myself"] = 1
        exc = self._raised(client.get_pods)
        assert isinstance(exc, KeyError)
        classified = classify_exception(exc)
        assert (classified.kind, classified.action) == (ErrorKind.UNKNOWN, FailoverAction.STOP)

    def test_the_sdks_unknown_gpu_value_error_stops(self, client) -> None:  # type: ignore[no-untyped-def]
        exc = self._raised(lambda: client.get_gpu("NVIDIA H9000"))
        assert isinstance(exc, ValueError)
        assert classify_exception(exc).kind is ErrorKind.UNKNOWN_GPU

    def test_a_closed_port_is_retried(self, monkeypatch) -> None:  # type: ignore[no-untyped-def]
        from pydantic import SecretStr

        from prefect_runpod.blocks.runpod.client import RunPodClient
        from tests.fixtures.prefect_server import free_port

        monkeypatch.setenv("RUNPOD_API_BASE_URL", f"http://127.0.0.1:{free_port()}")
        exc = self._raised(RunPodClient(SecretStr("k")).get_pods)
        assert isinstance(exc, requests.exceptions.ConnectionError)
        assert classify_exception(exc).action is FailoverAction.RETRY
