"""The RunPod emulator's ledger, and its REST v2 billing answer.

**Billing rule (an assumption, to confirm on a real account).** The emulator bills each
pod from the moment its create answered to the moment it ended (terminate, the pod
removed from inside, a vanished host), to the millisecond, at the pod's
``costPerHr``, with no minimum and no rounding of the time; the amount is rounded to
1e-8 USD. It answers one record per pod, in the hour bucket of its create, and only
once ``lag_seconds`` have passed since the pod ended (or, for a running pod, up to
``lag_seconds`` ago), split into the buckets asked for. RunPod documents neither its
rounding nor its lag; the figures it answers may differ, which is why the run's record
keeps RunPod's amount beside ours and ``prefect-runpod cost --reconcile`` fills RunPod's
in later.

REST v2 ``GET /v2/billing/pods?podId=&bucketSize=&startTime=&endTime=`` or ``…&lastN=``
→ ``{records: [{startTime, endTime, podId, totalAmount, gpuAmount, cpuAmount,
diskAmount}], metadata: {query, recordCount, uniquePodCount, totals}}``, as RunPod's
schema says: ``bucketSize`` defaults to ``day``; ``startTime`` (default 30 days ago) is
snapped down to its bucket's start, ``endTime`` (default now) up to its bucket's end
unless on a boundary; ``lastN`` is the last N buckets ending with the current one, and
cannot go with a window (400). One record per pod per bucket it billed in. REST v1 is
retired: the emulator answers it 410 (``runpod_api``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["BillingQueryError", "Ledger", "LedgerEntry", "bucket_floor", "bucket_next"]

BUCKETS = ("hour", "day", "week", "month", "year")


class BillingQueryError(ValueError):
    """A billing query RunPod answers with 400 (``lastN`` with a window, a bad size)."""


def bucket_floor(moment: datetime, size: str) -> datetime:
    """The start of the ``size`` bucket holding ``moment`` (UTC; weeks start Monday)."""
    moment = moment.astimezone(UTC)
    if size == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if size == "day":
        return day
    if size == "week":
        return day - timedelta(days=day.weekday())
    if size == "month":
        return day.replace(day=1)
    return day.replace(month=1, day=1)


def bucket_next(start: datetime, size: str) -> datetime:
    """The start of the bucket after the one starting at ``start``."""
    if size == "hour":
        return start + timedelta(hours=1)
    if size == "day":
        return start + timedelta(days=1)
    if size == "week":
        return start + timedelta(weeks=1)
    if size == "month":
        year, month = divmod(start.month, 12)
        return start.replace(year=start.year + year, month=month + 1)
    return start.replace(year=start.year + 1)


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

    def split_rounding_usd(self, pod_id: str, billing_note: str | None) -> float:
        """How far the sum of the bucket records a bill summed (``billing_note``'s
        ``N record(s)``, else 1) may sit from ``usd``: a life that crosses a bucket's
        edge is billed per bucket, each bucket's milliseconds and USD rounded on their
        own (``v2``), so each record and the whole may each be off by up to a
        millisecond's price and a 1e-8 USD step."""
        counted = re.search(r"(\d+) record", billing_note or "")
        records = int(counted.group(1)) if counted else 1
        return (records + 1) * (self.entries[pod_id].cost_per_hr / 3_600_000 + 1e-8)

    def window(self, query: dict[str, str]) -> tuple[str, datetime, datetime]:
        """``(bucketSize, start, end)`` of a query, snapped as RunPod's schema says.

        Raises:
            BillingQueryError: a bad ``bucketSize``/``lastN``, or ``lastN`` with a window.
        """
        size = query.get("bucketSize") or "day"
        if size not in BUCKETS:
            raise BillingQueryError(f"bucketSize {size!r} is not one of {', '.join(BUCKETS)}")
        now = datetime.fromtimestamp(self.clock(), UTC)
        if query.get("lastN"):
            if query.get("startTime") or query.get("endTime"):
                raise BillingQueryError("lastN is mutually exclusive with startTime/endTime")
            count = int(query["lastN"])
            if count < 1:
                raise BillingQueryError("lastN must be at least 1")
            end = bucket_next(bucket_floor(now, size), size)
            start = end
            for _ in range(count):
                start = bucket_floor(start - timedelta(microseconds=1), size)
            return size, start, end
        start_at = _epoch(query.get("startTime"))
        end_at = _epoch(query.get("endTime"))
        start = bucket_floor(
            datetime.fromtimestamp(start_at, UTC)
            if start_at is not None
            else now - timedelta(days=30),
            size,
        )
        end_moment = datetime.fromtimestamp(end_at, UTC) if end_at is not None else now
        end = bucket_floor(end_moment, size)
        if end < end_moment:
            end = bucket_next(end, size)
        return size, start, end

    def _billed_between(self, entry: LedgerEntry, lo: float, hi: float) -> int:
        """Milliseconds ``entry`` billed in ``[lo, hi)``, as visible now (the lag)."""
        now = self.clock()
        if entry.ended is not None:
            if now < entry.ended + self.lag_seconds:
                return 0
            upto = entry.ended
        else:
            upto = now - self.lag_seconds
        return max(0, round((min(upto, hi) - max(entry.created, lo)) * 1000))

    def v2(self, query: dict[str, str]) -> dict[str, Any]:
        """The REST v2 answer to ``/v2/billing/pods`` (see the module docstring).

        Raises:
            BillingQueryError: as ``window``.
        """
        size, start, end = self.window(query)
        pod_id = query.get("podId")
        records = []
        bucket = start
        while bucket < end:
            following = bucket_next(bucket, size)
            for entry in self.entries.values():
                if pod_id and entry.pod_id != pod_id:
                    continue
                ms = self._billed_between(entry, bucket.timestamp(), following.timestamp())
                if ms <= 0:
                    continue
                usd = round(entry.cost_per_hr * ms / 3_600_000, 8)
                records.append(
                    {
                        "startTime": _iso(bucket.timestamp()),
                        "endTime": _iso(following.timestamp()),
                        "podId": entry.pod_id,
                        "totalAmount": usd,
                        "gpuAmount": usd,
                        "cpuAmount": 0.0,
                        "diskAmount": 0.0,
                    }
                )
            bucket = following
        totals = {
            key: round(sum(r[key] for r in records), 8)
            for key in ("totalAmount", "gpuAmount", "cpuAmount", "diskAmount")
        }
        echo: dict[str, Any] = {
            "startTime": _iso(start.timestamp()),
            "endTime": _iso(end.timestamp()),
            "bucketSize": size,
            "podId": pod_id,
        }
        return {
            "records": records,
            "metadata": {
                "query": echo,
                "recordCount": len(records),
                "uniquePodCount": len({r["podId"] for r in records}),
                "totals": totals,
            },
        }
