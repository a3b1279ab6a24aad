"""The console owns its session, on every image profile (docs/local-pod-images.md).

Whatever a command or a login script does to the shell — prompt, PROMPT_COMMAND, line
editing, tty settings, shell options, the shell replaced — the next command's output
and exit code are exact, without the caller ever calling ``reconnect()``. Each test
runs against a gateway-mode local pod of every registered image profile (the test id
names it); the examples of the issue that asked for this (#13) are tests here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from prefect_runpod.blocks.console import shell as shell_module
from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.exceptions import CommandTimeoutError, ConsoleConnectError
from prefect_runpod.blocks.local_pod import images
from prefect_runpod.blocks.local_pod.images import ImageProfile, register_profile
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from tests.fixtures.local_pod import PodFixture, start_pod

pytestmark = pytest.mark.slow

_CURSOR_QUERY_AT_THE_END = "PS1='$ '\nprintf '\\033[6n'; IFS= read -rs -d R -t 5 _p\n"


@pytest.fixture
def console(image_pod: PodFixture) -> Iterator[PodConsole]:
    _provider, handle, keypair = image_pod
    with PodConsole.for_pod(handle, keypair.private_key) as live:
        yield live


def _assert_exact(console: PodConsole) -> None:
    """The session still gives exact output and exit codes."""
    assert console.run("echo hi").output == "hi"
    assert console.run("printf 'a\\nb'").output == "a\nb"
    assert console.run("(exit 4)").exit_code == 4


def _assert_set_up(console: PodConsole) -> None:
    """Echo off, history off, line editing off: the console's setup is in place."""
    history = console.run("set -o | grep -w history").output.split()
    assert history == ["history", "off"]
    assert "-echo" in console.run("stty -a").output.split()
    assert console.run("set -o | grep -E -w 'emacs|vi' | grep -w on").exit_code == 1


def test_the_setup_holds_after_every_login(console: PodConsole) -> None:
    _assert_set_up(console)
    _assert_exact(console)


def test_a_prompt_change_is_not_a_dead_shell(console: PodConsole) -> None:
    """#13: ``PS1='\\u@\\h:\\w\\$ '`` used to time out after 15 s, and the next command
    called the (healthy) shell dead. A run that misses its end raises at its deadline,
    so returning at all is the check (the deadline only guards against a hang)."""
    result = console.run(r"PS1='\u@\h:\w\$ '", timeout_seconds=120)
    assert (result.exit_code, result.output) == (0, "")
    _assert_exact(console)


def test_an_activated_venv_leaves_output_exact(console: PodConsole) -> None:
    """#13: after ``. v/bin/activate`` every output carried the prompt: ``'hi\\n(v) '``."""
    console.run("python3 -m venv --without-pip v", timeout_seconds=120, check=True)
    assert console.run(". v/bin/activate").exit_code == 0
    assert console.run("echo hi").output == "hi"
    assert console.run('echo "$VIRTUAL_ENV"').output.endswith("/v")
    assert console.run("deactivate").exit_code == 0
    _assert_exact(console)


@pytest.mark.parametrize(
    "change",
    [
        "PROMPT_COMMAND='echo NOISE; printf \"\\033[6n\"'",
        "set -o emacs; bind 'set enable-bracketed-paste on'",
        "set -o vi",
        "set -x",
        "set -e",
        "set -u",
        "set -o history; HISTFILE=~/.bash_history",
        "stty echo",
        "stty raw",
        "trap 'echo TRAPPED' DEBUG",
        "cd /",
    ],
)
def test_what_a_command_does_to_the_shell_leaves_the_next_exact(
    console: PodConsole, change: str
) -> None:
    assert console.run(change).exit_code == 0
    _assert_exact(console)
    assert console.run("false").exit_code == 1  # no errexit left to end the shell
    _assert_set_up(console)


