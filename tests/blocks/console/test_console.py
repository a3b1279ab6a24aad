"""PodConsole against a real OpenSSH sshd on loopback (a real PTY bash)."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from pydantic import SecretStr

from prefect_runpod.blocks.console.session import PodConsole, run_remote
from prefect_runpod.blocks.exceptions import (
    CommandTimeoutError,
    ConsoleConnectError,
    ConsoleError,
    SpecError,
)
from prefect_runpod.blocks.keys import generate_keypair
from tests.fixtures.sshd import SshdServer

pytestmark = pytest.mark.sshd

POD = "pod-sshd-1"


@pytest.fixture
def console(sshd_server: SshdServer) -> Iterator[PodConsole]:
    with PodConsole(sshd_server.endpoint(), sshd_server.client_key.private_key, pod_id=POD) as c:
        yield c


def _cmdlines() -> list[bytes]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((entry / "cmdline").read_bytes())
            except OSError:
                continue
    return out


class TestRun:
    @pytest.mark.parametrize("code", [0, 1, 42])
    def test_exit_code_is_the_commands(self, console: PodConsole, code: int) -> None:
        result = console.run(f"echo before; (exit {code})")
        assert result.exit_code == code
        assert result.output == "before"

    def test_state_persists_between_commands(self, console: PodConsole) -> None:
        console.run("cd /tmp && export PRX_TEST_VAR=kept", check=True)
        assert console.run('pwd; echo "$PRX_TEST_VAR"').output == "/tmp\nkept"

    def test_coloured_progress_redraws_give_clean_final_lines(self, console: PodConsole) -> None:
        command = (
            r"printf 'start\n'; "
            r"for p in 10 50 90; do printf '\r\033[33m%3d%%\033[0m |%-10s|' $p '###'; done; "
            r"printf '\r\033[K\033[32m100%%\033[0m |##########|\n'; "
            r"printf '\033]0;title\007done\r\n'"
        )
        result = console.run(command)
        assert result.output.splitlines() == ["start", "100% |##########|", "done"]
        assert "\x1b" not in console.transcript

    def test_ten_thousand_character_output_line(self, console: PodConsole) -> None:
        result = console.run("head -c 10000 /dev/zero | tr '\\0' 'a'; echo")
        assert result.output == "a" * 10_000

    def test_ten_thousand_character_command_passes_the_tty_line_limit(
        self, console: PodConsole
    ) -> None:
        payload = "".join(chr(ord("a") + i % 26) for i in range(10_000))
        result = console.run(f"s='{payload}'; printf %s \"$s\" | sha256sum; echo ${{#s}}")
        digest = hashlib.sha256(payload.encode()).hexdigest()
        assert result.output.splitlines() == [f"{digest}  -", "10000"]
        assert result.exit_code == 0

    def test_multi_line_command_with_heredoc(self, console: PodConsole) -> None:
        command = (
            "cat <<'EOF' > heredoc.txt\nline one\n  $NOT_EXPANDED\nEOF\ncat heredoc.txt\nfalse"
        )
        result = console.run(command)
        assert result.output == "line one\n  $NOT_EXPANDED"
        assert result.exit_code == 1

    def test_echo_of_the_typed_line_is_dropped_if_echo_comes_back(
        self, console: PodConsole
    ) -> None:
        console.run("stty echo", check=True)
        assert console.run("echo visible").output == "visible"
        assert console.run("stty -echo").exit_code == 0
        assert console.run("echo quiet").output == "quiet"

    def test_output_without_final_newline(self, console: PodConsole) -> None:
        assert console.run("printf 'a\\nb'").output == "a\nb"

    def test_timeout_sends_ctrl_c_and_console_still_works(self, console: PodConsole) -> None:
        with pytest.raises(CommandTimeoutError, match=POD) as info:
            # the deadline must pass, but only after "started" (ms away) was printed
            console.run("echo started; sleep 300; echo never", timeout_seconds=10.0)
        assert info.value.output == "started"
        assert info.value.timeout_seconds == 10.0
        assert "sleep 300" in info.value.command
        after = console.run("echo alive")
        assert (after.output, after.exit_code) == ("alive", 0)
        assert console.transcript.count("never") == 1  # only in the typed command

    def test_on_line_streams_lines_in_order_while_running(
        self, console: PodConsole, tmp_path: Path
    ) -> None:
        # The command waits for a file that only the callback creates, so it can only
        # finish if "step 1" was delivered while it was still running.
        flag = tmp_path / "seen-step-1"
        seen: list[str] = []

        def on_line(line: str) -> None:
            seen.append(line)
            if line == "step 1":
                flag.touch()

        command = (
            f"echo 'step 1'; for i in $(seq 200); do [ -e {flag} ] && break; sleep 0.05; done; "
            f"[ -e {flag} ] && echo 'step 2' && echo 'step 3'"
        )
        result = console.run(command, on_line=on_line, timeout_seconds=30)
        assert result.exit_code == 0
        assert seen == ["step 1", "step 2", "step 3"]

    def test_check_raises_with_exit_code_and_last_lines(self, console: PodConsole) -> None:
        with pytest.raises(ConsoleError, match=r"exited with code 3(.|\n)*last words"):
            console.run("echo 'last words'; (exit 3)", check=True)

    def test_cursor_position_query_is_answered(self, console: PodConsole) -> None:
        result = console.run(
            r"printf '\033[6n'; IFS= read -rs -n 32 -d R -t 5 pos && echo answered"
        )
        assert result.output == "answered"

    def test_run_many_stops_at_first_failure(self, console: PodConsole) -> None:
        output, code = console.run_many(["echo one", "(exit 7)", "echo three"])
        assert (output, code) == ("one", 7)
        assert "three" not in console.transcript


class TestSecrets:
    def test_secret_env_is_usable_but_never_shown(
        self, console: PodConsole, sshd_server: SshdServer
    ) -> None:
        value = "hf_SENTINEL" + os.urandom(8).hex()
        console.set_secret_env("PRX_TOKEN", SecretStr(value))
        digest = hashlib.sha256(value.encode()).hexdigest()
        assert console.run('printf %s "$PRX_TOKEN" | sha256sum').output == f"{digest}  -"
        seen: list[str] = []
        echoed = console.run('echo "token=$PRX_TOKEN"', on_line=seen.append)
        assert echoed.output == "token=***"
        assert seen == ["token=***"]
        with pytest.raises(ConsoleError) as info:
            console.run('echo "$PRX_TOKEN"; false', check=True)
        assert value not in str(info.value)
        assert all(value.encode() not in cmdline for cmdline in _cmdlines())
        assert value not in console.transcript
        console.close()
        history = sshd_server.home / ".bash_history"
        assert not history.exists() or value not in history.read_text(errors="replace")

    def test_secrets_given_up_front_are_masked(self, sshd_server: SshdServer) -> None:
        secret = "rpa_UPFRONT_" + os.urandom(6).hex()
        with PodConsole(
            sshd_server.endpoint(),
            sshd_server.client_key.private_key,
            secrets=[SecretStr(secret)],
        ) as console:
            assert console.run(f"echo {secret[:4]}''{secret[4:]}").output == "***"
            assert secret not in console.transcript

    def test_bad_secret_name_or_value_is_refused(self, console: PodConsole) -> None:
        with pytest.raises(SpecError, match="variable name"):
            console.set_secret_env("BAD-NAME", SecretStr("x"))
        with pytest.raises(SpecError, match="line breaks"):
            console.set_secret_env("OK_NAME", SecretStr("two\nlines"))


class TestConnection:
    def test_host_key_mismatch_is_refused(self, sshd_server: SshdServer) -> None:
        other = generate_keypair().public_key.rsplit(" ", 1)[0]
        endpoint = sshd_server.endpoint().model_copy(update={"host_key": other})
        console = PodConsole(endpoint, sshd_server.client_key.private_key, pod_id=POD)
        with pytest.raises(ConsoleConnectError, match=f"{POD}.*host key.*not the pinned"):
            console.connect()

    def test_unpinned_host_key_is_reported_and_then_pinned(self, sshd_server: SshdServer) -> None:
        seen: list[str] = []
        with PodConsole(
            sshd_server.endpoint(pin_host_key=False),
            sshd_server.client_key.private_key,
            on_host_key=seen.append,
        ) as console:
            assert seen == [sshd_server.host_key]
            assert console.host_key == sshd_server.host_key

    def test_refused_client_key(self, sshd_server: SshdServer) -> None:
        stranger = generate_keypair().private_key
        with pytest.raises(ConsoleConnectError, match="key was refused"):
            PodConsole(sshd_server.endpoint(), stranger, pod_id=POD).connect()

    def test_drop_raises_and_reconnect_opens_a_fresh_session(self, console: PodConsole) -> None:
        console.set_secret_env("PRX_AFTER_DROP", SecretStr("kept-across-reconnect"))
        # Kill this session's sshd process: the connection drops mid-command.
        with pytest.raises(ConsoleConnectError, match=f"{POD}.*dropped.*fresh session"):
            console.run("kill -9 $PPID; sleep 300", timeout_seconds=120)
        # The next command opens a fresh session by itself, the secret exported again.
        result = console.run('echo back; printf %s "$PRX_AFTER_DROP" | wc -c')
        assert result.output == f"back\n{len('kept-across-reconnect')}"
        console.reconnect()  # an explicit reconnect works as well
        assert console.run("echo again").output == "again"

    def test_a_closed_console_stays_closed(self, console: PodConsole) -> None:
        console.close()
        with pytest.raises(ConsoleConnectError, match="not connected"):
            console.run("echo nope")

    def test_run_remote_contract_with_key_file(
        self, sshd_server: SshdServer, tmp_path: Path
    ) -> None:
        handle = sshd_server.handle(POD)
        output, code = run_remote(
            handle, sshd_server.key_file(), ["cd /tmp", "pwd", "echo ok"], per_command_timeout=30
        )
        assert (output, code) == ("/tmp\nok", 0)
        output, code = run_remote(handle, sshd_server.client_key.private_key, ["(exit 5)"])
        assert code == 5


class TestPtyStream:
    def test_eight_mib_of_random_bytes_round_trip_exactly(
        self, console: PodConsole, tmp_path: Path
    ) -> None:
        size = 8 * 1024 * 1024
        data = os.urandom(size)
        remote = tmp_path / "up.bin"
        stream = console.open_stream(f"head -c {size} > {remote}")
        stream.write(data)
        assert stream.finish(timeout_seconds=120) == 0
        assert remote.read_bytes() == data  # the pod's disk is this machine's here
        sha = console.run(f"sha256sum {remote}").output.split()[0]
        assert sha == hashlib.sha256(data).hexdigest()

        stream = console.open_stream(f"cat {remote}")
        got = bytearray()
        while chunk := stream.read(1 << 20, timeout_seconds=120):
            got += chunk
        assert stream.finish() == 0
        assert bytes(got) == data
        # the tty is back to sane + no echo, and the prompt is in sync
        assert (
            console.run("stty -a | grep -o -- '-echo ' | head -1; echo ok").output == "-echo \nok"
        )

    def test_input_goes_out_in_whole_packets(
        self, console: PodConsole, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # sshd returns window for each few KiB the tty takes: sending into every such
        # sliver split a 64 MiB upload into ~4,400 packets, half of them under 16 KiB.
        size = 4 * 1024 * 1024
        remote = tmp_path / "up.bin"
        stream = console.open_stream(f"head -c {size} > {remote}")
        sent: list[int] = []
        real_send = paramiko.Channel.send

        def send(channel: paramiko.Channel, data: bytes) -> int:
            n = real_send(channel, data)
            sent.append(n)
            return n

        monkeypatch.setattr(paramiko.Channel, "send", send)
        stream.write(os.urandom(size))
        monkeypatch.undo()
        assert stream.finish(timeout_seconds=120) == 0
        assert remote.stat().st_size == size
        whole = max(sent)
        assert whole >= 32 * 1024 - 64  # OpenSSH's 32 KiB packet less paramiko's header room
        assert sum(sent) == size
        assert [n for n in sent[:-1] if n != whole] == []

    def test_read_until_and_exit_code(self, console: PodConsole) -> None:
        stream = console.open_stream(
            "printf 'READY\\n'; head -c 5 | tr a-z A-Z; printf '\\nBYE_'; exit_code() { return 9; }; exit_code"
        )
        assert stream.read_until(b"READY\n", timeout_seconds=120) == b"READY\n"
        stream.write(b"hello")
        assert stream.read_until(b"BYE_", timeout_seconds=120) == b"HELLO\nBYE_"
        assert stream.finish() == 9
        assert stream.read() == b""
        assert console.run("echo fine").output == "fine"

    def test_console_refuses_commands_while_a_stream_is_open(self, console: PodConsole) -> None:
        stream = console.open_stream("head -c 3")
        with pytest.raises(ConsoleError, match="stream is open"):
            console.run("echo no")
        stream.write(b"abc")
        assert stream.finish() == 0
        assert re.fullmatch("ok", console.run("echo ok").output)


class TestExec:
    def test_exec_channel_on_a_full_sshd(self, console: PodConsole) -> None:
        result = console.exec_command("printf 'a\\nb\\n'; exit 6", timeout_seconds=30)
        assert (result.output, result.exit_code) == ("a\nb", 6)
