"""PodConsole against the LocalPod in gateway mode (PTY only, like RunPod's gateway)."""

from __future__ import annotations

import hashlib
import os

import pytest
from pydantic import SecretStr

from prefect_runpod.blocks.console.session import PodConsole, run_remote
from prefect_runpod.blocks.exceptions import CommandTimeoutError, ExecRefusedError
from tests.fixtures.local_pod import PodFixture

pytestmark = pytest.mark.slow


def test_commands_secrets_and_streams_through_the_gateway(local_pod: PodFixture) -> None:
    _provider, handle, keypair = local_pod
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        for code in (0, 1, 42):
            assert console.run(f"(exit {code})").exit_code == code
        assert console.run('echo "$RUNPOD_POD_ID"').output == handle.pod_id
        payload = "z" * 9000
        assert console.run(f"printf %s '{payload}' | wc -c").output.strip() == "9000"
        value = "hf_GW_" + os.urandom(6).hex()
        console.set_secret_env("HF_TOKEN", SecretStr(value))
        assert console.run('echo "$HF_TOKEN"').output == "***"
        assert value not in console.transcript
        with pytest.raises(CommandTimeoutError):
            console.run("sleep 30", timeout_seconds=1)
        assert console.run("echo alive").output == "alive"
        data = os.urandom(1 << 20)
        stream = console.open_stream(f"head -c {len(data)} | sha256sum")
        stream.write(data)
        out = stream.read_until(b"-", timeout_seconds=120)
        assert stream.finish() == 0
        assert out.split()[0].decode() == hashlib.sha256(data).hexdigest()
    output, code = run_remote(handle, keypair.private_key, ["echo one", "(exit 3)"])
    assert (output, code) == ("one", 3)


def test_exec_is_refused_by_the_gateway_with_a_clear_error(local_pod: PodFixture) -> None:
    _provider, handle, keypair = local_pod
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        with pytest.raises(ExecRefusedError, match=f"{handle.pod_id}.*PTY console"):
            console.exec_command("echo hi")
        assert console.run("echo still usable").output == "still usable"


def test_exec_works_on_a_direct_pod(direct_pod: PodFixture) -> None:
    _provider, handle, keypair = direct_pod
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        result = console.exec_command("echo out; echo err >&2; exit 4")
        assert (result.output, result.exit_code) == ("out\nerr", 4)