def test_cd_and_export_persist(console: PodConsole) -> None:
    console.run("cd /tmp && export PRX_TEST_VALUE=kept")
    assert console.run('echo "$(pwd) $PRX_TEST_VALUE"').output == "/tmp kept"


@pytest.mark.parametrize("replace", ["exec bash", "exec bash --norc", "exec sh"])
def test_the_shell_replaced(
    console: PodConsole, replace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="prefect_runpod.console"):
        assert console.run(replace, timeout_seconds=120).exit_code == 0
    _assert_exact(console)
    shell = "sh" if replace == "exec sh" else "bash"
    assert console.run('[ -n "${BASH_VERSION-}" ] && echo bash || echo sh').output == shell
    logged = [r.getMessage() for r in caplog.records if "replaced the shell" in r.getMessage()]
    assert len(logged) == 1 and f"`{replace}`" in logged[0], logged


def test_a_timeout_leaves_a_working_console(console: PodConsole) -> None:
    with pytest.raises(CommandTimeoutError, match="shell back"):
        console.run("sleep 30", timeout_seconds=1)
    _assert_exact(console)


def test_a_stuck_command_never_needs_reconnect(
    local_pod: PodFixture, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A command that ignores Ctrl-C and holds the tty: the console opens a fresh
    session by itself before the next command (the old shell is hung up)."""
    monkeypatch.setattr(shell_module, "_INTERRUPT_GRACE_SECONDS", 2.0)
    _provider, handle, keypair = local_pod
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        with pytest.raises(CommandTimeoutError, match="no answer yet"):
            console.run("trap '' INT; sleep 300", timeout_seconds=1)
        with caplog.at_level(logging.WARNING, logger="prefect_runpod.console"):
            _assert_exact(console)
    assert any("opening a fresh session" in r.getMessage() for r in caplog.records)


@pytest.fixture
def custom_profile(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Register a throwaway image profile (undone after the test)."""
    monkeypatch.setattr(images, "_PROFILES", dict(images._PROFILES))

    def make(bashrc: str) -> str:
        name = f"custom-{len(images._PROFILES)}"
        register_profile(ImageProfile(name=name, description="a test rc", bashrc=bashrc))
        return name

    return make


def test_a_cursor_query_at_login_cannot_swallow_the_setup(runpod_home, custom_profile) -> None:  # type: ignore[no-untyped-def]
    """#13: an rc ending with ``printf '\\033[6n'; IFS= read -rs -d R -t 5 _p`` swallowed
    the setup line: afterwards history was on and tty echo on, and nothing noticed."""
    provider = LocalPodProvider(home=runpod_home, image=custom_profile(_CURSOR_QUERY_AT_THE_END))
    handle, keypair = start_pod(provider)
    try:
        with PodConsole.for_pod(handle, keypair.private_key) as console:
            _assert_set_up(console)
            _assert_exact(console)
    finally:
        provider.terminate(handle.pod_id)


def test_a_setup_that_never_holds_names_what_the_login_did(runpod_home, custom_profile) -> None:  # type: ignore[no-untyped-def]
    """An rc that asks for the cursor and then reads every typed line for ever."""
    rc = "echo 'Welcome to the trap image'\nprintf '\\033[6n'\ncat > /dev/null\n"
    provider = LocalPodProvider(home=runpod_home, image=custom_profile(rc))
    handle, keypair = start_pod(provider)
    try:
        # The deadline must pass; the login before the first setup line must not use it up.
        console = PodConsole.for_pod(handle, keypair.private_key, connect_timeout_seconds=20)
        with pytest.raises(ConsoleConnectError) as caught:
            console.connect()
    finally:
        provider.terminate(handle.pod_id)
    message = str(caught.value)
    assert handle.pod_id in message
    assert "cursor position 1 time(s)" in message
    assert "no answer to the setup line" in message
    assert "Welcome to the trap image" in message
    assert "~/.bashrc" in message  # the next step
