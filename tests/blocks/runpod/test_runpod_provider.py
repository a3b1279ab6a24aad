"""RunPodProvider against the RunPod emulator, over both APIs (REST v2 with the
emulator's GraphQL retired, and GraphQL through the real ``runpod`` SDK), with every pod
backed by a real local pod: failover, auth, retries, adoption, validation before any
request, confirmed termination, costs and SSH through the gateway."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable

import paramiko
import pytest

from prefect_runpod.blocks.costs import billed_seconds, cost_usd
from prefect_runpod.blocks.exceptions import (
    CapacityError,
    ConsoleConnectError,
    PodGoneError,
    PodTimeoutError,
    ProviderAuthError,
    ProviderTransientError,
    SpecError,
    TerminateError,
)
from prefect_runpod.blocks.keys import load_private_key
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import PodProvider, PodRequest
from prefect_runpod.blocks.runpod.blocks import RunPodCredentials
from prefect_runpod.blocks.runpod.errors import HOST_GPUS_BUSY_MESSAGE
from prefect_runpod.blocks.runpod.provider import RunPodProvider
from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey
from tests.emulators.runpod_api import RunPodEmulator
from tests.fixtures.fault_matrix import wait_until
from tests.fixtures.runpod_emulator import RunPodBlocks, blocks_for

R3090, R4090, A5000 = "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090", "NVIDIA RTX A5000"
Make = Callable[..., RunPodProvider]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("runpod_api", ["graphql", "v2"], indirect=True),
]

OPS = {
    "create": {"graphql": "podFindAndDeployOnDemand", "v2": "createPod"},
    "get": {"graphql": "pod", "v2": "getPod"},
}
"""The emulator's operation names per API (its request log and fault tables)."""


def _op(emu: RunPodEmulator, what: str) -> str:
    return OPS[what][emu.client_api]  # type: ignore[attr-defined]


def _name() -> str:
    return f"prft-{uuid.uuid4()}"


def _request(ssh_key: RunPodSSHKey, **kw) -> PodRequest:
    return PodRequest(public_key=ssh_key.get_public_key(), **kw)


def _creates(emu: RunPodEmulator) -> int:
    return sum(_op(emu, "create") == e.get("operation") for e in emu.requests)


def _shell_echo(handle: PodHandle, ssh_key: RunPodSSHKey, text: str) -> str:
    """Log in through ``handle.ssh`` (host key pinned), echo ``text`` in a PTY shell."""
    assert handle.ssh is not None and handle.ssh.host_key
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    kind, body = handle.ssh.host_key.split()[:2]
    client.get_host_keys().add(
        f"[{handle.ssh.host}]:{handle.ssh.port}",
        kind,
        paramiko.PKey.from_type_string(kind, __import__("base64").b64decode(body)),
    )
    client.connect(
        handle.ssh.host,
        port=handle.ssh.port,
        username=handle.ssh.user,
        pkey=load_private_key(ssh_key.get_private_key()),
        allow_agent=False,
        look_for_keys=False,
        timeout=30,
    )
    try:
        chan = client.invoke_shell(term="xterm")
        chan.settimeout(30)
        chan.send(f"echo {text}-$((40+2))\n")
        out, deadline = "", time.monotonic() + 30
        while f"{text}-42" not in out and time.monotonic() < deadline:
            out += chan.recv(65536).decode(errors="replace")
        return out
    finally:
        client.close()


def test_satisfies_the_protocol(runpod_provider: Make) -> None:
    assert isinstance(runpod_provider(), PodProvider)


