"""Secrets in the catalog: engine API keys and the environment values the
launch policy marks secret, and the agent token.

They are write-only: the API and the admin show a placeholder carrying a
fingerprint, and a placeholder sent back keeps the stored value. The audit
log records the fingerprint; step reasons, log lines and agents' errors the
control plane shows have the values, and their encoded and split copies,
replaced by ``***`` (``llmgw_policy.redaction``, which the agent uses too).

A fingerprint is keyed (an HMAC with the audit log's key, which the
database never holds): a reader of the log or of a page cannot
confirm a guessed secret against it offline, as they could against the
plain SHA-256 prefixes (``sha256:``) entries written before it carry. Those
stay in the log as they were written (the chain hashes the stored text) and
are still recognised where a fingerprint is compared (``fingerprint_matches``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from django.conf import settings
from llmgw_policy import REDACTED, default_policy, redact, redact_lines, secret_forms

KEYED, PLAIN = "hmac:", "sha256:"  # the fingerprints' prefixes: keyed, and from before it was

__all__ = [
    "KEYED",
    "PLAIN",
    "REDACTED",
    "audit_key",
    "fingerprint",
    "fingerprint_matches",
    "fingerprinted_env",
    "is_fingerprint",
    "masked_env",
    "placeholder",
    "plain_fingerprint",
    "profile_secrets",
    "redact",
    "redact_lines",
    "secret_forms",
    "secret_names",
    "unmasked_env",
]


def audit_key() -> bytes:
    """The audit log's key: LLMGW_AUDIT_KEY, or one derived from DJANGO_SECRET_KEY when it is unset.
    The chain's hashes (audit/chain.py) and the secrets' fingerprints are HMACs with it."""
    if settings.LLMGW_AUDIT_KEY:
        return settings.LLMGW_AUDIT_KEY.encode()
    return hmac.new(settings.SECRET_KEY.encode(), b"llmgw-audit-key", hashlib.sha256).digest()


def fingerprint(secret: str) -> str:
    """A short keyed digest that shows a change without the secret (the audit log's form)."""
    if not secret:
        return ""
    digest = hmac.new(audit_key(), b"llmgw-secret-fingerprint\n" + secret.encode(), hashlib.sha256)
    return f"{KEYED}{digest.hexdigest()[:8]}"


def plain_fingerprint(secret: str) -> str:
    """The unkeyed form entries written before keyed fingerprints carry (anyone can compute it)."""
    return f"{PLAIN}{hashlib.sha256(secret.encode()).hexdigest()[:8]}" if secret else ""


def is_fingerprint(value: object) -> bool:
    """Whether ``value`` reads as a fingerprint, keyed or of the older plain form."""
    return isinstance(value, str) and value.startswith((KEYED, PLAIN))


def fingerprint_matches(secret: str, fingerprinted: str) -> bool:
    """Whether ``fingerprinted``, of either form, is ``secret``'s."""
    if fingerprinted.startswith(PLAIN):
        return hmac.compare_digest(plain_fingerprint(secret), fingerprinted)
    return hmac.compare_digest(fingerprint(secret), fingerprinted)


def placeholder(secret: str) -> str:
    """What the API and the admin show in place of a secret value."""
    return f"<secret {fingerprint(secret)}>"


def secret_names(engine: str) -> frozenset[str]:
    return default_policy().secret_env(engine)


def masked_env(engine: str, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with every secret value replaced by its placeholder."""
    names = secret_names(engine)
    return {k: placeholder(v) if k in names and isinstance(v, str) else v for k, v in env.items()}


def fingerprinted_env(engine: str, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with every secret value replaced by its fingerprint (for the audit log)."""
    names = secret_names(engine)
    return {k: fingerprint(v) if k in names and isinstance(v, str) else v for k, v in env.items()}


def unmasked_env(new: Mapping[str, str], old: Mapping[str, str]) -> dict[str, str]:
    """``new`` with every placeholder that stands for the value ``old`` holds
    replaced by that value: sending back what was shown changes nothing (a placeholder
    shown before fingerprints were keyed, ``<secret sha256:…>``, included)."""
    out = dict(new)
    for key, value in new.items():
        stored = old.get(key)
        if isinstance(stored, str) and value in (
            placeholder(stored),
            f"<secret {plain_fingerprint(stored)}>",
        ):
            out[key] = stored
    return out


def profile_secrets(engine: str, env: Mapping[str, str]) -> list[str]:
    names = secret_names(engine)
    return [v for k, v in env.items() if k in names and isinstance(v, str)]
