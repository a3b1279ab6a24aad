"""SSH key pairs: generation and loading, on paramiko.

RunPod gets an ed25519 key of its own (revoking it then touches nothing else); the
local pod gets a fresh one per run. Private keys travel only as ``SecretStr``. paramiko
is imported only by the functions that parse a key, so the CLI's look-ups that build a
provider never load it.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from pydantic import BaseModel, SecretStr

from prefect_runpod.blocks.exceptions import SpecError

if TYPE_CHECKING:
    import paramiko

__all__ = ["KeyPair", "generate_keypair", "load_private_key", "public_key_line"]


class KeyPair(BaseModel):
    """An SSH key pair.

    Attributes:
        private_key: the private key text in OpenSSH form, as ``ssh-keygen`` writes it.
        public_key: one OpenSSH ``authorized_keys`` line (``ssh-ed25519 AAAA… comment``).
    """

    private_key: SecretStr
    public_key: str


def generate_keypair(comment: str = "prefect-runpod") -> KeyPair:
    """Generate a new ed25519 key pair (as ``ssh-keygen -t ed25519`` would).

    Args:
        comment: the comment put at the end of the public-key line.

    Returns:
        A ``KeyPair``; the private half is a ``SecretStr``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return KeyPair(private_key=SecretStr(private_pem), public_key=f"{public} {comment}")


def load_private_key(private_key: SecretStr) -> paramiko.PKey:
    """Parse a private key (OpenSSH or PEM; ed25519, ECDSA or RSA) for paramiko.

    Raises:
        SpecError: when the text is not a private key paramiko can read (the key text
            itself never appears in the message).
    """
    import paramiko

    text = private_key.get_secret_value()
    last: Exception | None = None
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(text))
        except (paramiko.SSHException, ValueError) as exc:
            last = exc
    raise SpecError(
        f"the SSH private key could not be read ({type(last).__name__}); give an unencrypted "
        "OpenSSH/PEM ed25519, ECDSA or RSA key, e.g. from `ssh-keygen -t ed25519 -N ''`"
    )


def public_key_line(private_key: SecretStr, comment: str = "prefect-runpod") -> str:
    """The OpenSSH public-key line (``ssh-ed25519 AAAA… comment``) of a private key."""
    pkey = load_private_key(private_key)
    return f"{pkey.get_name()} {pkey.get_base64()} {comment}"
