"""The RunPod emulator's state: its GPU catalogue, the faults a test can set, the pods it
holds and how each one left (see ``runpod_api``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_GPU_TYPES", "EmulatedPod", "Faults", "LogEvent", "PodEnd"]

DEFAULT_GPU_TYPES: dict[str, dict[str, Any]] = {
    "NVIDIA GeForce RTX 3090": {
        "displayName": "RTX 3090",
        "memoryInGb": 24,
        "securePrice": 0.22,
        "communityPrice": 0.22,
    },
    "NVIDIA GeForce RTX 4090": {
        "displayName": "RTX 4090",
        "memoryInGb": 24,
        "securePrice": 0.69,
        "communityPrice": 0.34,
    },
    "NVIDIA RTX A5000": {
        "displayName": "RTX A5000",
        "memoryInGb": 24,
        "securePrice": 0.27,
        "communityPrice": 0.16,
    },
    "NVIDIA A100 80GB PCIe": {
        "displayName": "A100 PCIe",
        "memoryInGb": 80,
        "securePrice": 1.64,
        "communityPrice": 1.19,
    },
}


@dataclass
class Faults:
    """Faults to inject; each counter is consumed as requests arrive.

    Attributes:
        capacity_first_n: the next N creates answer RunPod's capacity error.
        capacity_gpu_types: creates for these GPU type ids always answer it.
        create_errors: messages the next creates answer, one each (any RunPod text).
        something_wrong: op name (or ``*``) → N answers of ``Something went wrong…``
            (``INTERNAL_SERVER_ERROR``, HTTP 200).
        http_5xx: op name (or ``*``) → N answers of HTTP 502 with an HTML body.
        slow_boot_seconds: ``runtime`` stays null this long after create.
        terminate_fail_n: the next N ``podTerminate`` answer ``Something went wrong…``
            (a huge N: the terminate API is down for good).
        terminate_errors: messages the next ``podTerminate`` calls answer, one each (a
            GraphQL validation error, say: an answer retrying cannot change).
        terminate_ignored: ``podTerminate`` answers OK but the pod stays (a stuck host).
        resume_gpus_busy: ``podResume`` answers "not enough free GPUs on the host".
        drop_next_connection_after_bytes: when > 0, the gateway cuts the first SSH
            connection (accepted from now on) that has carried this many bytes, both
            directions together: a dropped link at a chosen point, by volume, never by
            time. Shorter connections (a host-key probe) pass untouched; one cut, then
            the fault is spent (reset to 0).
        refuse_connections_until: while ``time.monotonic()`` is before this, the
            gateway closes every connection it accepts at once, as a restarting proxy
            does (set it with ``RunPodEmulator.refuse_connections_for``); each one is
            counted in ``RunPodEmulator.refused_connections``.
        refuse_next_connections: the gateway closes the next N connections it accepts
            at once, then serves again (set it with
            ``RunPodEmulator.refuse_next_connections``): an outage measured in refused
            connections, never in time, so a slow client meets it all the same.
        pod_faults: ``PREFECT_RUNPOD_POD_FAULTS`` inside pods created from now on
            (``runpodctl:x509``: their ``runpodctl`` fails as without CA certificates).
        pod_ca_bundle: pods created from now on find a CA bundle that trusts this API's
            HTTPS address; off, their TLS verification fails (x509) whatever they try.
        empty_answers: op name (or ``*``) → N answers of HTTP 200 ``{}``: neither
            ``data`` nor ``errors`` (the SDK's helpers then raise ``KeyError``).

    REST v2 (``http_5xx``, ``something_wrong``, the capacity and terminate faults apply
    there too, keyed by v2's operation ids: ``createPod``, ``getPod``, ``listPods``,
    ``deletePod``, ``getSshKeys``, ``updateSshKeys``, ``listGpuTypes``,
    ``listPodBilling``, ``getPodLogs``):

    Attributes:
        list_delay_seconds: a pod created from now on shows in ``GET /v2/pods`` only this
            long after its create answered (RunPod lists new pods late: skypilot #10171).
        create_answer_lost: the next N creates make the pod, then drop the connection
            without answering (a create whose answer is lost).
        ssh_keys_barrier: the next N ``GET /v2/account/ssh-keys`` wait for each other (up
            to 120 s, a hang guard), so N writers read the same list; then their N ``PUT``s wait for each
            other and land together, in arrival order, before any is answered: N adders
            "at the same moment", by count, never by timing.
        log_cut_after_events: the next log stream is cut (no closing chunk) after this
            many events; spent once it fires.
        gpu_count: pods created from now on get this many GPUs whatever the create
            asked (0: as asked), as a host that hands a re-rented pod another
            ``gpuCount`` would; their price is that count's.
        boot_failure: pods created from now on fail to boot: ``image_pull`` (the image
            cannot be pulled: the pod stays STARTING with no runtime) or ``no_ssh`` (the
            container runs, but no SSH endpoint ever appears); either way their ``system``
            log says why, in the emulator's own words (RunPod's exact lines are not
            documented).
    """

    capacity_first_n: int = 0
    capacity_gpu_types: set[str] = field(default_factory=set)
    create_errors: list[str] = field(default_factory=list)
    something_wrong: dict[str, int] = field(default_factory=dict)
    http_5xx: dict[str, int] = field(default_factory=dict)
    slow_boot_seconds: float = 0.0
    terminate_fail_n: int = 0
    terminate_errors: list[str] = field(default_factory=list)
    terminate_ignored: bool = False
    resume_gpus_busy: bool = False
    drop_next_connection_after_bytes: int = 0
    refuse_connections_until: float = 0.0
    refuse_next_connections: int = 0
    pod_faults: str = ""
    pod_ca_bundle: bool = True
    empty_answers: dict[str, int] = field(default_factory=dict)
    list_delay_seconds: float = 0.0
    create_answer_lost: int = 0
    ssh_keys_barrier: int = 0
    log_cut_after_events: int = 0
    boot_failure: str = ""
    gpu_count: int = 0

    def take(self, table: dict[str, int], op: str) -> bool:
        """Consume one count for ``op`` (or ``*``); True when a fault fires."""
        for key in (op, "*"):
            if table.get(key, 0) > 0:
                table[key] -= 1
                return True
        return False


@dataclass
class LogEvent:
    """One line of a pod's log stream: ``id`` is its RFC 3339 timestamp (unique)."""

    id: str
    source: str
    line: str


@dataclass
class EmulatedPod:
    """One pod the emulator holds (``spec`` is its GraphQL container fields; ``v2`` its
    REST v2 ones: image, ports, disk, mounts, cloud, data centre, GPU count)."""

    pod_id: str
    name: str
    pod_host_id: str
    gpu_type_id: str
    cost_per_hr: float
    spec: dict[str, Any]
    env: dict[str, str]
    created: float
    port: int
    workdir: str
    pod_key: str = ""
    status: str = "RUNNING"
    v2: dict[str, Any] = field(default_factory=dict)
    listed_at: float = 0.0
    logs: list[LogEvent] = field(default_factory=list)
    log_offset: int = 0
    boot_failure: str = ""
    hollow: bool = False
    """A pod with no local pod behind it (``RunPodEmulator.hollow_pod``): listed, read and
    terminated like any other, never reachable over SSH."""


@dataclass
class PodEnd:
    """How a pod left the emulator.

    Attributes:
        pod_id: the pod.
        how: ``podTerminate`` (the account's key), ``podTerminate (pod key)`` (the pod's
            own key, from inside), ``removed-from-inside`` (its local pod ended on its
            own: ``runpodctl pod delete $RUNPOD_POD_ID`` from the pod), ``DELETE
            /v2/pods`` / ``DELETE /v2/pods (pod key)`` (REST v2) or ``vanished``
            (``vanish``).
        at: when the pod ended (billing stopped), epoch seconds.
    """

    pod_id: str
    how: str
    at: float