class TestCreateAndReady:
    def test_gateway_pod_end_to_end(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        _, _, ssh_key = runpod_blocks
        provider = runpod_provider()
        name = _name()
        handle = provider.create(_request(ssh_key), name)
        try:
            assert handle.name == name and handle.provider == "runpod"
            assert re.fullmatch(rf"{re.escape(handle.pod_id)}-[0-9a-f]{{8}}", handle.pod_host_id)
            assert handle.ssh is not None and handle.ssh.user == handle.pod_host_id
            assert (handle.ssh.host, handle.ssh.port) == ("127.0.0.1", runpod_emulator.gateway_port)
            assert provider.attempts == [f"{R3090}/SECURE: created {handle.pod_id}"]
            # pin the gateway's one key, as a user would pin ssh.runpod.io's
            local = runpod_emulator.local.get(handle.pod_id)
            ssh_key.gateway_host_key = runpod_emulator.gateway.host_key
            ready = provider.wait_ready(handle, timeout_seconds=180)
            assert ready.cost_per_hr == 0.22 and ready.direct_ssh is None
            assert ready.ssh.host_key == runpod_emulator.gateway.host_key != local.ssh.host_key
            assert ready.workdir == local.workdir
            assert "hello-42" in _shell_echo(ready, ssh_key, "hello")
        finally:
            result = provider.terminate(handle.pod_id)
        assert runpod_emulator.pods == {} and runpod_emulator.local.list("") == []
        assert not result.already_gone

    def test_direct_endpoint_when_22_is_public(
        self, runpod_emulator_direct: RunPodEmulator
    ) -> None:
        credentials, spec, ssh_key = blocks_for(runpod_emulator_direct)
        provider = RunPodProvider(credentials, spec, ssh_key, poll_interval_seconds=0.1)
        handle = provider.create(_request(ssh_key), _name())
        try:
            ready = provider.wait_ready(handle, timeout_seconds=180)
            assert ready.direct_ssh is not None and ready.direct_ssh.mode == "direct"
            assert ready.direct_ssh.host_key.startswith("ssh-ed25519 ")
            client = paramiko.SSHClient()
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
            d = ready.direct_ssh
            client.connect(
                d.host,
                port=d.port,
                username=d.user,
                allow_agent=False,
                look_for_keys=False,
                pkey=load_private_key(ssh_key.get_private_key()),
            )
            _, out, _ = client.exec_command("echo direct-$((1+1))")
            assert out.read().decode().strip() == "direct-2"
            client.close()
        finally:
            provider.terminate(handle.pod_id)

    def test_changed_gateway_key_is_refused(
        self, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        _, _, ssh_key = runpod_blocks
        ssh_key.gateway_host_key = RunPodSSHKey.generate().get_public_key()
        provider = runpod_provider()
        handle = provider.create(_request(ssh_key), _name())
        try:
            with pytest.raises(ConsoleConnectError, match="not the pinned"):
                provider.wait_ready(handle, timeout_seconds=180)
        finally:
            provider.terminate(handle.pod_id)

    def test_slow_boot_is_waited_for(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        runpod_emulator.faults.slow_boot_seconds = 10**6  # booting until a poll saw it

        get = _op(runpod_emulator, "get")

        def polls() -> list[dict]:
            return [e for e in list(runpod_emulator.requests) if e.get("operation") == get]

        def boot_once_polled() -> None:
            wait_until("a poll answered", lambda: any(e.get("status") for e in polls()), 120, 0.05)
            runpod_emulator.faults.slow_boot_seconds = 0

        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        booter = threading.Thread(target=boot_once_polled, daemon=True)
        booter.start()
        try:
            assert provider.wait_ready(handle, timeout_seconds=240).ssh is not None
            assert len(polls()) >= 2  # runtime was null at least once
        finally:
            booter.join(timeout=120)
            provider.terminate(handle.pod_id)

    def test_timeout_terminates(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        runpod_emulator.faults.slow_boot_seconds = 3600
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        with pytest.raises(PodTimeoutError, match=f"{handle.pod_id}.*runtime=null") as info:
            provider.wait_ready(handle, timeout_seconds=1.0)
        assert re.fullmatch(r"status=(RUNNING|STARTING) runtime=null", info.value.last_status)
        assert runpod_emulator.pods == {}

    def test_a_pod_ended_by_a_failed_boot_keeps_that_end(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        """The host fails while the pod boots: wait_ready ends the pod, and the run's
        later terminates (provision's, the run's finally) get that confirmed end back,
        so the pod is billed until then, not until the last "already gone"."""
        runpod_emulator.faults.slow_boot_seconds = 3600
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        runpod_emulator.fail_host(handle.pod_id, "EXITED")
        with pytest.raises(PodGoneError):
            provider.wait_ready(handle, timeout_seconds=240)
        ended = runpod_emulator.ledger.entries[handle.pod_id].ended
        assert ended is not None, "wait_ready did not end the pod"
        again = [provider.terminate(handle.pod_id) for _ in range(2)]
        assert again[0] == again[1] and not again[0].already_gone
        assert ended <= again[0].confirmed_at.timestamp()
        assert runpod_provider().terminate(handle.pod_id).already_gone  # another run's view

    def test_vanished_pod_is_reported(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        runpod_emulator.vanish(handle.pod_id)
        with pytest.raises(
            PodGoneError, match=f"pod {handle.pod_id} was terminated outside"
        ) as info:
            provider.wait_ready(handle, timeout_seconds=180)
        assert info.value.cause == "terminated_outside" and len(str(info.value).splitlines()) == 1


class TestFailover:
    def test_capacity_on_first_two_types_uses_the_third(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        runpod_emulator.faults.capacity_gpu_types = {R3090, R4090}
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        try:
            assert handle.gpu_type == A5000
            assert provider.attempts == [
                f"{R3090}/SECURE: capacity",
                f"{R4090}/SECURE: capacity",
                f"{A5000}/SECURE: created {handle.pod_id}",
            ]
            assert list(runpod_emulator.pods) == [handle.pod_id]
        finally:
            provider.terminate(handle.pod_id)

    def test_no_capacity_anywhere(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        runpod_emulator.faults.capacity_gpu_types = {R3090, R4090, A5000}
        provider = runpod_provider()
        with pytest.raises(CapacityError, match="no capacity") as info:
            provider.create(_request(runpod_blocks[2]), _name())
        assert len(info.value.attempts) == 3 and runpod_emulator.pods == {}

    def test_price_cap_skips_dear_types(self, runpod_emulator: RunPodEmulator) -> None:
        credentials, spec, ssh_key = blocks_for(
            runpod_emulator, gpu_type_ids=[R4090, R3090], max_usd_per_hour=0.25
        )
        provider = RunPodProvider(credentials, spec, ssh_key)
        handle = provider.create(_request(ssh_key), _name())
        try:
            assert handle.gpu_type == R3090 and handle.cost_per_hr == 0.22
            assert provider.attempts[0].startswith(f"{R4090}/SECURE: over price 0.690")
        finally:
            provider.terminate(handle.pod_id)

    @pytest.mark.parametrize("fault", ["http_5xx", "something_wrong"])
    def test_transient_twice_then_success(
        self,
        runpod_emulator: RunPodEmulator,
        runpod_blocks: RunPodBlocks,
        runpod_provider: Make,
        fault: str,
    ) -> None:
        getattr(runpod_emulator.faults, fault)[_op(runpod_emulator, "create")] = 2
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        try:
            assert provider.attempts == [f"{R3090}/SECURE: transient"] * 2 + [
                f"{R3090}/SECURE: created {handle.pod_id}"
            ]
            assert _creates(runpod_emulator) == 3 and len(runpod_emulator.pods) == 1
        finally:
            provider.terminate(handle.pod_id)

    def test_transient_forever_gives_up(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        runpod_emulator.faults.http_5xx[_op(runpod_emulator, "create")] = 99
        provider = runpod_provider(retry_max_attempts=3)
        with pytest.raises(ProviderTransientError, match="retried"):
            provider.create(_request(runpod_blocks[2]), _name())
        assert _creates(runpod_emulator) == 3 and runpod_emulator.pods == {}

    def test_host_without_gpus_means_a_new_pod(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        runpod_emulator.faults.create_errors = [HOST_GPUS_BUSY_MESSAGE]
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        try:
            assert provider.attempts[0] == f"{R3090}/SECURE: host_gpus_busy"
            assert not any(
                "podResume" in (e.get("operation") or "") for e in runpod_emulator.requests
            )
        finally:
            provider.terminate(handle.pod_id)

    def test_unauthorized_stops_at_once(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks
    ) -> None:
        _, spec, ssh_key = runpod_blocks
        wrong = RunPodCredentials(api_key="rpa_wrong_key", api=runpod_emulator.client_api)  # type: ignore[attr-defined]
        provider = RunPodProvider(wrong, spec, ssh_key)
        with pytest.raises(ProviderAuthError, match="401.*api_key"):
            provider.create(_request(ssh_key), _name())
        assert runpod_emulator.pods == {} and _creates(runpod_emulator) == 0
        assert len(runpod_emulator.requests) == 1  # never retried
        assert "rpa_wrong_key" not in runpod_emulator.log_text()

    def test_unknown_gpu_id_before_any_create(self, runpod_emulator: RunPodEmulator) -> None:
        credentials, spec, ssh_key = blocks_for(
            runpod_emulator, gpu_type_ids=[R3090, "NVIDIA H9000"]
        )
        with pytest.raises(SpecError, match="unknown GPU type id 'NVIDIA H9000'"):
            RunPodProvider(credentials, spec, ssh_key).create(_request(ssh_key), _name())
        assert _creates(runpod_emulator) == 0


class TestAdoption:
    def test_retried_provision_adopts(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        name = _name()
        first = runpod_provider().create(_request(runpod_blocks[2]), name)
        retry = runpod_provider()  # a retried task: a fresh provider, same name
        try:
            again = retry.create(_request(runpod_blocks[2]), name)
            assert again.pod_id == first.pod_id
            assert again.pod_host_id == first.pod_host_id  # via machine { podHostId }
            assert retry.attempts == [f"adopted {first.pod_id} ({name})"]
            assert _creates(runpod_emulator) == 1 and len(runpod_emulator.pods) == 1
            assert retry.find(name).pod_id == first.pod_id
            assert [h.pod_id for h in retry.list("prft-")] == [first.pod_id]
            assert retry.list("other-") == []
        finally:
            retry.terminate(first.pod_id)
        assert retry.find(name) is None

    def test_a_terminated_pod_is_neither_found_nor_listed(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        """A pod listed with desiredStatus TERMINATED is gone to find and list alike
        (one set of gone statuses, shared with terminate)."""
        provider, name = runpod_provider(), _name()
        handle = provider.create(_request(runpod_blocks[2]), name)
        try:
            runpod_emulator.pods[handle.pod_id].status = "TERMINATED"
            assert provider.find(name) is None
            assert provider.list("prft-") == []
        finally:
            result = provider.terminate(handle.pod_id, timeout_seconds=60)
        assert result.pod_id == handle.pod_id


class TestValidationBeforeRequests:
    @pytest.mark.parametrize(
        ("name", "env"),
        [
            ('prft-x" }) { id } } #', {}),
            ("prft-ok", {"NOTE": "nul\x00byte"}),
            ("prft-ok", {"HF_TOKEN": "hf_" + "S" * 34}),
            ("prft-ok", {"NOTE": "hf_" + "S" * 34}),
        ],
    )
    def test_bad_name_or_env_sends_nothing(
        self,
        runpod_emulator: RunPodEmulator,
        runpod_blocks: RunPodBlocks,
        runpod_provider: Make,
        name: str,
        env: dict[str, str],
    ) -> None:
        with pytest.raises(SpecError):
            runpod_provider().create(_request(runpod_blocks[2], env=env), name)
        assert runpod_emulator.requests == []

    def test_quotes_and_newlines_in_env_arrive_intact(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        value = 'say "hi" \\ back\nline2 }) { id }'
        provider = runpod_provider()
        handle = provider.create(
            _request(runpod_blocks[2], env={"MSG": value}, allowed_cuda_versions=["12.4"]), _name()
        )
        try:
            pod = runpod_emulator.pods[handle.pod_id]
            assert pod.env["MSG"] == value
            assert pod.env["PUBLIC_KEY"] == runpod_blocks[2].get_public_key()
            create = next(
                e
                for e in runpod_emulator.requests
                if e.get("operation") == _op(runpod_emulator, "create")
            )
            if "query" in create:  # GraphQL has only the list form
                assert 'allowedCudaVersions: ["12.4"]' in create["query"]
            else:  # REST v2: the floor as a floor
                assert create["body"]["gpu"] == {
                    "id": R3090,
                    "count": 1,
                    "minCudaVersion": "12.4",
                }
        finally:
            provider.terminate(handle.pod_id)

    def test_cuda_lists_sharing_nothing(self, runpod_emulator: RunPodEmulator) -> None:
        credentials, spec, ssh_key = blocks_for(runpod_emulator, allowed_cuda_versions=["11.8"])
        with pytest.raises(SpecError, match="share none"):
            RunPodProvider(credentials, spec, ssh_key).create(
                _request(ssh_key, allowed_cuda_versions=["12.8"]), _name()
            )
        assert runpod_emulator.requests == []


class TestAccountKey:
    def test_missing_key_stops_before_paying(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        runpod_emulator.pub_key = "ssh-rsa AAAAsomeoneelse other"
        with pytest.raises(SpecError, match="SSH Public Keys"):
            runpod_provider().create(_request(runpod_blocks[2]), _name())
        assert _creates(runpod_emulator) == 0

    def test_key_added_when_allowed(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        runpod_emulator.pub_key = "ssh-rsa AAAAsomeoneelse other"
        runpod_blocks[2].add_to_account = True
        provider = runpod_provider()
        assert provider.ensure_account_key() is True
        assert runpod_emulator.pub_key.splitlines() == [
            "ssh-rsa AAAAsomeoneelse other",
            runpod_blocks[2].get_public_key(),
        ]
        assert provider.ensure_account_key() is True  # idempotent
        assert runpod_emulator.pub_key.count("ssh-ed25519") == 1


class TestTerminate:
    def test_transient_failure_still_confirmed(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        runpod_emulator.faults.terminate_fail_n = 2
        result = provider.terminate(handle.pod_id, timeout_seconds=60)
        assert result.attempts == 3 and not result.already_gone
        assert runpod_emulator.pods == {} and runpod_emulator.local.list("") == []
        assert provider.terminate(handle.pod_id) == result  # its own end, answered again
        assert runpod_provider().terminate(handle.pod_id).already_gone

    def test_never_gone_on_timeout(
        self, runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
    ) -> None:
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        runpod_emulator.faults.terminate_ignored = True
        with pytest.raises(TerminateError, match=f"{handle.pod_id}.*may still be billing"):
            provider.terminate(handle.pod_id, timeout_seconds=1.0)
        assert handle.pod_id in runpod_emulator.pods
        runpod_emulator.faults.terminate_ignored = False
        assert provider.terminate(handle.pod_id).pod_id == handle.pod_id

    def test_unsafe_pod_id(self, runpod_emulator: RunPodEmulator, runpod_provider: Make) -> None:
        with pytest.raises(SpecError, match="pod id"):
            runpod_provider().terminate('x" }) { id }')
        assert runpod_emulator.requests == []


def test_cost_is_price_times_confirmed_billed_seconds(
    runpod_emulator: RunPodEmulator, runpod_blocks: RunPodBlocks, runpod_provider: Make
) -> None:
    provider = runpod_provider()
    handle = provider.wait_ready(provider.create(_request(runpod_blocks[2]), _name()), 180)
    result = provider.terminate(handle.pod_id)
    seconds = billed_seconds(handle.created_at, result.confirmed_at)
    assert handle.cost_per_hr == 0.22 and seconds > 0
    assert cost_usd(handle.cost_per_hr, seconds) == pytest.approx(0.22 * seconds / 3600)
