"""Tests for the terminal-text model: escapes, redraws, split chunks (redaction is
``blocks.secret_mask``'s, tested in tests/blocks/test_secret_mask.py)."""

from __future__ import annotations

from prefect_runpod.blocks.console.terminal_text import (
    TerminalDecoder,
    clean_output,
    strip_ansi,
)


class TestStripAnsi:
    def test_colours_titles_and_charsets_are_removed(self) -> None:
        text = "\x1b]0;root@pod: ~\x07\x1b[1;32mroot@pod\x1b[0m:\x1b(B~# \x1b[?2004h"
        assert strip_ansi(text) == "root@pod:~# "

    def test_osc_with_string_terminator_and_hyperlink(self) -> None:
        text = "\x1b]8;;https://x.example\x1b\\link\x1b]8;;\x1b\\ done"
        assert strip_ansi(text) == "link done"

    def test_line_controls_are_kept(self) -> None:
        assert strip_ansi("a\r\nb\rc") == "a\r\nb\rc"


class TestCleanOutput:
    def test_progress_redraws_keep_the_final_state(self) -> None:
        text = "Downloading\r\n\x1b[33m 10%\x1b[0m|#   |\r\x1b[33m 55%\x1b[0m|##  |\r100%|####|\r\ndone\r\n"
        assert clean_output(text) == "Downloading\n100%|####|\ndone"

    def test_shorter_redraw_overwrites_like_a_terminal(self) -> None:
        # xterm leaves the old tail visible unless the program erases it (ESC[K).
        assert clean_output("12345\rab\n") == "ab345"
        assert clean_output("12345\r\x1b[Kab\n") == "ab"

    def test_erase_whole_line_then_redraw(self) -> None:
        assert clean_output("old text\x1b[2K\rnew\n") == "new"

    def test_backspace_and_column_moves(self) -> None:
        assert clean_output("abc\x08\x08X\n") == "aXc"
        assert clean_output("abcdef\x1b[3GZ\n") == "abZdef"
        assert clean_output("ab\x1b[2CZ\n") == "ab  Z"

    def test_unfinished_last_line_is_kept(self) -> None:
        assert clean_output(b"one\r\ntwo") == "one\ntwo"

    def test_invalid_utf8_becomes_replacement_character(self) -> None:
        assert clean_output(b"ok \xff\n") == "ok \ufffd"

    def test_other_control_bytes_are_dropped_tabs_kept(self) -> None:
        assert clean_output("a\x07b\x00c\td\n") == "abc\td"


class TestTerminalDecoder:
    def test_chunks_split_anywhere_give_the_same_lines(self) -> None:
        data = (
            "\x1b]0;title\x07\x1b[1;32mgreen\x1b[0m é€ line\r\n"
            "\x1b[36m 1/3\x1b[0m\r\x1b[K\x1b[36m 3/3\x1b[0m\r\n"
            "tail"
        ).encode()
        whole = TerminalDecoder()
        expected = whole.feed(data)
        assert expected == ["green é€ line", " 3/3"]
        for size in (1, 2, 3, 5, 7):
            decoder = TerminalDecoder()
            lines: list[str] = []
            for i in range(0, len(data), size):
                lines.extend(decoder.feed(data[i : i + size]))
            assert lines == expected, size
            assert decoder.pending == "tail"

    def test_cursor_queries_are_counted_and_not_shown(self) -> None:
        decoder = TerminalDecoder()
        assert decoder.feed(b"ask\x1b[6") == []
        assert decoder.feed(b"n here\x1b[6n\n") == ["ask here"]
        assert decoder.take_cursor_queries() == 2
        assert decoder.take_cursor_queries() == 0

    def test_unterminated_osc_waits_for_its_end(self) -> None:
        decoder = TerminalDecoder()
        assert decoder.feed("\x1b]0;a long ti") == []
        assert decoder.feed("tle\x07text\n") == ["text"]

    def test_flush_returns_and_resets_the_pending_line(self) -> None:
        decoder = TerminalDecoder()
        decoder.feed("half")
        assert decoder.column == 4
        assert decoder.flush() == "half"
        assert decoder.pending == ""

    def test_long_line_stays_whole(self) -> None:
        decoder = TerminalDecoder()
        line = "x" * 10_000
        assert decoder.feed(line + "\r\n") == [line]
