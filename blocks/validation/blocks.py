"""Saved Prefect blocks named by a run: :func:`load_block` loads one or stops the run
listing the saved ones (:func:`saved_block_names`); :func:`pydantic_reason` turns a
block's (or any model's) ``ValidationError`` into our sentences. The only part of the
layer that talks to the Prefect API, importing Prefect when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, cast

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation.names import check_block_name
from prefect_runpod.blocks.validation.options import label

if TYPE_CHECKING:
    from prefect.blocks.core import Block

__all__ = [
    "load_block",
    "pydantic_reason",
    "saved_block_names",
]

B = TypeVar("B", bound="Block")


def pydantic_reason(exc: Exception) -> str:
    """``field: reason; …`` of a pydantic ``ValidationError`` (the sentences our
    validators raise, without pydantic's ``Value error,`` prefix), else ``str(exc)``."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    parts = []
    for error in errors():
        where = ".".join(str(p) for p in error.get("loc", ()))
        msg = str(error.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or str(exc)


def saved_block_names(block_cls: type[Block]) -> list[str]:
    """The names of the saved blocks of ``block_cls``'s type on the Prefect API, sorted
    (empty when none is saved or the type is not registered)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            documents = client.read_block_documents_by_type(
                block_cls.get_block_type_slug(), include_secrets=False
            )
        except ObjectNotFound:
            return []
    return sorted(d.name for d in documents if d.name and not d.is_anonymous)


def load_block(block_cls: type[B], block_name: Any, name: str) -> B:
    """Load the saved block ``block_name`` of ``block_cls``; never fall back to anything.

    Args:
        block_cls: the block class (``RunPodPodSpec``).
        block_name: the name it was saved under.
        name: the parameter that named it (``runpod_spec_block``), for the message.

    Returns:
        The loaded block.

    Raises:
        SpecError: the name is malformed; no such block is saved (the message lists the
            saved blocks of that type); or the saved block no longer validates.
    """
    check_block_name(block_name, name)
    kind = block_cls.__name__
    try:
        return cast(B, block_cls.load(block_name))  # a sync caller gets the block itself
    except ValueError as exc:
        if "Unable to find block document" not in str(exc):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SpecError(
                f"the saved {kind} block {block_name!r} ({label(name)}) cannot be loaded "
                f"({first}): fix it in the Prefect UI or save it again."
            ) from None
    saved = saved_block_names(block_cls)
    listing = (
        f"saved {kind} blocks: {', '.join(saved)}" if saved else f"no {kind} block is saved yet"
    )
    raise SpecError(
        f"no {kind} block is named {block_name!r} ({label(name)}); {listing}: check the "
        f"name, or save one first (prefect block register -m prefect_runpod.blocks, then "
        f"{kind}(...).save({block_name!r}))."
    )
