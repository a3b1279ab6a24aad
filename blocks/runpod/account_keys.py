"""The RunPod account's SSH keys, changed without losing anyone's.

``PUT /v2/account/ssh-keys`` (and GraphQL's ``updateUserSettings(pubKey)``) replaces the
whole list (RunPod's v2 OpenAPI schema: "a complete replacement, not a merge"), and keys
reach only pods created afterwards. So:

- ``check_superset``: the guard both backends run before they send a list — refused
  (``AccountKeysError``) when it is empty or misses a key of the list just read;
- ``ensure_account_key``: write only when allowed and our key is missing, read back,
  and when a key that was there is gone (someone wrote at the same moment), restore the
  union once and warn with the fingerprints.

Keys compare by type and base64 body (comments ignored); a fingerprint is OpenSSH's
``SHA256:<base64 of the key blob's sha256, unpadded>``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prefect_runpod.blocks.exceptions import AccountKeysError, SpecError

if TYPE_CHECKING:
    from prefect_runpod.blocks.runpod.api import RunPodApi

__all__ = ["check_superset", "ensure_account_key", "fingerprint", "key_id", "merge_keys"]

logger = logging.getLogger("prefect_runpod.runpod")


def key_id(line: str) -> tuple[str, ...]:
    """What identifies a key line: its type and base64 body."""
    return tuple(line.split()[:2])


def fingerprint(line: str) -> str:
    """OpenSSH's fingerprint of a public-key line (``SHA256:…``); the line's first 24
    characters when its body is not base64."""
    parts = line.split()
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (IndexError, binascii.Error, ValueError):
        return line[:24]
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def merge_keys(*lists: Iterable[str]) -> list[str]:
    """The union of key lists in first-seen order, one line per key (the first line of
    a key wins, with its comment); blank lines dropped."""
    out: dict[tuple[str, ...], str] = {}
    for keys in lists:
        for line in keys:
            line = line.strip()
            if line and key_id(line) not in out:
                out[key_id(line)] = line
    return list(out.values())


def check_superset(keys: list[str], replacing: list[str]) -> None:
    """Refuse a key write that could lock someone out.

    Args:
        keys: the list about to be sent (it replaces the account's whole list).
        replacing: the list just read from the account.

    Raises:
        AccountKeysError: ``keys`` is empty, or a key of ``replacing`` is not in it.
    """
    if not [k for k in keys if k.strip()]:
        raise AccountKeysError(
            "refused to replace the RunPod account's SSH keys with an empty list (that "
            "would remove every key); nothing was sent"
        )
    have = {key_id(k) for k in keys if k.strip()}
    missing = [fingerprint(k) for k in replacing if k.strip() and key_id(k) not in have]
    if missing:
        raise AccountKeysError(
            "refused to replace the RunPod account's SSH keys with a list that drops "
            f"{', '.join(missing)}; nothing was sent",
            missing=missing,
        )


def ensure_account_key(api: RunPodApi, public_key: str, *, add: bool, where: str) -> bool:
    """Make sure the account's SSH keys hold ``public_key``, keeping everyone else's.

    Args:
        api: the RunPod client.
        public_key: our key line.
        add: may the key be added when missing (``RunPodSSHKey.add_to_account``).
        where: the gateway, for the message (``ssh.runpod.io``).

    Returns:
        False when the key was already there, True when it was added now.

    Raises:
        SpecError: the key is missing and may not be added, or RunPod did not keep it.
        AccountKeysError: a write would have dropped a key (never sent).
    """
    before = api.get_account_keys()
    if key_id(public_key) in {key_id(k) for k in before}:
        return False
    if not add:
        raise SpecError(
            "the RunPod account's SSH keys do not hold this run's public key, so the "
            f"gateway {where} would refuse it. Add it in the RunPod console → Settings → "
            "SSH Public Keys, or set add_to_account=True on the RunPodSSHKey block. "
            "Nothing was created."
        )
    wanted = merge_keys(before, [public_key])
    api.put_account_keys(wanted, replacing=before)
    after = api.get_account_keys()
    ids = {key_id(k) for k in after}
    lost = [k for k in wanted if key_id(k) not in ids]
    if lost:  # someone replaced the list at the same moment: restore the union once
        logger.warning(
            "RunPod account SSH keys: %s went missing after our write (another writer at "
            "the same moment?); restoring them once",
            ", ".join(fingerprint(k) for k in lost),
        )
        union = merge_keys(after, wanted)
        api.put_account_keys(union, replacing=after)
        after = api.get_account_keys()
        ids = {key_id(k) for k in after}
        still = [fingerprint(k) for k in union if key_id(k) not in ids]
        if still:
            logger.warning(
                "RunPod account SSH keys: still missing after the restore: %s", ", ".join(still)
            )
    if key_id(public_key) not in ids:
        raise SpecError(
            "RunPod did not keep the SSH public key; add it by hand in the RunPod console "
            "→ Settings → SSH Public Keys"
        )
    return True
