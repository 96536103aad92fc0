"""Secrets in the catalog: engine API keys and the environment values the
launch policy marks secret, and the agent token.

They are write-only: the API and the admin show a placeholder carrying a
fingerprint, and a placeholder sent back keeps the stored value. The audit
log records the fingerprint; step reasons, log lines and agents' errors the
control plane shows have the values, and their encoded and split copies,
replaced by ``***`` (``llmgw_policy.redaction``, which the agent uses too).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from llmgw_policy import REDACTED, default_policy, redact, redact_lines, secret_forms

__all__ = [
    "REDACTED",
    "fingerprint",
    "fingerprinted_env",
    "masked_env",
    "placeholder",
    "profile_secrets",
    "redact",
    "redact_lines",
    "secret_forms",
    "secret_names",
    "unmasked_env",
]


def fingerprint(secret: str) -> str:
    """A short digest that shows a change without the secret (the audit log's form)."""
    return f"sha256:{hashlib.sha256(secret.encode()).hexdigest()[:8]}" if secret else ""


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
    replaced by that value: sending back what was shown changes nothing."""
    out = dict(new)
    for key, value in new.items():
        stored = old.get(key)
        if isinstance(stored, str) and value == placeholder(stored):
            out[key] = stored
    return out


def profile_secrets(engine: str, env: Mapping[str, str]) -> list[str]:
    names = secret_names(engine)
    return [v for k, v in env.items() if k in names and isinstance(v, str)]
