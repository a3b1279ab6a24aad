"""The local pod, driven by real clients: paramiko against the pod's asyncssh daemon,
real processes, the real registry. OpenSSH's view is in test_openssh_view.py."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from prefect_runpod.blocks.exceptions import GATEWAY_PTY_ERROR, SpecError
from prefect_runpod.blocks.keys import KeyPair, generate_keypair
from prefect_runpod.blocks.local_pod.provider import (
    LocalPod,
    LocalPodProvider,
    base_python,
    default_home,
)
from prefect_runpod.blocks.local_pod.registry import (
    find_marked_pids,
    pid_alive,
    read_record,
    write_record,
)
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import PodRequest
from tests.fixtures.local_pod import (
    PodFixture,
    connect_paramiko,
    read_shell_until,
    start_pod,
)

_POD_ENV = {"JOB_NAME": "demo-finetune"}


def _port_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def _wait_for(predicate, timeout_seconds: float = 120.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _shell(handle: PodHandle, keypair: KeyPair, typed: bytes, marker: bytes) -> bytes:
    """Type ``typed`` into a fresh PTY shell on the pod; return the output up to ``marker``."""
    client = connect_paramiko(handle, keypair)
    try:
        chan = client.invoke_shell(term="xterm")
        chan.send(typed)
        return read_shell_until(chan, marker)
    finally:
        client.close()


@pytest.fixture(scope="module")
def gateway(runpod_home: Path) -> Iterator[PodFixture]:
    """One gateway pod shared by the read-only tests of this module."""
    provider = LocalPodProvider(home=runpod_home, start_timeout_seconds=120.0)
    handle, keypair = start_pod(provider, env=_POD_ENV)
    yield provider, handle, keypair
    provider.terminate(handle.pod_id)


@pytest.fixture(scope="module")
def direct(runpod_home: Path) -> Iterator[PodFixture]:
    """One direct-mode pod shared by the read-only tests of this module."""
    provider = LocalPodProvider(home=runpod_home, mode="direct", start_timeout_seconds=120.0)
    handle, keypair = start_pod(provider, env=_POD_ENV)
    yield provider, handle, keypair
    provider.terminate(handle.pod_id)


class TestCreate:
    def test_handle_describes_a_gateway_pod(self, gateway: PodFixture) -> None:
        provider, handle, _ = gateway
        assert handle.provider == "local"
        # Shaped like RunPod's ids (issue 14): lowercase letters and digits, no hyphen.
        assert re.fullmatch(r"[a-z0-9]{14}", handle.pod_id), handle.pod_id
        assert handle.pod_host_id and re.fullmatch(
            rf"{handle.pod_id}-[0-9a-f]{{8}}", handle.pod_host_id
        )
        assert handle.ssh is not None and handle.ssh.mode == "gateway"
        assert handle.ssh.host == "127.0.0.1"
        assert handle.ssh.user == handle.pod_host_id
        assert handle.pod_host_id is not None
        assert handle.pod_host_id.startswith(handle.pod_id + "-")
        assert len(handle.pod_host_id.rsplit("-", 1)[1]) == 8
        assert handle.ssh.host_key is not None and handle.ssh.host_key.startswith("ssh-ed25519 ")
        assert handle.direct_ssh is None
        assert Path(handle.workdir).is_dir()
        assert provider.get(handle.pod_id) == handle
        assert provider.find(handle.name) == handle
        assert handle in provider.list("test-")
        assert provider.list("no-such-prefix-") == []

    def test_direct_pod_logs_in_as_root(self, direct: PodFixture) -> None:
        _, handle, _ = direct
        assert handle.ssh is not None and handle.ssh.mode == "direct"
        assert handle.ssh.user == "root"
        assert handle.direct_ssh == handle.ssh

    def test_same_name_adopts_the_live_pod(self, gateway: PodFixture) -> None:
        provider, handle, keypair = gateway
        again = provider.create(PodRequest(public_key=keypair.public_key), handle.name)
        assert again.pod_id == handle.pod_id
        assert [h.pod_id for h in provider.list(handle.name)] == [handle.pod_id]

    def test_two_pods_at_once_get_their_own_ids_and_ports(
        self, local_provider: LocalPodProvider
    ) -> None:
        results: list[object] = []

        def make() -> None:
            try:
                results.append(start_pod(local_provider)[0])
            except Exception as exc:  # surfaced below
                results.append(exc)

        threads = [threading.Thread(target=make) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        handles = [r for r in results if not isinstance(r, BaseException)]
        try:
            assert len(handles) == 2, results
            assert handles[0].pod_id != handles[1].pod_id  # type: ignore[attr-defined]
            assert handles[0].ssh.port != handles[1].ssh.port  # type: ignore[attr-defined]
        finally:
            for h in handles:
                local_provider.terminate(h.pod_id)  # type: ignore[attr-defined]

    def test_bad_public_key_is_refused_before_anything_exists(
        self, local_provider: LocalPodProvider
    ) -> None:
        before = list(local_provider.list(""))
        with pytest.raises(SpecError, match="public_key"):
            local_provider.create(PodRequest(public_key="not a key"), "test-badkey")
        with pytest.raises(SpecError, match="BAD-NAME"):
            local_provider.create(
                PodRequest(public_key=generate_keypair().public_key, env={"BAD-NAME": "x"}),
                "test-badenv",
            )
        assert local_provider.list("") == before

    def test_default_home_follows_the_environment(self, runpod_home: Path) -> None:
        assert default_home() == runpod_home


class TestGatewayMode:
    def test_pty_shell_has_pod_env_and_a_coloured_prompt(self, gateway: PodFixture) -> None:
        _, handle, keypair = gateway
        client = connect_paramiko(handle, keypair)
        try:
            chan = client.invoke_shell(term="xterm")
            chan.send(
                b'echo "id=$RUNPOD_POD_ID gpus=$RUNPOD_GPU_COUNT job=$JOB_NAME '
                b'ip=${RUNPOD_PUBLIC_IP:-none} home=$HOME pwd=$(pwd)"; exit\n'
            )
            out = read_shell_until(chan, b"\x00never")  # until the shell exits
            assert chan.recv_exit_status() == 0
        finally:
            client.close()
        pod_dir = Path(handle.workdir).parent
        assert f"id={handle.pod_id} gpus=0 job=demo-finetune ip=none".encode() in out
        assert f"home={pod_dir / 'home'} pwd={handle.workdir}".encode() in out
        assert b"\x1b[" in out  # ANSI colours in the prompt
        assert f"@{handle.pod_id}".encode() in out

    def test_python_is_the_base_interpreter_not_the_venv(self, gateway: PodFixture) -> None:
        _, handle, keypair = gateway
        client = connect_paramiko(handle, keypair)
        try:
            chan = client.invoke_shell(term="xterm")
            chan.send(
                b"python3 -c 'import sys; print(\"PFX=\" + sys.prefix)'; "
                b"python3 -c 'import paramiko' 2>&1 | tail -1; exit\n"
            )
            out = read_shell_until(chan, b"\x00never").decode(errors="replace")
        finally:
            client.close()
        assert f"PFX={sys.base_prefix}\r\n" in out
        assert f"PFX={sys.prefix}\r\n" not in out or sys.prefix == sys.base_prefix
        assert "No module named 'paramiko'" in out  # the venv's packages are not visible

    def test_pip_refuses_to_install_into_the_host_python(self, gateway: PodFixture) -> None:
        _, handle, keypair = gateway
        has_pip = (
            subprocess.run(
                [str(base_python()), "-m", "pip", "--version"], capture_output=True
            ).returncode
            == 0
        )
        if not has_pip:
            pytest.skip("the base Python has no pip")
        out = _shell(
            handle,
            keypair,
            b"python3 -m pip install --no-index not-a-package-xyz; echo PIP-RC=$?-$((1+1))\n",
            b"-2\r\n",
        )
        assert b"virtualenv" in out
        assert b"PIP-RC=0-" not in out

    def test_runpodctl_passes_other_commands_to_a_real_one(
        self, gateway: PodFixture, tmp_path: Path
    ) -> None:
        _, handle, keypair = gateway
        real = tmp_path / "real-bin"
        real.mkdir()
        (real / "runpodctl").write_text('#!/bin/sh\necho "REAL-RUNPODCTL $*"\n')
        (real / "runpodctl").chmod(0o755)
        out = _shell(
            handle,
            keypair,
            b"runpodctl send x.bin; echo NONE-RC=$?-$((1+1)); "
            + f"PATH=$PATH:{real} runpodctl send x.bin; echo DONE-$((2+2))\n".encode(),
            b"DONE-4",
        )
        assert b"not available on local pod" in out and b"NONE-RC=1-2" in out
        assert b"REAL-RUNPODCTL send x.bin" in out

    def test_exec_is_refused_with_the_gateway_message(self, gateway: PodFixture) -> None:
        _, handle, keypair = gateway
        client = connect_paramiko(handle, keypair)
        try:
            _, stdout, stderr = client.exec_command("echo should-not-run")
            out, err = stdout.read(), stderr.read()
            status = stdout.channel.recv_exit_status()
        finally:
            client.close()
        assert status == 1
        assert GATEWAY_PTY_ERROR == "Error: Your SSH client doesn't support PTY"
        assert GATEWAY_PTY_ERROR.encode() in out + err
        assert b"should-not-run" not in out

    def test_sftp_is_refused(self, gateway: PodFixture) -> None:
        _, handle, keypair = gateway
        client = connect_paramiko(handle, keypair)
        try:
            with pytest.raises(paramiko.SSHException):
                client.open_sftp()
        finally:
            client.close()

    def test_the_tty_is_a_real_kernel_terminal(self, gateway: PodFixture) -> None:
        _, handle, keypair = gateway
        client = connect_paramiko(handle, keypair)
        try:
            chan = client.invoke_shell(term="xterm", width=100, height=30)
            # Markers are computed ($((…))) so the echo of the typed line never matches.
            chan.send(b"stty size; echo SIZE-$((1+1))\n")
            first = read_shell_until(chan, b"SIZE-2")
            chan.resize_pty(width=123, height=45)
            chan.send(b"stty size; echo SIZE-$((2+2))\n")
            second = read_shell_until(chan, b"SIZE-4")
            # Canonical mode keeps at most 4095 characters of a line (plus the newline).
            chan.send(b"echo READ-$((3*3)); read -r line; echo LEN=${#line}-END$((5*5))\n")
            read_shell_until(chan, b"READ-9")
            chan.send(b"a" * 5000 + b"\n")
            cut = read_shell_until(chan, b"-END25")
            chan.send(b"stty raw -echo && echo RAW-$((6*7)); stty sane; exit\n")
            raw = read_shell_until(chan, b"\x00never")
        finally:
            client.close()
        assert b"30 100" in first
        assert b"45 123" in second
        length = int(cut.rsplit(b"LEN=", 1)[-1].split(b"-END25")[0])
        assert 4000 <= length <= 4096
        assert b"RAW-42" in raw

    def test_wrong_key_or_user_is_refused(self, gateway: PodFixture) -> None:
        _, handle, keypair = gateway
        with pytest.raises(paramiko.AuthenticationException):
            connect_paramiko(handle, generate_keypair())
        with pytest.raises(paramiko.AuthenticationException):
            connect_paramiko(handle, keypair, user="root")


class TestDirectMode:
    def test_exec_runs_commands_with_the_pod_env(self, direct: PodFixture) -> None:
        _, handle, keypair = direct
        assert handle.ssh is not None
        client = connect_paramiko(handle, keypair)
        try:
            _, stdout, stderr = client.exec_command(
                'echo "$RUNPOD_POD_ID $RUNPOD_PUBLIC_IP $RUNPOD_TCP_PORT_22 $JOB_NAME"; '
                "echo oops >&2; exit 3"
            )
            out, err = stdout.read(), stderr.read()
            status = stdout.channel.recv_exit_status()
            _, pty_out, _ = client.exec_command("tty; echo $TERM", get_pty=True)
            tty = pty_out.read()
        finally:
            client.close()
        assert out == f"{handle.pod_id} 127.0.0.1 {handle.ssh.port} demo-finetune\n".encode()
        assert err == b"oops\n"
        assert status == 3
        assert b"/dev/pts/" in tty

    def test_sftp_puts_and_gets_files(self, direct: PodFixture, tmp_path: Path) -> None:
        _, handle, keypair = direct
        payload = os.urandom(300_000)
        local = tmp_path / "up.bin"
        local.write_bytes(payload)
        remote = f"{handle.workdir}/up.bin"
        client = connect_paramiko(handle, keypair)
        try:
            sftp = client.open_sftp()
            sftp.put(str(local), remote)
            sftp.get(remote, str(tmp_path / "down.bin"))
            sftp.close()
        finally:
            client.close()
        assert Path(remote).read_bytes() == payload
        assert (tmp_path / "down.bin").read_bytes() == payload


def _start_detached_sleep(handle: PodHandle, keypair: KeyPair) -> int:
    """Start ``setsid nohup sleep 1000 &`` from the pod's shell, as a user would start
    detached training; keep the shell open until the sleep runs (closing it at once
    would SIGHUP the job before ``setsid`` ran, as with any sshd). Returns its pid."""
    client = connect_paramiko(handle, keypair)
    try:
        chan = client.invoke_shell(term="xterm")
        chan.send(b"setsid nohup sleep 1000 >/dev/null 2>&1 & echo STARTED-$((2+2))\n")
        read_shell_until(chan, b"STARTED-4")
        assert _wait_for(lambda: _detached_sleeps(handle.pod_id))
        return _detached_sleeps(handle.pod_id)[0]
    finally:
        client.close()


def _detached_sleeps(pod_id: str) -> list[int]:
    pids = []
    for pid in find_marked_pids(pod_id):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(b"sleep\x001000"):
            pids.append(pid)
    return pids


@pytest.mark.slow
class TestTerminate:
    def test_terminate_ends_detached_processes_and_is_idempotent(
        self, local_pod: PodFixture
    ) -> None:
        provider, handle, keypair = local_pod
        assert handle.ssh is not None
        sleeper = _start_detached_sleep(handle, keypair)
        assert pid_alive(sleeper)  # it outlived the shell session
        record = read_record(provider.home, handle.pod_id)
        assert record is not None and pid_alive(record.pid)

        result = provider.terminate(handle.pod_id)

        assert result.pod_id == handle.pod_id and not result.already_gone
        assert not pid_alive(sleeper)
        assert not pid_alive(record.pid)
        assert find_marked_pids(handle.pod_id) == []
        assert not Path(handle.workdir).exists()
        assert _port_closed(handle.ssh.port)
        assert provider.get(handle.pod_id) is None
        assert provider.find(handle.name) is None
        again = provider.terminate(handle.pod_id)
        assert again.already_gone
        assert provider.terminate("doesnotexist00").already_gone

    def test_terminate_works_after_the_daemon_was_killed(self, local_pod: PodFixture) -> None:
        provider, handle, keypair = local_pod
        sleeper = _start_detached_sleep(handle, keypair)
        record = read_record(provider.home, handle.pod_id)
        assert record is not None
        os.kill(record.pid, signal.SIGKILL)
        assert _wait_for(lambda: not pid_alive(record.pid))
        # Still listed, so a reaper can find it; terminate cleans up what is left.
        assert provider.find(handle.name) is not None

        result = provider.terminate(handle.pod_id)

        assert not result.already_gone
        assert not pid_alive(sleeper)
        assert find_marked_pids(handle.pod_id) == []
        assert not Path(handle.workdir).exists()
        assert provider.get(handle.pod_id) is None

    def test_a_recycled_daemon_pid_is_never_signalled(self, local_pod: PodFixture) -> None:
        """The daemon died and its pid now belongs to an unrelated process: creating the
        same name makes a new pod, and terminate leaves that process alone."""
        provider, handle, keypair = local_pod
        record = read_record(provider.home, handle.pod_id)
        assert record is not None
        os.kill(record.pid, signal.SIGKILL)
        assert _wait_for(lambda: not pid_alive(record.pid))
        bystander = subprocess.Popen(["sleep", "60"])
        try:
            record.pid = bystander.pid
            write_record(provider.home, record)

            fresh = provider.create(PodRequest(public_key=keypair.public_key), handle.name)

            assert fresh.pod_id != handle.pod_id
            assert provider.get(handle.pod_id) is None  # the dead pod was terminated
            assert bystander.poll() is None
            provider.terminate(fresh.pod_id)
        finally:
            bystander.kill()
            bystander.wait()

    def test_runpodctl_remove_pod_from_the_shell_ends_the_pod(self, local_pod: PodFixture) -> None:
        local_provider, handle, keypair = local_pod
        client = connect_paramiko(handle, keypair)
        try:
            chan = client.invoke_shell(term="xterm")
            chan.send(b"runpodctl remove pod $RUNPOD_POD_ID\n")
            read_shell_until(chan, b"\x00never", timeout_seconds=120)  # ends when the pod does
        finally:
            client.close()
        gone = _wait_for(
            lambda: (
                local_provider.get(handle.pod_id) is None
                and not Path(handle.workdir).exists()
                and not find_marked_pids(handle.pod_id)
            )
        )
        assert gone
        assert local_provider.terminate(handle.pod_id).already_gone

    def test_a_pod_outlives_the_process_that_created_it(
        self, runpod_home: Path, local_provider: LocalPodProvider
    ) -> None:
        name = f"test-orphan-{uuid.uuid4().hex[:8]}"
        script = textwrap.dedent(
            f"""
            from pathlib import Path
            from prefect_runpod.blocks.keys import KeyPair, generate_keypair
            from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
            from prefect_runpod.blocks.provider import PodRequest
            provider = LocalPodProvider(home=Path({str(runpod_home)!r}), start_timeout_seconds=120.0)
            handle = provider.create(PodRequest(public_key=generate_keypair().public_key), {name!r})
            print(handle.pod_id)
            """
        )
        try:
            done = subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr
            pod_id = done.stdout.strip().splitlines()[-1]
            found = local_provider.find(name)
            assert found is not None and found.pod_id == pod_id
            assert [h.pod_id for h in local_provider.list("test-orphan-")].count(pod_id) == 1
            ready = local_provider.wait_ready(found, 180)
            assert ready.ssh is not None and not _port_closed(ready.ssh.port)
        finally:
            made = local_provider.find(name)
            if made is not None:
                local_provider.terminate(made.pod_id)
        assert made is not None and made.pod_id == pod_id
        assert local_provider.find(name) is None


class TestLocalPodBlock:
    def test_fields_are_documented(self) -> None:
        fields = LocalPod.model_fields
        assert set(fields) >= {"mode", "cost_per_hr", "home", "image"}
        for name in ("mode", "cost_per_hr", "home", "image"):
            description = fields[name].description
            assert description and description.endswith("."), name
        assert (
            "from prefect_runpod.blocks.local_pod.provider import LocalPod"
            in LocalPod._code_example
        )
        assert 'LocalPod.load("BLOCK_NAME")' in LocalPod._code_example
        assert LocalPod._block_type_name == "Local Pod"

    def test_get_provider_carries_the_settings(self, tmp_path: Path) -> None:
        block = LocalPod(mode="direct", cost_per_hr=0.22, home=str(tmp_path), image="conda")
        provider = block.get_provider()
        assert isinstance(provider, LocalPodProvider)
        assert (provider.mode, provider.cost_per_hr, provider.home) == ("direct", 0.22, tmp_path)
        assert provider.image == "conda" and LocalPod().get_provider().image == "plain"
        assert LocalPod().get_provider().home == default_home()

    def test_negative_price_is_refused(self) -> None:
        with pytest.raises(ValueError, match="cost_per_hr"):
            LocalPod(cost_per_hr=-1.0)
