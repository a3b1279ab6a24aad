"""The lines the console types: under the tty line limit, never holding a sentinel."""

from __future__ import annotations

import base64
import hashlib
import subprocess

import pytest

from prefect_runpod.blocks.console.shell_lines import (
    END_TAG,
    MAX_LINE_BYTES,
    READY_TAG,
    SETUP_TAG,
    START_TAG,
    command_line,
    marker,
    needs_staging,
    parse_setup_report,
    session_setup_line,
    staging_lines,
    stream_line,
    sync_line,
)

TTY_LINE_LIMIT_BYTES = 4096
NONCE = "0123456789abcdef"


def _shell(line: str, shell: str = "bash") -> str:
    """Run one typed line in an interactive shell (as the console's is), without rc
    files; its stdout."""
    argv = [shell, "--norc", "-i", "-c", line] if shell == "bash" else [shell, "-i", "-c", line]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.stdout


class TestLines:
    def test_setup_line_reports_without_typing_its_marker(self) -> None:
        line = session_setup_line(NONCE, "t1")
        assert marker(SETUP_TAG, NONCE, "t1") not in line
        assert len(line.encode()) < TTY_LINE_LIMIT_BYTES
        out = _shell(line)
        report = next(
            r for r in (parse_setup_report(x, NONCE, "t1") for x in out.splitlines()) if r
        )
        assert report.shell == "bash"
        assert parse_setup_report(out, NONCE, "other") is None

    @pytest.mark.parametrize("shell", ["bash", "sh"])
    def test_command_line_frames_output_and_exit_code(self, shell: str) -> None:
        line = command_line("echo 'a b'; cd /tmp; (exit 7)", NONCE, 3, shell)
        assert marker(START_TAG, NONCE, 3) not in line and marker(END_TAG, NONCE, 3) not in line
        out = _shell(line, shell)
        assert out == f"{marker(START_TAG, NONCE, 3)}\na b\n{marker(END_TAG, NONCE, 3)}:7\n"

    @pytest.mark.parametrize(
        ("command", "code"),
        [(")", 2), ("echo 'unbalanced", 2), ("", 0), ("   ", 0), ("sleep 0 &", 0), ("false", 1)],
    )
    def test_a_bad_command_still_ends_with_its_exit_code(self, command: str, code: int) -> None:
        out = _shell(command_line(command, NONCE, 4))
        assert out.rstrip().endswith(f"{marker(END_TAG, NONCE, 4)}:{code}"), out
        out = _shell(command_line(command, NONCE, 4, "sh"), "sh")
        assert out.rstrip().endswith(f"{marker(END_TAG, NONCE, 4)}:{code}"), out

    def test_a_stdin_reader_cannot_swallow_the_end_of_the_frame(self) -> None:
        line = command_line("read v; echo got=$v", NONCE, 5)
        done = subprocess.run(
            ["bash", "-c", line], input="typed\n", capture_output=True, text=True, check=False
        )
        assert done.stdout.splitlines()[1:] == ["got=typed", f"{marker(END_TAG, NONCE, 5)}:0"]

    @pytest.mark.parametrize("raw", [True, False])
    def test_stream_line_never_holds_the_ready_marker(self, raw: bool) -> None:
        line = stream_line("cat", NONCE, 6, raw=raw)
        assert marker(READY_TAG, NONCE, 6) not in line
        assert ("stty raw -echo" in line) is raw

    def test_sync_line_is_short(self) -> None:
        assert len(sync_line(NONCE, "abc").encode()) < 1000

    def test_setup_report_names_what_it_found_and_what_is_left(self) -> None:
        head = marker(SETUP_TAG, NONCE, "t")
        was = "braceexpand:emacs:history:interactive-comments"
        tty_was = "speed 38400 baud; isig icanon echo echoe"
        tty_now = "speed 38400 baud; isig icanon -echo echoe"
        text = f"garbage{head}\tbash\t{was}\t{tty_was}\tbraceexpand\t{tty_now}"
        report = parse_setup_report(text, NONCE, "t")
        assert report is not None
        assert report.found == ("tty echo on", "shell history on", "line editing on")
        assert report.problems == ()
        cut = parse_setup_report(f"{head}\tbash\t{was}", NONCE, "t")
        assert cut is None  # a report cut short is no report

    @pytest.mark.parametrize(
        ("command", "staged"),
        [
            ("echo hi", False),
            ("x" * MAX_LINE_BYTES, False),
            ("x" * (MAX_LINE_BYTES + 1), True),
            ("'" * 700, True),  # typed quoted: each ' takes five bytes
            ("é" * (MAX_LINE_BYTES // 2 + 1), True),  # bytes, not characters
            ("echo a\necho b", True),
            ("echo \x04", True),
            ("printf 'a\tb'", False),
        ],
    )
    def test_needs_staging(self, command: str, staged: bool) -> None:
        assert needs_staging(command) is staged

    def test_staging_lines_fit_and_rebuild_the_command(self) -> None:
        command = "echo start\n" + "".join(chr(32 + i % 90) for i in range(200_000)) + "\n"
        setup, run = staging_lines(command, "/tmp/.prx_test")
        assert all(len(line.encode()) < TTY_LINE_LIMIT_BYTES for line in [*setup, run])
        pieces = "".join(line.split("'")[1] for line in setup[1:-1])
        assert base64.b64decode(pieces) == command.encode()
        assert hashlib.sha256(command.encode()).hexdigest() in setup[-1]
