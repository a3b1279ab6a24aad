"""The local pod, the embedded default: a loopback SSH server in a scratch workspace that
behaves like RunPod's gateway (or a direct-TCP sshd).

- ``provider``  ``LocalPodProvider`` (create / wait_ready / find / list / terminate) and
  the ``LocalPod`` block
- ``spawn``     a new pod: the request checked, its directory laid out, its daemon started
- ``daemon``    one process per pod serving SSH (asyncssh); started in its own session
- ``sessions``  one SSH session of a pod: its bash on a pty (or pipes), bridged to the channel
- ``registry``  the on-disk registry any process lists, finds and terminates pods by
- ``images``    image profiles: the login environment of real images (rc text, env, an
  image Python), built once per pod home
- ``tiny_wheels`` stand-in torch / transformers wheels for image Pythons and test indexes

Names load lazily: the daemon imports ``registry`` alone and stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_runpod.blocks import lazy_exports

if TYPE_CHECKING:  # the same names, typed (PEP 562's __getattr__ hides them)
    from prefect_runpod.blocks.local_pod.provider import (
        LocalPod,
        LocalPodProvider,
        base_python,
        default_home,
    )

__all__ = ["LocalPod", "LocalPodProvider", "base_python", "default_home"]

__getattr__, __dir__ = lazy_exports(__name__, {name: f"{__name__}.provider" for name in __all__})
