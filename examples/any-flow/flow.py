"""An ordinary Prefect flow that knows nothing of pods: it computes something, writes a
file, logs and returns a value. Deployed to a ``runpod`` work pool it runs on its own pod
(docs/worker.md):

    prefect work-pool create gpu --type runpod
    prefect worker start --pool gpu --type runpod
    python examples/any-flow/deploy.py gpu && prefect deployment run any-flow/any-flow
"""

from __future__ import annotations

import hashlib
import platform
import time
from pathlib import Path

from prefect import flow, get_run_logger, task


@task
def digest_rounds(seed: str, rounds: int) -> str:
    """``rounds`` chained SHA-256 digests of ``seed`` (hex): some CPU work."""
    value = seed.encode()
    for _ in range(rounds):
        value = hashlib.sha256(value).digest()
    return value.hex()


@flow(name="any-flow")
def any_flow(
    seed: str = "prefect", rounds: int = 1000, out: str = "result.txt", linger_seconds: float = 0.0
) -> dict[str, str]:
    """Compute ``digest_rounds(seed, rounds)``, write it to ``out``, log where it ran and
    return it with the host's name.

    Args:
        seed: what to hash.
        rounds: how many times.
        out: the file written (relative to the working directory).
        linger_seconds: wait this long before returning (to cancel a run while it runs).

    Returns:
        ``{"digest": hex, "host": node name, "file": absolute path of out}``.
    """
    logger = get_run_logger()
    digest = digest_rounds(seed, rounds)
    path = Path(out).resolve()
    path.write_text(digest + "\n")
    logger.info("digest %s written to %s on %s", digest[:16], path, platform.node())
    deadline = time.monotonic() + linger_seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)
    return {"digest": digest, "host": platform.node(), "file": str(path)}
