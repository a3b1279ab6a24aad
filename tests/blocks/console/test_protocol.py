"""``ConsoleLike``: the one console protocol the tasks are typed against. The real
console and every test stand-in fit it, so a task tested with a stand-in runs the same
calls on a pod."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from prefect_runpod.blocks import console as console_package
from prefect_runpod.blocks.console import CommandOutput, CommandResult, ConsoleLike, PodConsole
from tests.fixtures.hf import ShellConsole
from tests.fixtures.train import LocalShellConsole


class _RunOnly:
    def run(self, command: str, *, timeout_seconds: float = 60.0, check: bool = False):
        raise AssertionError("never called")


class TestConsoleLike:
    def test_pod_console_fits(self) -> None:
        assert issubclass(PodConsole, ConsoleLike)

    @pytest.mark.parametrize(
        "stand_in", [LocalShellConsole, ShellConsole], ids=lambda c: c.__name__
    )
    def test_stand_ins_fit(self, stand_in) -> None:
        assert isinstance(stand_in(), ConsoleLike)

    def test_a_console_without_secrets_or_reconnect_does_not_fit(self) -> None:
        assert not isinstance(_RunOnly(), ConsoleLike)

    def test_exported_by_the_console_package(self) -> None:
        assert {"ConsoleLike", "CommandOutput"} <= set(console_package.__all__)


class TestCommandOutput:
    def test_results_of_real_and_stand_in_consoles_fit(self) -> None:
        real = CommandResult(command="true", output="", exit_code=0, seconds=0.0)
        assert isinstance(real, CommandOutput)
        assert isinstance(LocalShellConsole().run("echo hi"), CommandOutput)
        assert isinstance(ShellConsole().run("echo hi"), CommandOutput)


def test_local_shell_console_exports_secrets_through_the_environment() -> None:
    shell = LocalShellConsole()
    shell.set_secret_env("PRFT_TEST_SECRET", SecretStr("s3cr3t"))
    result = shell.run('printf "%s" "$PRFT_TEST_SECRET" | wc -c')
    assert (result.exit_code, result.output.strip()) == (0, "6")
    assert all("s3cr3t" not in call for call in shell.calls)
