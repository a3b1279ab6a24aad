"""The RunPod emulator's ledger, and its REST billing answers in both of RunPod's shapes.

**Billing rule (an assumption, to confirm on a real account).** The emulator bills each
pod from the moment its create answered to the moment it ended (terminate, the pod
removed from inside, its lease, a vanished host), to the millisecond, at the pod's
``costPerHr``, with no minimum and no rounding of the time; the amount is rounded to
1e-8 USD. It answers one record per pod, in the hour bucket of its create, and only
once ``lag_seconds`` have passed since the pod ended (or, for a running pod, up to
``lag_seconds`` ago). RunPod documents neither its rounding nor its lag; the figures it
answers may differ, which is why the run's record keeps RunPod's amount beside ours and
``prefect-runpod cost --reconcile`` fills RunPod's in later.

- REST v1 ``GET /v1/billing/pods`` → ``[{time, amount, timeBilledMs, diskSpaceBilledGb,
  podId, gpuTypeId}]`` (runpodctl 2.x ``internal/api/billing.go``);
- REST v2 ``GET /v2/billing/pods`` → ``{records: [{startTime, endTime, podId,
  totalAmount, gpuAmount, cpuAmount, diskAmount}], metadata: {totals}}``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["Ledger", "LedgerEntry"]


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class LedgerEntry:
    """One pod's billing.

    Attributes:
        pod_id / gpu_type_id: the pod.
        cost_per_hr: USD/h.
        created: when its create answered (epoch seconds).
        ended: when it ended (epoch seconds), None while it runs.
    """

    pod_id: str
    gpu_type_id: str
    cost_per_hr: float
    created: float
    ended: float | None = None

    def billed_ms(self, now: float) -> int:
        """Milliseconds billed by ``now``."""
        return max(
            0, round(((self.ended if self.ended is not None else now) - self.created) * 1000)
        )

    def usd(self, now: float) -> float:
        """USD billed by ``now`` (the emulator's rule, see the module docstring)."""
        return round(self.cost_per_hr * self.billed_ms(now) / 3_600_000, 8)


class Ledger:
    """Every pod the emulator billed.

    Args:
        lag_seconds: how long after the usage a record appears.
        clock: epoch seconds (the emulator's clock).
    """

    def __init__(self, lag_seconds: float = 0.0, clock: Any = time.time) -> None:
        self.entries: dict[str, LedgerEntry] = {}
        self.lag_seconds = lag_seconds
        self.clock = clock

    def open(self, pod_id: str, gpu_type_id: str, cost_per_hr: float, created: float) -> None:
        """Start billing a pod."""
        self.entries[pod_id] = LedgerEntry(pod_id, gpu_type_id, cost_per_hr, created)

    def close(self, pod_id: str, at: float) -> None:
        """Stop billing a pod at ``at`` (the first end wins)."""
        entry = self.entries.get(pod_id)
        if entry is not None and entry.ended is None:
            entry.ended = at

    def usd(self, pod_id: str) -> float:
        """What the pod cost by now, whatever the lag (for tests to compare with)."""
        return self.entries[pod_id].usd(self.clock())

    def _visible(self, pod_id: str | None, start: str | None, end: str | None) -> list[LedgerEntry]:
        now = self.clock()
        lo, hi = _epoch(start), _epoch(end)
        out = []
        for entry in self.entries.values():
            if pod_id and entry.pod_id != pod_id:
                continue
            if (
                lo is not None
                and (entry.ended or now) < lo
                or hi is not None
                and entry.created > hi
            ):
                continue
            upto = entry.ended if entry.ended is not None else now - self.lag_seconds
            if entry.ended is not None and now < entry.ended + self.lag_seconds:
                continue
            if upto <= entry.created:
                continue
            out.append(entry)
        return out

    def _billed(self, entry: LedgerEntry) -> tuple[int, float]:
        now = self.clock()
        upto = now if entry.ended is not None else now - self.lag_seconds
        ms = entry.billed_ms(upto)
        return ms, round(entry.cost_per_hr * ms / 3_600_000, 8)

    def v1(self, query: dict[str, str]) -> list[dict[str, Any]]:
        """The REST v1 answer to ``/billing/pods?podId=&startTime=&endTime=``."""
        rows = []
        for entry in self._visible(
            query.get("podId"), query.get("startTime"), query.get("endTime")
        ):
            ms, usd = self._billed(entry)
            rows.append(
                {
                    "time": _iso(entry.created - entry.created % 3600),
                    "amount": usd,
                    "timeBilledMs": ms,
                    "diskSpaceBilledGb": 0,
                    "podId": entry.pod_id,
                    "gpuTypeId": entry.gpu_type_id,
                }
            )
        return rows

    def v2(self, query: dict[str, str]) -> dict[str, Any]:
        """The REST v2 answer to ``/v2/billing/pods?podId=&startTime=&endTime=``."""
        records = []
        for entry in self._visible(
            query.get("podId"), query.get("startTime"), query.get("endTime")
        ):
            _, usd = self._billed(entry)
            bucket = entry.created - entry.created % 3600
            records.append(
                {
                    "startTime": _iso(bucket),
                    "endTime": _iso(bucket + 3600),
                    "podId": entry.pod_id,
                    "totalAmount": usd,
                    "gpuAmount": usd,
                    "cpuAmount": 0,
                    "diskAmount": 0,
                }
            )
        total = round(sum(r["totalAmount"] for r in records), 8)
        return {"records": records, "metadata": {"totals": {"totalAmount": total}}}
