"""One pod attempt of a run: the record the run report, the cost record and the stage
ledger share (docs/architecture.md#the-runs-attempts).

A run is a sequence of pod attempts: today every run has at most one, and a run that
resumes on a new pod after losing one will have more. Each attempt says which pod it
was, where, when it was created, ready and ended, who ended it and why, what it billed
(our estimate and the provider's own bill), and — once runs resume — the checkpoint it
resumed from and the training steps the previous pod took with it. The single-pod
fields of ``RunReport`` and ``CostRecord`` (``pod_id``, ``pod_end``, ``usd``…) are
views of the last attempt (``AttemptField`` on a ``LastAttemptView``), so nothing a
user reads is renamed.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Generic, TypeVar, overload

from pydantic import (
    BaseModel,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from prefect_runpod.blocks.costs import round_usd, settle
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import EndedBy, PodEnd
from prefect_runpod.blocks.validation.parameters import DEFAULT_PROVIDER

__all__ = ["AttemptField", "LastAttemptView", "PodAttempt", "attempt_line", "gpu_count_text"]

T = TypeVar("T")


class PodAttempt(BaseModel):
    """One pod a run rented (or tried to), and what became of it.

    Attributes:
        number: 1 for the run's first pod, 2 for the pod it resumed on, …
        pod_id / pod_name: the pod (``pod_id`` None while none was created).
        provider: the provider's name.
        gpu_type: the GPU type rented (``cpu`` for a local pod), ``-`` when not known.
        gpu_count: how many GPUs the pod had (0 for a local pod); None when not known.
        data_center: where it ran, when the provider says; None otherwise.
        cost_per_hr: its price, USD/h.
        created_at: when the provider returned its id (billing starts), UTC.
        ready_at: when its SSH answered, UTC; None until then.
        end: how and when it ended (``ended_at``, ``ended_by`` and ``cause`` are its
            parts); None while the run has not ended it.
        billed_seconds / usd: our estimate, create → confirmed end (to now while it may
            still bill).
        provider_usd / provider_billed_seconds: the provider's own bill (RunPod's
            amount), once its billing has the pod's records; the records' ``runpod_usd``.
        provider_gpu_usd / provider_cpu_usd / provider_disk_usd: the bill's parts when
            the provider splits it (RunPod's v2 GPU, CPU and disk amounts).
        difference_usd: ``usd - provider_usd``, once that is known.
        billing_note: why the provider's bill is missing, when it is.
        handle: the pod as the run reached it (endpoints, host keys); the run report's.
        ssh_command: how a person gets into the pod while it runs.
        resumed_from: the checkpoint this attempt resumed training from; None for a
            fresh start.
        steps_lost: training steps done on the previous pod after its last checkpoint
            (redone here); None for a fresh start.
        carried_from: the flow run that rented this pod, when the attempt was carried
            into this run's record from that run's (``finetune --resume-from RUN_ID``):
            shown here, counted in that run's totals; None for the run's own pod.
    """

    number: int = Field(default=1, ge=1)
    pod_id: str | None = None
    pod_name: str = ""
    provider: str = DEFAULT_PROVIDER
    gpu_type: str = "-"
    gpu_count: int | None = None
    data_center: str | None = None
    cost_per_hr: float = 0.0
    created_at: datetime | None = None
    ready_at: datetime | None = None
    end: PodEnd | None = None
    billed_seconds: float = 0.0
    usd: float = 0.0
    provider_usd: float | None = None
    provider_billed_seconds: float | None = None
    provider_gpu_usd: float | None = None
    provider_cpu_usd: float | None = None
    provider_disk_usd: float | None = None
    difference_usd: float | None = None
    billing_note: str = ""
    handle: PodHandle | None = None
    ssh_command: str | None = None
    resumed_from: str | None = None
    steps_lost: int | None = None
    carried_from: str | None = None

    @classmethod
    def of(cls, handle: PodHandle, number: int = 1, **more: Any) -> PodAttempt:
        """The attempt of a pod just created (its id, name, provider, GPU, price and
        create time from ``handle``, which it keeps unless ``more`` says otherwise)."""
        fields: dict[str, Any] = {
            "number": number,
            "pod_id": handle.pod_id,
            "pod_name": handle.name,
            "provider": handle.provider,
            "gpu_type": handle.gpu_type,
            "gpu_count": handle.gpu_count,
            "cost_per_hr": handle.cost_per_hr,
            "created_at": handle.created_at,
            "handle": handle,
        }
        return cls(**(fields | more))

    @property
    def ended_at(self) -> datetime | None:
        """When billing ended (the confirmed end), else None."""
        return self.end.ended_at if self.end is not None else None

    @property
    def ended_by(self) -> EndedBy | None:
        """Who ended the pod, when the run knows; None before its end."""
        return self.end.ended_by if self.end is not None else None

    @property
    def cause(self) -> str | None:
        """The liveness cause when the pod was lost under the run, else None."""
        return self.end.cause if self.end is not None else None

    @property
    def confirmed(self) -> bool:
        """True once the provider confirmed the pod gone (or no pod was created)."""
        return self.pod_id is None or (self.end is not None and self.end.confirmed)

    def settle(self, now: datetime) -> None:
        """Recompute our estimate: create → the confirmed end (or ``now`` while the pod
        may still be billing), and the difference with the provider's bill."""
        if self.created_at is None:
            return
        end = self.end.ended_at if self.end is not None and self.end.confirmed else None
        bill = settle(self.cost_per_hr, self.created_at, end or now)
        self.billed_seconds, self.usd = bill.billed_seconds, bill.usd
        if self.provider_usd is not None:
            self.difference_usd = round_usd(self.usd - self.provider_usd)


def gpu_count_text(count: int) -> str:
    """A pod's GPU count in words: ``no GPU``, ``1 GPU``, ``2 GPUs``. Pure."""
    return "no GPU" if count == 0 else f"{count} GPU" + ("s" if count > 1 else "")


def attempt_line(a: PodAttempt) -> str:
    """One pod attempt in words: pod, GPU type and count (when known), who ended it and
    why, billed seconds and USD, the checkpoint it resumed from with the steps lost, and
    the run it was carried from (``; carried from run …``), e.g. ``abc (NVIDIA A40, 2 GPUs) ended by flow (host_lost), 9.8 s billed, 0.000980
    USD``."""
    end = a.end
    how = (
        f"ended by {end.ended_by.value}" + (f" ({end.cause})" if end.cause else "")
        if end is not None and end.ended_by is not None
        else "not ended yet"
    )
    resumed = (
        f"; resumed from {a.resumed_from}, {a.steps_lost or 0} steps lost" if a.resumed_from else ""
    )
    gpus = f", {gpu_count_text(a.gpu_count)}" if a.gpu_count is not None else ""
    carried = f"; carried from run {a.carried_from}" if a.carried_from else ""
    return (
        f"{a.pod_id or '-'} ({a.gpu_type}{gpus}) {how}, {a.billed_seconds:.1f} s billed, "
        f"{a.usd:.6f} USD{resumed}{carried}"
    )


def _plain(value: Any, mode: str) -> Any:
    """A view's value as serialised data (``mode`` ``json`` or ``python``)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode=mode)
    if isinstance(value, datetime) and mode == "json":
        return value.isoformat()
    return value


class AttemptField(property, Generic[T]):
    """A single-pod field of a record: a view of its last attempt's ``field``. Reading
    gives that value (``default`` with no attempt yet, passed through ``shown`` when
    given), writing sets it (making the first attempt when there is none).

    Args:
        field: the ``PodAttempt`` field it shows.
        default: its value while the record has no attempt.
        shown: ``(record, value) -> value`` as read, when the record adds to it.
    """

    def __init__(
        self,
        field: str,
        default: T,
        shown: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        def read(record: LastAttemptView) -> T:
            value = getattr(record.attempts[-1], field) if record.attempts else default
            return shown(record, value) if shown is not None else value  # type: ignore[no-any-return]

        def write(record: LastAttemptView, value: T) -> None:
            setattr(record.last_attempt(), field, value)

        super().__init__(read, write, doc=f"The last attempt's ``{field}``.")
        self.field = field

    @overload  # type: ignore[override]
    def __get__(self, obj: None, owner: type | None = None) -> AttemptField[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        return super().__get__(obj, owner)

    def __set__(self, obj: Any, value: T) -> None:
        super().__set__(obj, value)


class LastAttemptView(BaseModel):
    """A record that holds a run's ``attempts``, whose single-pod fields
    (``AttemptField``) are views of the last attempt; serialising writes the views
    beside the attempts (so the keys a reader knew stay), and data written before runs
    had attempts (the single-pod fields alone) reads as one attempt."""

    attempts: list[PodAttempt] = Field(default_factory=list)

    @classmethod
    def views(cls) -> dict[str, AttemptField[Any]]:
        """Every single-pod field of the class, by the name a reader knows."""
        found: dict[str, AttemptField[Any]] = {}
        for klass in reversed(cls.__mro__):
            found |= {k: v for k, v in vars(klass).items() if isinstance(v, AttemptField)}
        return found

    def last_attempt(self) -> PodAttempt:
        """The last attempt, made (number 1) when the record has none yet."""
        if not self.attempts:
            self.attempts.append(PodAttempt(**self._first_attempt()))
        return self.attempts[-1]

    def attempt(self, number: int) -> PodAttempt | None:
        """The attempt numbered ``number``, or None."""
        return next((a for a in self.attempts if a.number == number), None)

    def _first_attempt(self) -> dict[str, Any]:
        """What a first attempt made by a write knows already (its provider, say)."""
        return {}

    @classmethod
    def _run_fields(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Attempt fields the run-level input knows (a subclass's own)."""
        return {}

    @model_validator(mode="before")
    @classmethod
    def _fold_single_pod(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        views = cls.views()
        data = dict(data)
        given = {k: data.pop(k) for k in list(data) if k in views}
        if "attempts" in data or not any(v is not None for v in given.values()):
            return data
        fields = {views[k].field: v for k, v in given.items()}
        data["attempts"] = [{**cls._run_fields({**data, **given}), **fields}]
        return data

    @model_serializer(mode="wrap")
    def _with_views(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        excluded = info.exclude or ()
        if isinstance(data, dict):
            for name in self.views():
                if name not in excluded:
                    data[name] = _plain(getattr(self, name), info.mode)
        return data
