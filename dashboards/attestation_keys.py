"""The Ed25519 keys period attestations are signed with (dashboards.attestation): a new pair for `oncewatch
attest-key`, the private key of `[attest]`, an auditor's public key, and the id a signature names its key by.

The PyCA `cryptography` library does the signing; the private key is a PKCS#8 PEM without a passphrase (kept
mode 600 where `[attest] key_file` names it), the public key a SubjectPublicKeyInfo PEM.
"""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from oncewatch.core.config import Config, ConfigError

def new_key_pair() -> tuple[bytes, bytes]:
    """A fresh Ed25519 key pair as (private PEM, PKCS#8 without a passphrase; public PEM, SubjectPublicKeyInfo)."""
    key = Ed25519PrivateKey.generate()
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()), public_pem(key.public_key()))


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def private_key(pem: bytes, where: str) -> Ed25519PrivateKey:
    """The private key of `[attest]` from its PEM text; `where` (the config key) names it in the error."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: not a PEM private key without a passphrase ({exc}); make a key pair with "
                          f"`oncewatch attest-key --out DIR`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{where}: not an Ed25519 key ({type(key).__name__}); make a key pair with "
                          f"`oncewatch attest-key --out DIR`")
    return key


def public_key(pem: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from its PEM text; ValueError saying what it is instead."""
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"not an Ed25519 key ({type(key).__name__})")
    return key


def key_id(key: Ed25519PublicKey) -> str:
    """public_key_sha256: the SHA-256 of the raw 32 bytes of a public key."""
    return hashlib.sha256(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).hexdigest()


def signing_key(cfg: Config) -> Ed25519PrivateKey:
    if cfg.attest is None:
        raise ConfigError("attest: missing: attestations are signed with the key of [attest] key_file; make a pair "
                          "with `oncewatch attest-key --out DIR` and add [attest] key_file = \"DIR/attest.key\"")
    return private_key(cfg.attest.private_pem(), cfg.attest.key_name)
