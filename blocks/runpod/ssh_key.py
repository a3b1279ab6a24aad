"""The SSH key block for RunPod: the key pair, the gateway, and its pinned host key.

RunPod's proxied SSH (``ssh <ssh.proxy.username>@ssh.runpod.io``) authorises the keys
stored at account level (REST v2 ``/v2/account/ssh-keys``; GraphQL ``myself { pubKey }``);
the ``PUBLIC_KEY`` env on create reaches the pod's own sshd for direct TCP. A dedicated
ed25519 key for this, added at account level, is the way: ``RunPodSSHKey.generate`` and
``register_with_account`` (which never drops anyone else's key: ``runpod.account_keys``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator, model_validator

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.keys import generate_keypair, public_key_line
from prefect_runpod.blocks.pod_handle import SSHEndpoint

if TYPE_CHECKING:
    from prefect_runpod.blocks.runpod.blocks import RunPodCredentials

__all__ = ["RunPodSSHKey", "key_in_authorized", "normalise_public_key"]

_PUBLIC_KEY = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com)"
    r" [A-Za-z0-9+/]+={0,3}( [A-Za-z0-9@._+:-]{0,100})?"
)
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}|\[?[0-9a-fA-F:]+\]?")


def normalise_public_key(line: str) -> str:
    """One public-key line with the comment kept, validated (safe to inline in GraphQL).

    Raises:
        SpecError: when the line is not ``<type> <base64> [comment]``.
    """
    line = line.strip()
    if not _PUBLIC_KEY.fullmatch(line):
        raise SpecError(
            "the SSH public key is not one OpenSSH line '<type> <base64> [comment]' "
            "(comment: letters, digits, @._+:-); fix the RunPodSSHKey block's public_key"
        )
    return line


def key_in_authorized(public_key: str, authorized: str | None) -> bool:
    """True when ``authorized`` (newline-separated keys, as RunPod's ``pubKey``) holds
    ``public_key``; type and base64 are compared, comments ignored."""
    want = public_key.split()[:2]
    return any(line.split()[:2] == want for line in (authorized or "").splitlines())


class RunPodSSHKey(Block):
    """The SSH key pair used on RunPod pods, and the gateway to reach them."""

    _block_type_name = "RunPod SSH Key"
    _block_type_slug = "runpod-ssh-key"
    _documentation_url = "https://docs.runpod.io/pods/configuration/use-ssh"  # type: ignore[assignment]
    _code_example = """```python
from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey

ssh_key = RunPodSSHKey.load("BLOCK_NAME")
print(ssh_key.get_public_key())
```"""

    private_key: SecretStr | None = Field(
        default=None,
        description="Private key text (OpenSSH/PEM, unencrypted); or set private_key_path.",
    )
    private_key_path: str | None = Field(
        default=None, description="Path to the private key file, used when private_key is empty."
    )
    public_key: str | None = Field(
        default=None,
        description="The public key line (ssh-ed25519 AAAA… comment); derived from the "
        "private key when empty.",
    )
    gateway_host: str = Field(
        default="ssh.runpod.io", description="Host of RunPod's proxied SSH gateway."
    )
    gateway_port: int = Field(
        default=22, ge=1, le=65535, description="Port of RunPod's proxied SSH gateway."
    )
    gateway_host_key: str | None = Field(
        default=None,
        description="The gateway's pinned host key (ssh-ed25519 AAAA…); a different key is "
        "refused. Empty: recorded on first use.",
    )
    add_to_account: bool = Field(
        default=False,
        description="Allow adding this public key to the RunPod account's SSH keys when missing.",
    )

    @model_validator(mode="after")
    def _has_private_key(self) -> RunPodSSHKey:
        if self.private_key is None and not self.private_key_path:
            raise SpecError("RunPodSSHKey needs private_key or private_key_path")
        return self

    @field_validator("gateway_host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not _HOST.fullmatch(value):
            raise SpecError(f"invalid gateway host {value!r}")
        return value

    @classmethod
    def generate(cls, comment: str = "prefect-runpod", **fields: object) -> RunPodSSHKey:
        """A block holding a new, dedicated ed25519 key pair (as ``ssh-keygen -t ed25519``).

        Args:
            comment: the public key's comment.
            **fields: other block fields (``gateway_host``, ``add_to_account`` …).
        """
        pair = generate_keypair(comment)
        return cls(private_key=pair.private_key, public_key=pair.public_key, **fields)  # type: ignore[arg-type]

    def get_private_key(self) -> SecretStr:
        """The private key text, read from ``private_key_path`` when not inline.

        Raises:
            SpecError: when the file cannot be read.
        """
        if self.private_key is not None:
            return self.private_key
        path = Path(str(self.private_key_path)).expanduser()
        try:
            return SecretStr(path.read_text())
        except OSError as exc:
            raise SpecError(
                f"cannot read the SSH private key at {path} ({exc.strerror}); fix "
                "private_key_path or paste the key into private_key"
            ) from None

    def get_public_key(self) -> str:
        """The validated public key line (given, or derived from the private key).

        Raises:
            SpecError: when neither gives a valid key line.
        """
        if self.public_key:
            return normalise_public_key(self.public_key)
        return normalise_public_key(public_key_line(self.get_private_key()))

    def gateway_endpoint(self, pod_host_id: str) -> SSHEndpoint:
        """The proxied-SSH endpoint of a pod: user = its ``podHostId``, the pinned key."""
        return SSHEndpoint(
            host=self.gateway_host,
            port=self.gateway_port,
            user=pod_host_id,
            mode="gateway",
            host_key=self.gateway_host_key,
        )

    def account_has_key(self, credentials: RunPodCredentials) -> bool:
        """True when the RunPod account's SSH keys hold ours (read only).

        Raises:
            whatever the credentials' RunPod client raises (``RunPodAPIError`` 401 …).
        """
        keys = credentials.get_api().get_account_keys()
        return key_in_authorized(self.get_public_key(), "\n".join(keys))

    def register_with_account(self, credentials: RunPodCredentials) -> bool:
        """Add our public key to the account's SSH keys, keeping everyone else's
        (``runpod.account_keys.ensure_account_key``); a no-op when already there.

        Returns:
            True when the key was added now, False when it was already there.

        Raises:
            SpecError: when the account still lacks the key after the update.
            AccountKeysError: a write would have dropped a key (never sent).
        """
        from prefect_runpod.blocks.runpod.account_keys import ensure_account_key

        return ensure_account_key(
            credentials.get_api(), self.get_public_key(), add=True, where=self.gateway_host
        )
