"""How ``RunPodProvider.create`` places a pod: one GPU type, one cloud and at most one
data centre per create (as REST v2 places them; the failover over the spec's options is
ours), keyed on RunPod's answers as ``runpod.errors`` classifies them.

- capacity → the next option; over the price cap → skipped;
- 5xx, or the network before the request went out → backoff (tenacity), after looking
  for a pod of that name first (the failed call may have created one);
- the answer lost after the request went out → resolved by reading the list by name
  until the pod shows (RunPod lists a new pod late) — never by creating again;
- ``not enough free GPUs on the host`` → a fresh pod; a refused key or request → stop.

No create carries a server-side deadline: RunPod never acted on GraphQL's
``terminateAfter`` and REST v2 has none (docs/architecture.md#termination-layers).
``PodPlacement`` is the create half of the provider (a mixin): the attributes it reads
are the provider's.
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prefect_runpod.blocks.exceptions import CapacityError, ProviderTransientError, SpecError
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import LIFETIME_ENV, PodCause, PodRequest
from prefect_runpod.blocks.runpod.api import PodCreate, PodRecord, RunPodApi
from prefect_runpod.blocks.runpod.blocks import (
    RunPodPodSpec,
    merge_cuda_versions,
    validate_env,
    validate_gpu_type_id,
    validate_pod_name,
)
from prefect_runpod.blocks.runpod.catalog import CloudType, GpuAvailability
from prefect_runpod.blocks.runpod.errors import (
    FailoverAction,
    classify_exception,
    to_provider_error,
)
from prefect_runpod.blocks.runpod.lifecycle import status_from_pod
from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey, normalise_public_key
from prefect_runpod.blocks.runpod.v2_models import CreatePodRequest
from prefect_runpod.blocks.validation.parameters import DEFAULT_TERMINATE_TIMEOUT_SECONDS

if TYPE_CHECKING:
    from tenacity import Retrying

    from prefect_runpod.blocks.provider import TerminateResult

__all__ = ["PodPlacement", "Retry"]

logger = logging.getLogger("prefect_runpod.runpod")


class Retry(Exception):
    """A create attempt failed in a way worth repeating after a backoff."""

    def __init__(self, classified: Any) -> None:
        super().__init__(classified.message)
        self.classified = classified


class PodPlacement:
    """The create half of ``RunPodProvider`` (see the module docstring)."""

    spec: RunPodPodSpec
    ssh_key: RunPodSSHKey
    attempts: list[str]
    poll_interval_seconds: float
    create_resolve_seconds: float
    _api: RunPodApi
    _sleep: Callable[[float], None]

    if TYPE_CHECKING:

        def _retrying(self) -> Retrying: ...
        def _call(
            self, what: str, fn: Callable[..., Any], *args: Any, pod_id: str | None = None
        ) -> Any: ...
        def _find_record(self, name: str) -> PodRecord | None: ...
        def _handle(
            self,
            pod: PodRecord,
            *,
            gpu_type: str | None = None,
            price: float | None = None,
            lifetime: float | None = None,
        ) -> PodHandle: ...
        def terminate(
            self, pod_id: str, timeout_seconds: float = DEFAULT_TERMINATE_TIMEOUT_SECONDS
        ) -> TerminateResult: ...
        def ensure_account_key(self) -> bool: ...

    def _template(self, request: PodRequest, name: str) -> dict[str, Any]:
        """The validated fields every create of this request shares."""
        spec = self.spec
        validate_pod_name(name)
        public_key = normalise_public_key(request.public_key or self.ssh_key.get_public_key())
        env = {**spec.env, **request.env, "PUBLIC_KEY": public_key}
        if request.deadman is not None:
            env[LIFETIME_ENV] = f"{request.deadman.lifetime_seconds:g}"
        validate_env(env)
        cuda = merge_cuda_versions(spec.allowed_cuda_versions, request.allowed_cuda_versions)
        for gpu in spec.gpu_type_ids:
            validate_gpu_type_id(gpu)
        return {
            "name": name,
            "image": spec.image_name,
            "gpu_count": spec.gpu_count,
            "env": env,
            "ports": [p for p in spec.ports.split(",") if p],
            "container_disk_gb": spec.container_disk_gb,
            "volume_gb": spec.volume_gb,
            "volume_mount_path": spec.volume_mount_path,
            "cuda_versions": cuda,
            "cuda_floor": bool(cuda) and not spec.allowed_cuda_versions,
            "public_ip": spec.support_public_ip,
        }

    def _clouds(self) -> list[CloudType]:
        """The clouds to try: the spec's; ``ALL`` is one option on GraphQL, SECURE then
        COMMUNITY on REST v2 (one cloud per create)."""
        if self.spec.cloud_type == "ALL" and self._api.name == "v2":
            return ["SECURE", "COMMUNITY"]
        return [self.spec.cloud_type]

    def gpu_prices(self) -> dict[str, float | None]:
        """The spec's GPU types in failover order, each with its price in USD/h for the
        spec's cloud type and GPU count (RunPod's catalog: per-cloud list prices; for
        ALL the lowest; never a bid price), None when RunPod gives none.

        Raises:
            SpecError: an unknown GPU type id (with the closest ids RunPod knows).
            ProviderAuthError / ProviderTransientError: as for any call.
        """
        offers = self._offers()
        cloud, count = self.spec.cloud_type, self.spec.gpu_count
        return {gpu: offers[gpu].usd_per_hr(cloud, count) for gpu in self.spec.gpu_type_ids}

    def gpu_offers(self) -> dict[str, GpuAvailability]:
        """The spec's GPU types in failover order as RunPod's catalog has them (prices per
        GPU-hour, availability, data centres, CUDA versions): one catalog read over
        REST v2; over GraphQL the SDK's prices with REST v2's availability beside them
        when it answers.

        Raises:
            SpecError: an unknown GPU type id (with the closest ids RunPod knows).
            ProviderAuthError / ProviderTransientError: as for any call.
        """
        offers = self._offers()
        if self._api.name != "v2":
            try:
                catalog = self._api.gpu_catalog()
            except Exception:  # availability is a hint beside the price
                catalog = {}
            for gpu, offer in offers.items():
                seen = catalog.get(gpu)
                if seen is not None:
                    offers[gpu] = offer.model_copy(
                        update={
                            "availability": seen.availability,
                            "data_centers": seen.data_centers,
                            "cuda_versions": seen.cuda_versions,
                        }
                    )
        return {gpu: offers[gpu] for gpu in self.spec.gpu_type_ids}

    def check_placement(self, cuda_versions: list[str], volume_data_center: str | None) -> str:
        """Refuse before renting what RunPod would refuse (or answer as if no machine were
        free) after the create: a GPU id not exactly in the catalog, a CUDA floor no host
        of any of the spec's GPU types reports (the catalog's ``cudaVersions``), a network
        volume outside the data centres asked for (a pod and its volume share one).

        Args:
            cuda_versions: the env plan's CUDA versions (its floor and above), or [].
            volume_data_center: the data centre of the network volume the run moves files
                through, or None.

        Returns:
            What was checked, in one line.

        Raises:
            SpecError: the first of those problems, with the fix; nothing was created.
            ProviderAuthError / ProviderTransientError: as for any call.
        """
        offers = self.gpu_offers()
        cuda = merge_cuda_versions(self.spec.allowed_cuda_versions, cuda_versions)
        floor = bool(cuda) and not self.spec.allowed_cuda_versions
        want = f"CUDA {_lowest(cuda)} or newer" if floor else f"CUDA {', '.join(cuda)}"
        misfits = [
            f"{gpu} (hosts on CUDA {', '.join(sorted(offer.cuda_versions, key=_version))})"
            for gpu, offer in offers.items()
            if cuda and offer.cuda_versions and not _fits(list(offer.cuda_versions), cuda, floor)
        ]
        if cuda and len(misfits) == len(offers):
            raise SpecError(
                f"no GPU type of the pod spec has hosts on {want}, which the bundle's "
                f"requirements need: {'; '.join(misfits)}. Pick a GPU type whose hosts have "
                "it (prefect-runpod plan lists them), or relax the requirements — nothing "
                "was created"
            )
        centres = list(self.spec.data_center_ids)
        if volume_data_center is not None and volume_data_center not in centres:
            asked = f"data centres {', '.join(centres)}" if centres else "any data centre"
            raise SpecError(
                f"the network volume lives in {volume_data_center}, but the pod spec asks "
                f"for {asked}: a pod reaches its volume only in the same data centre. Put "
                f"{volume_data_center} in the pod spec's data_center_ids — nothing was created"
            )
        line = f"{len(offers)} GPU type(s) known to RunPod"
        if cuda:
            line += f"; hosts with {want}" + (f" (not {'; '.join(misfits)})" if misfits else "")
        if volume_data_center is not None:
            line += f"; the network volume's data centre {volume_data_center} is asked for"
        return line

    def _offers(self) -> dict[str, GpuAvailability]:
        ids, count = list(self.spec.gpu_type_ids), self.spec.gpu_count
        offers = self._call("look up GPU types", self._api.gpu_offers, ids, count)
        missing = [gpu for gpu in ids if gpu not in offers]
        if missing:
            raise SpecError(
                f"unknown GPU type id {missing[0]!r} ({self._did_you_mean(missing[0])}); "
                "fix gpu_type_ids (--gpu-type, or the pod spec's): RunPod answers an inexact "
                "id as if no machine were free — nothing was created"
            )
        return offers

    def _did_you_mean(self, gpu_id: str) -> str:
        """The catalog's ids holding every word of ``gpu_id`` (``NVIDIA RTX 4090`` →
        ``NVIDIA GeForce RTX 4090``), else the closest by spelling (REST v2's catalog,
        whichever API places pods)."""
        unknown = "RunPod does not know it"
        try:
            known = list(self._api.gpu_catalog())
        except Exception:  # the hint is a courtesy: never in the error's way
            return unknown
        words = set(gpu_id.lower().split())
        close = [k for k in known if words <= set(k.lower().split())][:2]
        close = close or difflib.get_close_matches(gpu_id, known, n=2, cutoff=0.6)
        return f"did you mean {' or '.join(close)}?" if close else unknown

    def create(self, request: PodRequest, name: str) -> PodHandle:
        """Rent a pod named ``name`` (or adopt the live one of that name).

        Args:
            request: the run's public key, extra env and CUDA floor.
            name: ``<prefix>-<flow_run_id>``.

        Returns:
            The handle as soon as the pod id exists (not yet ready).

        Raises:
            SpecError: bad name/env/GPU id/CUDA list/volume (before any request), an
                unknown GPU id, or the account lacks our SSH key and may not add it.
            ProviderAuthError: the API key was refused (HTTP 401/403); nothing created.
            CapacityError: no GPU type/cloud/data centre had capacity within the price cap.
            ProviderTransientError: RunPod kept failing after the retries, or a create's
                answer was lost and no pod of its name appeared (never created again).
        """
        template = self._template(request, name)
        lifetime = request.deadman.lifetime_seconds if request.deadman is not None else None
        if self._api.name == "v2":  # what v2 cannot express fails before any request
            first = PodCreate(
                **template, gpu_type_id=self.spec.gpu_type_ids[0], cloud=self._clouds()[0]
            )
            CreatePodRequest.from_create(first)
        adopted = self._adopt_or_replace(name)
        if adopted is not None:
            return adopted
        offers = self._offers()
        self.ensure_account_key()
        cap = self.spec.max_usd_per_hour
        for gpu_id in self.spec.gpu_type_ids:
            for cloud in self._clouds():
                price = offers[gpu_id].usd_per_hr(cloud, self.spec.gpu_count)
                if cap is not None and price is not None and price > cap:
                    self.attempts.append(
                        f"{gpu_id}/{cloud}: over price {price:.3f} > {cap:.3f} USD/h"
                    )
                    continue
                centres: list[str | None] = list(self.spec.data_center_ids) or [None]
                for dc in centres:
                    create = PodCreate(
                        **template, gpu_type_id=gpu_id, cloud=cloud, data_center_id=dc
                    )
                    label = f"{gpu_id}/{cloud}" + (f"/{dc}" if dc else "")
                    handle = self._deploy_option(create, label, price, lifetime)
                    if handle is not None:
                        return handle
        raise CapacityError(
            f"create pod {name}: no capacity on any option ({'; '.join(self.attempts)}). "
            "Add GPU types, data centers or cloud ALL to the pod spec, raise max_usd_per_hour, "
            "or try again later. Nothing is billing.",
            attempts=self.attempts,
        )

    def _adopt_or_replace(self, name: str) -> PodHandle | None:
        """The live pod named ``name`` to adopt (a retried task never rents twice), or
        None. A pod of that name that stopped (EXITED) or lost its host is terminated
        (confirmed) and None returned, so the same attempt creates a fresh pod."""
        pod = self._find_record(name)
        if pod is None:
            return None
        status = status_from_pod(pod.id, pod)
        if status.cause in (PodCause.EXITED, PodCause.HOST_LOST):
            self.terminate(pod.id)
            self.attempts.append(f"replaced {pod.id} ({status.provider_status}): terminated")
            logger.info("%s: %s; terminated, creating a fresh pod", pod.id, status.provider_status)
            return None
        adopted = self._handle(pod)
        self.attempts.append(f"adopted {adopted.pod_id} ({name})")
        logger.info("%s: adopted existing pod %s", adopted.pod_id, name)
        return adopted

    def _deploy_option(
        self, create: PodCreate, label: str, price: float | None, lifetime: float | None
    ) -> PodHandle | None:
        """Deploy on one GPU type/cloud/data centre; None means "no capacity, next option"."""
        name = create.name
        state = {"tries": 0, "recreate": False}

        def once() -> PodHandle | None:
            state["tries"] += 1
            if state["tries"] > 1:
                existing = self._find_record(name)  # the failed call may have created it
                if existing is not None and not state["recreate"]:
                    self.attempts.append(f"{label}: adopted {existing.id} after retry")
                    return self._handle(existing)
                if existing is not None:
                    self.terminate(existing.id)
            try:
                record = self._api.create_pod(create)
            except Exception as exc:
                classified = classify_exception(exc)
                self.attempts.append(f"{label}: {classified.kind.value}")
                logger.info("create %s on %s: %s", name, label, classified.message)
                if classified.action is FailoverAction.NEXT_OPTION:
                    return None
                if classified.action is FailoverAction.RESOLVE:
                    return self._resolve_lost_create(name, label, price, lifetime, classified)
                if classified.action in (FailoverAction.RETRY, FailoverAction.RECREATE):
                    state["recreate"] = classified.action is FailoverAction.RECREATE
                    raise Retry(classified) from exc
                raise to_provider_error(
                    classified, what=f"create pod {name}", attempts=self.attempts
                ) from exc
            self.attempts.append(f"{label}: created {record.id}")
            logger.info("%s: created %s on %s", record.id, name, label)
            return self._handle(record, gpu_type=create.gpu_type_id, price=price, lifetime=lifetime)

        try:
            return self._retrying()(once)
        except Retry as exc:
            if exc.classified.action is FailoverAction.RECREATE:
                return None
            raise to_provider_error(
                exc.classified, what=f"create pod {name}", attempts=self.attempts
            ) from exc

    def _resolve_lost_create(
        self, name: str, label: str, price: float | None, lifetime: float | None, why: Any
    ) -> PodHandle:
        """A create whose answer was lost may have rented a pod: read the list by name
        until it shows (RunPod lists a new pod with a delay) or ``create_resolve_seconds``
        pass. Never creates again.

        Raises:
            ProviderTransientError: no pod of that name appeared in time.
        """
        deadline = time.monotonic() + self.create_resolve_seconds
        while True:
            found = self._find_record(name)
            if found is not None:
                self.attempts.append(f"{label}: answer lost; found {found.id} by name")
                logger.info("create %s: answer lost, found %s in the list", name, found.id)
                return self._handle(found, price=price, lifetime=lifetime)
            if time.monotonic() >= deadline:
                raise ProviderTransientError(
                    f"create pod {name}: RunPod's answer was lost ({why.message}) and no pod of "
                    f"that name appeared within {self.create_resolve_seconds:.0f} s; it was not "
                    "created again. If one appears later the reaper ends it (`prefect-runpod "
                    "pods` lists it); run again to retry.",
                    pod_id=None,
                )
            self._sleep(self.poll_interval_seconds)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _lowest(versions: list[str]) -> str:
    return min(versions, key=_version)


def _fits(hosts: list[str], wanted: list[str], floor: bool) -> bool:
    """Whether a GPU type with hosts on ``hosts`` CUDA versions meets ``wanted``: any host
    at or above its lowest (a floor, ``minCudaVersion``), or any host in the set."""
    if floor:
        return any(_version(h) >= _version(_lowest(wanted)) for h in hosts)
    return any(h in wanted for h in hosts)
