"""What the OpenSSH client sees of a local pod: the same as of RunPod.

Gateway mode: ``ssh -tt`` gets a shell, ``ssh host cmd`` gets the PTY error,
``sftp`` fails. Direct mode: commands and SFTP work. The host key is pinned from the
handle (``StrictHostKeyChecking=yes``), so every login also proves the handle's key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import GATEWAY_PTY_ERROR
from prefect_runpod.blocks.keys import KeyPair
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.pod_handle import PodHandle
from tests.fixtures.local_pod import PodFixture, known_hosts_line, start_pod

pytestmark = pytest.mark.skipif(
    not (shutil.which("ssh") and shutil.which("sftp")), reason="OpenSSH client not installed"
)

_TIMEOUT_SECONDS = 60


@pytest.fixture(scope="module")
def gateway(runpod_home: Path) -> Iterator[PodFixture]:
    provider = LocalPodProvider(home=runpod_home, start_timeout_seconds=120.0)
    handle, keypair = start_pod(provider)
    yield provider, handle, keypair
    provider.terminate(handle.pod_id)


@pytest.fixture(scope="module")
def direct(runpod_home: Path) -> Iterator[PodFixture]:
    provider = LocalPodProvider(home=runpod_home, mode="direct", start_timeout_seconds=120.0)
    handle, keypair = start_pod(provider)
    yield provider, handle, keypair
    provider.terminate(handle.pod_id)


class OpenSSH:
    """The ``ssh``/``sftp`` command lines for one pod, with its key and pinned host key."""

    def __init__(self, handle: PodHandle, keypair: KeyPair, tmp: Path) -> None:
        assert handle.ssh is not None
        self.handle = handle
        self.key = tmp / "id_ed25519"
        self.key.write_text(keypair.private_key.get_secret_value())
        os.chmod(self.key, 0o600)
        self.known_hosts = tmp / "known_hosts"
        self.known_hosts.write_text(known_hosts_line(handle) + "\n")
        self.options = [
            "-F", "/dev/null",
            "-i", str(self.key),
            "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes",
            "-o", "LogLevel=ERROR",
        ]  # fmt: skip
        self.target = f"{handle.ssh.user}@{handle.ssh.host}"
        self.port = str(handle.ssh.port)

    def ssh(
        self, *flags: str, command: str | None = None, stdin: bytes = b""
    ) -> subprocess.CompletedProcess[bytes]:
        argv = ["ssh", *self.options, "-p", self.port, *flags, self.target]
        return subprocess.run(
            argv if command is None else [*argv, command],
            input=stdin,
            capture_output=True,
            timeout=_TIMEOUT_SECONDS,
        )

    def sftp(self, batch: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["sftp", *self.options, "-P", self.port, "-b", "-", self.target],
            input=batch.encode(),
            capture_output=True,
            timeout=_TIMEOUT_SECONDS,
        )


class TestGatewayThroughOpenSSH:
    def test_tt_session_runs_typed_input(self, gateway: PodFixture, tmp_path: Path) -> None:
        _, handle, keypair = gateway
        done = OpenSSH(handle, keypair, tmp_path).ssh(
            "-tt", stdin=b"echo pod=$RUNPOD_POD_ID sum=$((40+2)); exit\n"
        )
        assert done.returncode == 0, done.stderr
        assert f"pod={handle.pod_id} sum=42".encode() in done.stdout
        assert b"\x1b[" in done.stdout  # the coloured prompt

    def test_tt_with_a_command_types_it_into_the_shell(
        self, gateway: PodFixture, tmp_path: Path
    ) -> None:
        _, handle, keypair = gateway
        done = OpenSSH(handle, keypair, tmp_path).ssh("-tt", command="echo typed-$((3*5)); exit")
        assert done.returncode == 0, done.stderr
        assert b"typed-15" in done.stdout

    def test_command_without_pty_gets_the_gateway_error(
        self, gateway: PodFixture, tmp_path: Path
    ) -> None:
        _, handle, keypair = gateway
        done = OpenSSH(handle, keypair, tmp_path).ssh("-T", command="echo never-$((1+1))")
        assert done.returncode != 0
        assert GATEWAY_PTY_ERROR.encode() in done.stdout + done.stderr
        assert b"never-2" not in done.stdout

    def test_sftp_fails(self, gateway: PodFixture, tmp_path: Path) -> None:
        _, handle, keypair = gateway
        (tmp_path / "f.txt").write_text("x")
        done = OpenSSH(handle, keypair, tmp_path).sftp(f"put {tmp_path / 'f.txt'} f.txt\n")
        assert done.returncode != 0
        assert not (Path(handle.workdir) / "f.txt").exists()

    def test_a_different_pinned_host_key_is_refused(
        self, gateway: PodFixture, direct: PodFixture, tmp_path: Path
    ) -> None:
        _, handle, keypair = gateway
        _, other, _ = direct
        client = OpenSSH(handle, keypair, tmp_path)
        assert handle.ssh is not None and other.ssh is not None
        client.known_hosts.write_text(
            f"[{handle.ssh.host}]:{handle.ssh.port} {other.ssh.host_key}\n"
        )
        done = client.ssh("-tt", stdin=b"exit\n")
        assert done.returncode == 255
        assert b"HOST IDENTIFICATION HAS CHANGED" in done.stderr


class TestDirectThroughOpenSSH:
    def test_commands_run_and_exit_codes_propagate(
        self, direct: PodFixture, tmp_path: Path
    ) -> None:
        _, handle, keypair = direct
        done = OpenSSH(handle, keypair, tmp_path).ssh(command="echo pod=$RUNPOD_POD_ID; exit 7")
        assert done.returncode == 7, done.stderr
        assert done.stdout == f"pod={handle.pod_id}\n".encode()

    def test_sftp_puts_and_gets(self, direct: PodFixture, tmp_path: Path) -> None:
        _, handle, keypair = direct
        payload = os.urandom(100_000)
        (tmp_path / "up.bin").write_bytes(payload)
        remote = f"{handle.workdir}/sftp-up.bin"
        done = OpenSSH(handle, keypair, tmp_path).sftp(
            f"put {tmp_path / 'up.bin'} {remote}\nget {remote} {tmp_path / 'down.bin'}\n"
        )
        assert done.returncode == 0, done.stderr
        assert Path(remote).read_bytes() == payload
        assert (tmp_path / "down.bin").read_bytes() == payload
