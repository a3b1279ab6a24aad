"""The secret's shape and its masking (``blocks.secret_mask``, issue 21): shapes refused
with the right sentence and never the value, every form of a registered secret masked,
a log record redacted by the filter on its way to any handler, and an HTTP library's
refused header (``requests``, ``httpx``/h11) re-raised as our own error without it."""

from __future__ import annotations

import io
import json
import logging
import secrets
import sys

import pytest
import requests
from pydantic import SecretStr

from prefect_runpod.blocks import secret_mask
from prefect_runpod.blocks.exceptions import ProviderError, SecretShapeError, SpecError
from tests.fixtures.leaks import sentinel_pieces, shaped_sentinels


def _fresh(prefix: str = "rpa_") -> dict[str, str]:
    return shaped_sentinels(prefix)


def _assert_no_piece(value: str, *texts: str) -> None:
    for text in texts:
        for piece in sentinel_pieces(value):
            assert piece not in text, f"a piece of the secret is in {text!r}"


@pytest.mark.parametrize(
    ("shape", "sentence"),
    [
        ("inner_newline", "RUNPOD_API_KEY has a newline inside it: remove it"),
        ("space", "RUNPOD_API_KEY has a space inside it: remove it"),
        ("tab", "RUNPOD_API_KEY has a tab inside it: remove it"),
    ],
)
def test_a_key_with_whitespace_inside_is_refused_by_name_never_by_value(shape, sentence):
    value = _fresh()[shape]
    with pytest.raises(SecretShapeError) as info:
        secret_mask.check_secret(value, "RUNPOD_API_KEY")
    message = str(info.value)
    assert message.startswith(sentence) and "\n" not in message
    assert isinstance(info.value, SpecError)  # bad input: exit 2, nothing rented
    _assert_no_piece(value, message)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("\tabcdefgh1234", "starts with a tab"),
        (" abcdefgh1234", "starts with a space"),
        ("abcdefgh1234 ", "ends with a space"),
        ("abcdefgh1234\n\n", "ends with a newline"),
        ("abcdefgh1234\r", "ends with a carriage return"),
        ("abcd\x00efgh1234", "has a control character (U+0000) inside it"),
        ("abcd\u200befgh1234", "has a control character (U+200B) inside it"),
        ("abcd\u00a0efgh1234", "has a whitespace character (U+00A0) inside it"),
    ],
)
def test_each_shape_is_named(value, problem):
    assert secret_mask.shape_problem(value) == problem
    with pytest.raises(SecretShapeError) as info:
        secret_mask.check_secret(value, "HF_TOKEN")
    assert str(info.value).startswith(f"HF_TOKEN {problem}: remove it")


def test_one_trailing_newline_is_stripped_and_said_without_the_value(caplog):
    value = _fresh()["trailing_newline"]
    what = f"KEY_{secrets.token_hex(4).upper()}"
    with caplog.at_level(logging.WARNING, logger="prefect_runpod.secrets"):
        assert secret_mask.check_secret(value, what) == value[:-1]
        assert secret_mask.check_secret(value[:-1] + "\r\n", what) == value[:-1]
    note = f"{what} ends with a newline: stripped it (the value is not shown)"
    assert caplog.messages == [note, note]  # said each time it is read
    with pytest.raises(SecretShapeError, match="PREFECT_API_KEY ends with a newline"):
        secret_mask.check_secret(value, "PREFECT_API_KEY", strip_newline=False)
    assert secret_mask.check_secret("rpa_plainvalue1234", what) == "rpa_plainvalue1234"


def test_every_form_of_a_registered_secret_is_masked():
    value = _fresh("hf_")["inner_newline"]
    head, tail = value.split("\n")
    secret_mask.register(SecretStr(value))
    texts = [
        f"as given: {value}",
        f"stripped: {value.strip()}",
        f"bytes repr: {value.encode()!r}",
        f"json: {json.dumps({'token': value})}",
        f"in a header: Authorization: Bearer {value}",
        f"in pieces: {tail} … {head}",
        f"url: https://hub.example/?t={head}%0A{tail}",
    ]
    for text in texts:
        masked = secret_mask.redact(text)
        _assert_no_piece(value, masked)
        assert secret_mask.REDACTED in masked
    assert secret_mask.redact("nothing secret here") == "nothing secret here"
    assert secret_mask.redact_data({"a": [f"x {head}", 3], "b": (tail,)}) == {
        "a": ["x ***", 3],
        "b": ("***",),
    }


def test_the_scheme_word_of_a_registered_header_value_is_not_needed():
    token = "tok" + secrets.token_hex(10)
    secret_mask.register(f"Bearer {token}")
    assert secret_mask.redact(f"sent {token}") == "sent ***"
    assert secret_mask.redact("Authorization: Bearer <redacted>") == (
        "Authorization: Bearer <redacted>"
    )


def test_our_errors_are_redacted_as_they_are_made():
    value = _fresh()["space"]
    secret_mask.register(value)
    error = ProviderError(f"RunPod said: bad key {value!r}", pod_id="abc123")
    _assert_no_piece(value, str(error), repr(error))


