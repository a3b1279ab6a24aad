"""The local pod's daemon stays light: stdlib, asyncssh and the registry; it shares the
gateway's refusal text with the console without importing the console."""

from __future__ import annotations

import json
import subprocess
import sys

from prefect_runpod.blocks import exceptions
from prefect_runpod.blocks.local_pod import sessions


def test_daemon_imports_no_prefect_paramiko_or_pydantic() -> None:
    code = (
        "import json, sys; import prefect_runpod.blocks.local_pod.daemon; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout))
    assert not loaded & {"prefect", "paramiko", "pydantic", "boto3", "runpod"}
    assert "asyncssh" in loaded


def test_daemon_writes_the_one_gateway_refusal() -> None:
    assert sessions.GATEWAY_PTY_ERROR is exceptions.GATEWAY_PTY_ERROR
    assert exceptions.GATEWAY_PTY_ERROR == "Error: Your SSH client doesn't support PTY"
