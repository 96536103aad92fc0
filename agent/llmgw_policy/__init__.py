"""The launch policy shared by the control plane and the node agent (standard
library only): see ``policy.py`` and ``policy.toml``."""

from .policy import (
    POLICY_PATH,
    EnginePolicy,
    Limits,
    Policy,
    PolicyError,
    Refusal,
    ValueRule,
    check_profile,
    check_spec,
    default_policy,
    is_flag,
    launch_args,
    load_policy,
    parse_roots,
    source_refusal,
    split_source,
)

__all__ = [
    "POLICY_PATH",
    "EnginePolicy",
    "Limits",
    "Policy",
    "PolicyError",
    "Refusal",
    "ValueRule",
    "check_profile",
    "check_spec",
    "default_policy",
    "is_flag",
    "launch_args",
    "load_policy",
    "parse_roots",
    "source_refusal",
    "split_source",
]
