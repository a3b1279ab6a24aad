"""The lines the console types: under the tty line limit, never holding a sentinel."""

from __future__ import annotations

import base64
import hashlib
import subprocess

import pytest

from prefect_runpod.blocks.console.shell_lines import (
    MAX_LINE_BYTES,
    PROMPT_TAG,
    READY_TAG,
    needs_staging,
    session_setup_line,
    staging_lines,
    stream_line,
    sync_line,
)

TTY_LINE_LIMIT_BYTES = 4096
NONCE = "0123456789abcdef"


class TestLines:
    def test_setup_line_sets_the_sentinel_without_typing_it(self) -> None:
        line = session_setup_line(NONCE)
        assert PROMPT_TAG + NONCE not in line
        assert len(line.encode()) < TTY_LINE_LIMIT_BYTES
        # bash itself assembles the prompt from the quoted pieces
        out = subprocess.run(
            ["bash", "-c", line.replace("stty -echo; ", "") + '; printf %s "$PS1"'],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out == f"{PROMPT_TAG}{NONCE}:$?\\n"

    @pytest.mark.parametrize("raw", [True, False])
    def test_stream_line_never_holds_the_ready_marker(self, raw: bool) -> None:
        line = stream_line("cat", NONCE, raw=raw)
        assert READY_TAG + NONCE not in line
        assert ("stty raw -echo" in line) is raw

    def test_sync_line_is_short(self) -> None:
        assert len(sync_line("abc").encode()) < 100

    @pytest.mark.parametrize(
        ("command", "staged"),
        [
            ("echo hi", False),
            ("x" * MAX_LINE_BYTES, False),
            ("x" * (MAX_LINE_BYTES + 1), True),
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
