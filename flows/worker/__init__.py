"""The ``runpod`` work-pool type: a Prefect worker that runs any flow run on its own pod
(docs/worker.md).

- ``config``   the pool's job variables and a flow run's job configuration
- ``api_url``  which Prefect API the pod is handed, and whether a RunPod pod can reach it
- ``pod_run``  one flow run on one pod: rent, code, Python, launch, follow, end
- ``worker``   ``RunPodWorker`` (``type = "runpod"``), ``run`` and ``kill_infrastructure``

Prefect finds the worker through this package's ``prefect.collections`` entry point,
which imports it: ``prefect worker start --pool POOL --type runpod``.
"""

from __future__ import annotations

from prefect_runpod.flows.worker.config import RunPodJobConfiguration, RunPodJobVariables
from prefect_runpod.flows.worker.worker import RunPodWorker, RunPodWorkerResult

__all__ = [
    "RunPodJobConfiguration",
    "RunPodJobVariables",
    "RunPodWorker",
    "RunPodWorkerResult",
]