def test_a_log_record_with_the_secret_is_redacted_by_the_filter():
    value = _fresh("hf_")["tab"]
    secret_mask.register(value)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger(f"prefect_runpod.test.{secrets.token_hex(4)}")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        secret_mask.install_log_filter()  # as every secret's registration does
        assert any(isinstance(f, secret_mask.RedactingFilter) for f in handler.filters)
        logger.error("token %s in the arguments", value)
        logger.error(f"token {value.encode()!r} in the message")
        try:
            raise ValueError(f"Illegal header value b'Bearer {value}'")
        except ValueError:
            logger.exception("a traceback")
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert written.count("***") >= 3 and "Traceback" in written
    _assert_no_piece(value, written)


def test_requests_invalid_header_is_re_raised_without_the_header():
    """What ``check --provider runpod`` printed: ``InvalidHeader: … 'Bearer rpa_…\\n'``."""
    from prefect_runpod.blocks.runpod.client import RunPodClient
    from prefect_runpod.blocks.runpod.errors import ErrorKind, classify_exception

    key = _fresh()["trailing_newline"]
    with pytest.raises(requests.exceptions.InvalidHeader) as raw:
        requests.get("http://127.0.0.1:9/", headers={"Authorization": f"Bearer {key}"})
    assert key.strip() in str(raw.value)  # the library quotes it
    assert secret_mask.is_header_error(raw.value)
    with pytest.raises(SecretShapeError) as info:
        RunPodClient(SecretStr(key)).get_user()
    message = str(info.value)
    assert "refused the Authorization header" in message and "RUNPOD_API_KEY" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__
    _assert_no_piece(key, message)
    # Never "cannot reach the RunPod API": the key's shape, never retried.
    for exc in (raw.value, info.value):
        classified = classify_exception(exc)
        assert classified.kind is ErrorKind.BAD_SECRET and "cannot reach" not in classified.message
        _assert_no_piece(key, classified.message)


def test_an_httpx_refused_header_from_the_hub_is_re_raised_without_it():
    """What the summary printed: ``LocalProtocolError: Illegal header value b'Bearer hf_…'``
    (huggingface_hub's httpx, h11 underneath: refused once connected)."""
    from prefect_runpod.blocks.huggingface import collect_access_evidence, whoami_evidence
    from tests.emulators.hf_hub import running_hub

    token = _fresh("hf_")["inner_newline"]
    with running_hub([], []) as hub:
        for call in (
            lambda: collect_access_evidence("t/x", token=SecretStr(token), endpoint=hub.endpoint),
            lambda: whoami_evidence(SecretStr(token), hub.endpoint),
        ):
            with pytest.raises(SecretShapeError) as info:
                call()
            assert "the Hugging Face Hub: the HTTP library refused" in str(info.value)
            _assert_no_piece(token, str(info.value))


def test_error_text_and_masked_error_never_quote_a_refused_header():
    value = _fresh()["tab"]
    exc = ValueError(f"Invalid header value b'Bearer {value}'")  # http.client's words
    assert secret_mask.error_text(exc).startswith("ValueError: the HTTP library refused")
    masked = secret_mask.masked_error(exc)
    assert masked is not exc and "refused a request header" in str(masked)
    plain = RuntimeError("nothing secret")
    assert secret_mask.masked_error(plain) is plain
    ours = SecretShapeError("HF_TOKEN has a tab inside it: remove it")
    assert secret_mask.masked_error(ours) is ours


def test_the_cli_output_is_redacted(capsys):
    value = _fresh("hf_")["space"]
    secret_mask.register(value)
    with secret_mask.redacted_output():
        print(f"printed {value}")
        print(f"to stderr {value}", file=sys.stderr)
    out, err = capsys.readouterr()
    assert out == "printed ***\n" and err == "to stderr ***\n"


@pytest.mark.parametrize("api", ["graphql", "v2"])
def test_a_create_with_a_refused_key_names_the_key_not_the_network(
    runpod_blocks, runpod_emulator, api
):
    """The finetune's message blamed the network ("cannot reach the RunPod API") for a
    key ``requests`` would not send: now the create stops at once (never retried), says
    what is wrong with the key, and RunPod's API sees no request."""
    from prefect_runpod.blocks.provider import PodRequest
    from prefect_runpod.blocks.runpod.blocks import RunPodCredentials
    from prefect_runpod.blocks.runpod.provider import RunPodProvider

    _, spec, ssh_key = runpod_blocks
    key = _fresh()["inner_newline"]
    provider = RunPodProvider(
        RunPodCredentials(api_key=key, api=api, api_base_url=runpod_emulator.base_url),
        spec,
        ssh_key,
        retry_initial_delay_seconds=0.01,
    )
    with pytest.raises(SecretShapeError) as info:
        provider.create(PodRequest(public_key=ssh_key.get_public_key()), "prft-shape-check")
    message = str(info.value)
    assert "refused the Authorization header made from the RunPod API key" in message
    assert "cannot reach" not in message and "RUNPOD_API_KEY" in message
    _assert_no_piece(key, message)
    assert runpod_emulator.requests == []
