"""Deploy ``any_flow`` from this folder to a ``runpod`` work pool: the worker uploads the
folder to the pod (its code is local), verified.

    python examples/any-flow/deploy.py POOL
"""

from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow

HERE = Path(__file__).resolve().parent


def deploy(pool: str, name: str = "any-flow", **job_variables: object) -> str:
    """Create (or update) the deployment ``any-flow/<name>`` on ``pool``; returns its id."""
    source = flow.from_source(str(HERE), entrypoint="flow.py:any_flow")
    return str(
        source.deploy(
            name=name, work_pool_name=pool, job_variables=job_variables, print_next_steps=False
        )
    )  # type: ignore[union-attr]


if __name__ == "__main__":
    print(deploy(sys.argv[1] if len(sys.argv) > 1 else "gpu"))
