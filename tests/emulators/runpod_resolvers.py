"""The GraphQL root resolvers of the RunPod emulator (graphql-core calls
``root.<field>(info, **args)``); the state they act on is ``runpod_api.RunPodEmulator``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphql import GraphQLError

from prefect_runpod.blocks.runpod.errors import HOST_GPUS_BUSY_MESSAGE

if TYPE_CHECKING:
    from tests.emulators.runpod_api import RunPodEmulator

__all__ = ["Root"]


class Root:
    """Root resolvers (graphql-core calls ``root.<field>(info, **args)``)."""

    def __init__(self, emu: RunPodEmulator, scope: str | None = None) -> None:
        self.emu = emu
        self.scope = scope

    def myself(self, info: Any) -> dict[str, Any]:
        self.emu._maybe_something_wrong("myself")
        with self.emu._lock:
            self.emu._reconcile()
            pods = [self.emu.pod_dict(p) for p in self.emu.pods.values()]
        return {
            "id": "user_emulated",
            "pubKey": self.emu.pub_key,
            "pods": pods,
            "networkVolumes": [],
        }

    def pod(self, info: Any, input: dict[str, Any] | None = None) -> dict[str, Any] | None:
        self.emu._maybe_something_wrong("pod")
        with self.emu._lock:
            self.emu._reconcile()
            pod_id = (input or {}).get("podId", "")
            if self.scope is not None and self.scope != pod_id:
                raise GraphQLError("Unauthorized: a pod's key acts on its own pod only")
            pod = self.emu.pods.get(pod_id)
            return self.emu.pod_dict(pod) if pod else None

    def gpuTypes(self, info: Any, input: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        self.emu._maybe_something_wrong("gpuTypes")
        wanted = (input or {}).get("id")
        out = []
        for gpu_id, gpu in self.emu.gpu_types.items():
            if wanted is not None and wanted != gpu_id:
                continue
            low = min(gpu["securePrice"], gpu["communityPrice"])
            out.append(
                {
                    **gpu,
                    "id": gpu_id,
                    "manufacturer": "Nvidia",
                    "cudaCores": 0,
                    "maxGpuCount": 8,
                    "secureCloud": True,
                    "communityCloud": True,
                    "lowestPrice": lambda info, input=None, low=low: {
                        "minimumBidPrice": round(low * 0.6, 3),
                        "uninterruptablePrice": low,
                    },
                }
            )
        return out

    def podFindAndDeployOnDemand(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        return self.emu.deploy(input)

    def podTerminate(self, info: Any, input: dict[str, Any]) -> None:
        return self.emu.terminate(input["podId"], self.scope)

    def podStop(self, info: Any, input: dict[str, Any]) -> dict[str, Any] | None:
        with self.emu._lock:
            if self.scope is not None and self.scope != input["podId"]:
                raise GraphQLError("Unauthorized: a pod's key acts on its own pod only")
            pod = self.emu.pods.get(input["podId"])
            if pod is None:
                raise GraphQLError("pod not found")
            pod.status = "EXITED"
            return self.emu.pod_dict(pod)

    def podResume(self, info: Any, input: dict[str, Any]) -> dict[str, Any] | None:
        with self.emu._lock:
            pod = self.emu.pods.get(input["podId"])
            if pod is None:
                raise GraphQLError("pod not found")
            if self.emu.faults.resume_gpus_busy:
                raise GraphQLError(HOST_GPUS_BUSY_MESSAGE)
            pod.status = "RUNNING"
            return self.emu.pod_dict(pod)

    def updateUserSettings(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        with self.emu._lock:
            self.emu.pub_key = input.get("pubKey") or ""
            return {"id": "user_emulated", "pubKey": self.emu.pub_key}
