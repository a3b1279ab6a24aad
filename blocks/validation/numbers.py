"""Every numeric input with its unit and range (:data:`NUMBER_RULES`), checked by
:func:`check_number` or, in models and blocks, by the pydantic type :func:`constrained`;
and :func:`check_choice` for a value out of a fixed list."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation.options import OPTIONS, label
from prefect_runpod.blocks.validation.parameters import number_parameters

__all__ = [
    "NUMBER_RULES",
    "NumberRule",
    "check_choice",
    "check_number",
    "constrained",
]

_DAY_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class NumberRule:
    """The unit and range of one numeric input.

    Attributes:
        name: the parameter (``max_cost_usd``); :func:`label` adds its CLI option.
        unit: ``USD``, ``USD/h``, ``s`` or ``""`` (a plain fraction).
        meaning: what the number is, for the message (``the budget cap``).
        example: a sensible value, shown in the message.
        gt / ge / lt / le: the bounds (None for none); every value must also be finite.
        whole: only whole numbers (a count).
    """

    name: str
    unit: str
    meaning: str
    example: str
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    whole: bool = False

    def describe(self) -> str:
        """``a finite number of USD above 0 and at most 100000``."""
        unit = {"s": " of seconds", "USD": " of USD", "USD/h": " of USD per hour"}.get(
            self.unit, ""
        )
        parts = []
        if self.gt is not None:
            parts.append(f"above {_num(self.gt)}")
        if self.ge is not None:
            parts.append(f"at least {_num(self.ge)}")
        if self.lt is not None:
            parts.append(f"below {_num(self.lt)}")
        if self.le is not None:
            parts.append(f"at most {_num(self.le)}")
        kind = "a whole number" if self.whole else "a finite number"
        return f"{kind}{unit}" + (f" {' and '.join(parts)}" if parts else "")

    def fits(self, value: float) -> bool:
        """True when ``value`` (finite) lies inside the bounds."""
        return not (
            (self.whole and not float(value).is_integer())
            or (self.gt is not None and not value > self.gt)
            or (self.ge is not None and not value >= self.ge)
            or (self.lt is not None and not value < self.lt)
            or (self.le is not None and not value <= self.le)
        )


def _num(value: float) -> str:
    """``2592000`` rather than ``2.592e+06``; fractions as ``0.5``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _rules(*rules: NumberRule) -> dict[str, NumberRule]:
    return {r.name: r for r in rules}


NUMBER_RULES: dict[str, NumberRule] = {
    **{
        p.name: NumberRule(
            p.name, p.unit, p.meaning or "", p.example, p.gt, p.ge, p.lt, p.le, p.whole
        )
        for p in number_parameters()
    },
    **_rules(
        NumberRule("check_interval_seconds", "s", "how often the pod-side watchdog looks", "30", gt=0, le=_DAY_SECONDS),
        NumberRule("ttl_seconds", "s", "the age after which the reaper ends any pod (default: the pod's recorded lifetime plus a grace)", "22200", gt=0, le=365 * _DAY_SECONDS),
        NumberRule("stale_running_seconds", "s", "the silence after which a running flow counts as dead", "900", gt=0, le=365 * _DAY_SECONDS),
        NumberRule("grace_seconds", "s", "how long a pod of an unknown run is spared", "60", ge=0, le=_DAY_SECONDS),
        NumberRule("max_usd_per_hour", "USD/h", "the highest price per hour to rent at", "0.5", ge=0, le=1000),
        NumberRule("max_seconds", "s", "how long `logs --follow` follows", "3600", gt=0, le=30 * _DAY_SECONDS),
        NumberRule("limit", "", "how many recent runs to list", "20", ge=1, le=1000, whole=True),
        NumberRule("gpu_limit", "", "the slots of the runpod-gpu concurrency limit (pods at once)", "2", ge=1, le=1000, whole=True),
        NumberRule("heartbeat_seconds", "s", "the flows' heartbeat interval the zombie automation counts", "180", gt=0, le=_DAY_SECONDS),
        NumberRule("run_limit", "", "the most runs at once in the serving process", "4", ge=1, le=1000, whole=True),
        NumberRule("query_seconds", "s", "how often the served deployments ask for scheduled runs", "10", gt=0, le=_DAY_SECONDS),
    ),
}  # fmt: skip
"""Every numeric input of a run (from its parameter's declaration,
``parameters.FINETUNE_PARAMETERS``), the reaper and the blocks, with its unit and range."""


def check_number(name: str, value: Any, *, optional: bool = False) -> float | None:
    """Check one numeric input against its rule in :data:`NUMBER_RULES`.

    Args:
        name: the rule's name (``max_cost_usd``).
        value: the value as given (a float, an int; anything else is refused).
        optional: None is accepted (and returned) when True.

    Returns:
        The value as a float (None when optional and None).

    Raises:
        SpecError: NaN, an infinity, a boolean, a non-number, or a value out of range;
            the message names the parameter and its option, the range and an example.
        KeyError: ``name`` has no rule (a programming error, not bad input).
    """
    rule = NUMBER_RULES[name]
    if value is None and optional:
        return None
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    if number is None or not math.isfinite(number) or not rule.fits(number):
        option = OPTIONS.get(name)
        example = f"{option} {rule.example}" if option else f"{name}={rule.example}"
        raise SpecError(
            f"{label(name)} must be {rule.describe()}, got {value!r}: give {rule.meaning}, "
            f"e.g. {example}."
        )
    return number


def constrained(name: str, *, optional: bool = False) -> Any:
    """A pydantic type that applies :func:`check_number` with rule ``name``, for models
    and blocks (``heartbeat_stale_seconds: constrained("heartbeat_stale_seconds")``).

    A failing value raises pydantic's ``ValidationError`` whose text is the rule's
    sentence.
    """
    NUMBER_RULES[name]  # fail at import for an unknown rule
    base: Any = float | None if optional else float
    from pydantic import AfterValidator  # models load pydantic; the CLI's parser does not

    return Annotated[base, AfterValidator(lambda v: check_number(name, v, optional=optional))]


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Check that ``value`` is one of ``choices`` (``pty_framing`` in auto, raw, base64).

    Returns:
        The value.

    Raises:
        SpecError: anything else; the message names the parameter, its option and the
            choices.
    """
    allowed = tuple(choices)
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(f"{label(name)} {value!r} is not one of: {', '.join(allowed)}.")
    return value
