"""Image profiles of the local pod: each reproduces the login environment of a real image,
as a person sees it in a raw PTY shell (paramiko, no console in between)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.local_pod import images
from prefect_runpod.blocks.local_pod.images import (
    ImageProfile,
    get_profile,
    profile_names,
    register_profile,
)
from prefect_runpod.blocks.local_pod.provider import LocalPod, LocalPodProvider
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.flows.cli import build_parser
from prefect_runpod.flows.run.providers import build_provider
from tests.fixtures.local_pod import connect_paramiko, read_shell_until, start_pod

SHIPPED = ("plain", "runpod-pytorch", "conda", "fancy", "venv-python")


def _raw_shell(handle: PodHandle, keypair, typed: bytes) -> str:  # type: ignore[no-untyped-def]
    """Log in like a person (PTY, xterm), answer nothing, type ``typed`` and read until
    the shell exits; the whole terminal output, decoded."""
    client = connect_paramiko(handle, keypair)
    try:
        chan = client.invoke_shell(term="xterm")
        chan.send(typed)
        return read_shell_until(chan, b"\x00never", timeout_seconds=60).decode(errors="replace")
    finally:
        client.close()


class TestRegistry:
    def test_every_shipped_profile_is_registered_plain_first(self) -> None:
        assert profile_names()[0] == "plain"
        assert set(SHIPPED) <= set(profile_names())
        for name in SHIPPED:
            profile = get_profile(name)
            assert profile.name == name and profile.description and profile.bashrc.strip()

    def test_an_unknown_profile_is_refused_before_anything_exists(self, tmp_path: Path) -> None:
        with pytest.raises(SpecError, match=r"'nope'.*plain, runpod-pytorch, conda"):
            LocalPodProvider(home=tmp_path, image="nope")
        assert list(tmp_path.iterdir()) == []
        with pytest.raises(SpecError, match="nope"):
            LocalPod(image="nope").get_provider()

    def test_a_profile_is_data_and_easy_to_add(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        monkeypatch.setattr(images, "_PROFILES", dict(images._PROFILES))
        register_profile(ImageProfile(name="mine", description="d", bashrc="PS1='> '\n"))
        assert "mine" in profile_names()
        assert LocalPodProvider(home=tmp_path, image="mine").image == "mine"
        with pytest.raises(ValueError, match="already registered"):
            register_profile(ImageProfile(name="mine", description="d", bashrc=""))
        with pytest.raises(ValueError, match="image profile name"):
            register_profile(ImageProfile(name="bad name", description="d", bashrc=""))

    def test_the_cli_and_the_flow_take_a_profile(self) -> None:
        args = build_parser().parse_args(["finetune", "--local-image", "conda"])
        assert args.local_image == "conda"
        assert build_parser().parse_args(["finetune"]).local_image is None  # the default: plain
        with pytest.raises(SystemExit):
            build_parser().parse_args(["finetune", "--local-image", "nope"])
        provider, _ = build_provider({"provider": "local", "local_image": "fancy"})
        assert isinstance(provider, LocalPodProvider) and provider.image == "fancy"
        with pytest.raises(SpecError, match="unknown local pod image 'nope'"):
            build_provider({"provider": "local", "local_image": "nope"})


@pytest.mark.slow
class TestWhatALoginMeets:
    def _pod(self, runpod_home: Path, image: str):  # type: ignore[no-untyped-def]
        provider = LocalPodProvider(home=runpod_home, start_timeout_seconds=120.0, image=image)
        handle, keypair = start_pod(provider)
        return provider, handle, keypair

    def test_runpod_pytorch_banner_workspace_and_two_pythons(self, runpod_home: Path) -> None:
        provider, handle, keypair = self._pod(runpod_home, "runpod-pytorch")
        try:
            out = _raw_shell(
                handle,
                keypair,
                b"cd /tmp; exec bash\n"  # the rc runs again and goes back to /workspace
                b'echo "PWD=$(pwd) PT=$PYTORCH_VERSION"; '
                b'python3 -c \'import torch, transformers; print("P3", torch.__version__, '
                b"transformers.__version__)'; python -c 'import torch' 2>&1 | tail -1; exit\n",
            )
        finally:
            provider.terminate(handle.pod_id)
        assert out.count("RunPod PyTorch 2.1.0") == 2  # the banner, at login and after exec
        assert f"PWD={handle.workdir} PT=2.1.0" in out
        assert "P3 2.1.0+cu118 4.46.3" in out
        assert "No module named 'torch'" in out  # `python` is the system one

    def test_conda_puts_base_before_every_prompt(self, runpod_home: Path) -> None:
        provider, handle, keypair = self._pod(runpod_home, "conda")
        try:
            out = _raw_shell(handle, keypair, b'true\ntrue\necho "E=$CONDA_DEFAULT_ENV"; exit\n')
        finally:
            provider.terminate(handle.pod_id)
        assert out.count("(base) ") >= 3 and "(base) (base)" not in out
        assert "E=base" in out

    def test_fancy_queries_the_cursor_and_redraws_the_prompt(self, runpod_home: Path) -> None:
        provider, handle, keypair = self._pod(runpod_home, "fancy")
        client = connect_paramiko(handle, keypair)
        try:
            chan = client.invoke_shell(term="xterm")
            # Like a terminal: the rc asks where the cursor is and reads the answer.
            login = read_shell_until(chan, b"\x1b[6n")
            chan.send(b"\x1b[24;1R")
            read_shell_until(chan, b"\x1b[0m ")  # the end of the first prompt
            chan.send(b"false\nexit\n")
            out = (login + read_shell_until(chan, b"\x00never")).decode(errors="replace")
        finally:
            client.close()
            provider.terminate(handle.pod_id)
        assert "\x1b]0;" in out  # a window-title escape in the prompt
        assert "\x1b[?2004h" in out  # bracketed paste on
        assert "[1]" in out and "\x1b[1;31m" in out  # the prompt shows the failed status, red

    def test_venv_python_is_a_venv_activated_by_the_rc(self, runpod_home: Path) -> None:
        provider, handle, keypair = self._pod(runpod_home, "venv-python")
        try:
            out = _raw_shell(
                handle,
                keypair,
                b'python -c \'import sys, torch; print("VENV", sys.prefix != sys.base_prefix, '
                b"torch.__version__)'; exit\n",
            )
        finally:
            provider.terminate(handle.pod_id)
        assert "VENV True 2.5.1+cpu" in out
        assert "(venv) " in out

    def test_pods_of_one_profile_share_its_image(self, runpod_home: Path) -> None:
        first = self._pod(runpod_home, "venv-python")
        second = self._pod(runpod_home, "venv-python")
        try:
            out = [
                _raw_shell(h, k, b'echo "V=$VIRTUAL_ENV"; exit\n') for _, h, k in (first, second)
            ]
        finally:
            for provider, handle, _ in (first, second):
                provider.terminate(handle.pod_id)
        shared = {line for o in out for line in o.splitlines() if line.startswith("V=/")}
        assert len(shared) == 1, shared
        image_dir = Path(shared.pop()[2:].strip())
        assert (image_dir / "bin" / "python").exists()  # still there after both pods ended
