"""The launch policy as data: an engine's entry, the limits, the whole policy,
and a refusal, the one way a check says no. Frozen dataclasses, read from
``policy.toml`` by ``loading``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# What a launch template may hold besides literal text, filled in by ``launch_args``.
PLACEHOLDERS = ("{source}", "{port}", "{model}")
PLACEHOLDER = re.compile(r"\{(source|port|model)\}")

HOW_TO_ADD = "docs/engine-policy.md says how an operator who has checked one adds it"


class PolicyError(ValueError):
    """The policy file is wrong; the message names the table and the key."""


@dataclass(frozen=True)
class Refusal:
    """Why something may not reach an engine. ``code``: refused_arg,
    refused_env, refused_source, launch_mismatch, too_large, or for a rank of
    a replica across nodes refused_group (the engine cannot span nodes) or
    invalid_spec (its group is wrong); ``subject``: the argument or variable
    named."""

    code: str
    subject: str
    sentence: str


@dataclass(frozen=True)
class ValueRule:
    kind: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    keys: Mapping[str, str] = field(default_factory=dict)
    secret: bool = False
    # The engine's API key: the agent's readiness probe sends it as a bearer token (probe.py).
    api_key: bool = False
    source: str = ""


@dataclass(frozen=True)
class GroupPolicy:
    """An engine's place in a replica across nodes (``group``): its rank flags (``args`` on
    every rank, ``headless`` on every rank but 0), or why it cannot span nodes (``refused``)."""

    args: tuple[str, ...] = ()
    headless: tuple[str, ...] = ()
    refused: str = ""
    source: str = ""
    # Ranks > 0 bind the serving port too (SGLang's dummy health check); False: they bind nothing.
    ranks_bind_port: bool = False


@dataclass(frozen=True)
class EnginePolicy:
    name: str
    version: str
    launch: tuple[str, ...]
    tp_flag: str | None
    tp_flags: tuple[str, ...]
    context_flags: tuple[str, ...]
    tp_env: tuple[str, ...]
    context_env: tuple[str, ...]
    revision_flag: str | None
    underscores_as_dashes: bool
    equals: bool
    abbreviations: bool
    owned: Mapping[str, str]
    refused: Mapping[str, str]
    args: Mapping[str, ValueRule]
    aliases: Mapping[str, str]  # a spelling -> the flag it is listed under
    owned_env: Mapping[str, str]
    refused_env: Mapping[str, str]
    env: Mapping[str, ValueRule]
    sources: Mapping[str, str]
    # The rank flags of a replica across nodes (``group``); None: the policy gives none.
    group: GroupPolicy | None = None

    def canonical(self, name: str) -> str:
        """``name`` as this engine's parser looks it up."""
        if self.underscores_as_dashes and name.startswith("--"):
            return "--" + name[2:].replace("_", "-")
        return name

    def secret_env(self, everywhere: Mapping[str, ValueRule]) -> frozenset[str]:
        rules = {**everywhere, **self.env}
        return frozenset(name for name, rule in rules.items() if rule.secret)

    def api_key_env(self, everywhere: Mapping[str, ValueRule]) -> tuple[str, ...]:
        rules = {**everywhere, **self.env}
        return tuple(sorted(name for name, rule in rules.items() if rule.api_key))


@dataclass(frozen=True)
class Limits:
    max_args: int
    max_arg_bytes: int
    max_args_bytes: int
    max_env: int
    max_env_value_bytes: int
    max_env_bytes: int
    max_context: int


@dataclass(frozen=True)
class Policy:
    engines: Mapping[str, EnginePolicy]
    limits: Limits
    agent_env: Mapping[str, str]
    refused_env: Mapping[str, str]
    env: Mapping[str, ValueRule]
    sources: Mapping[str, str]
    digest: str
    path: Path

    def engine(self, name: str) -> EnginePolicy | None:
        return self.engines.get(name)

    def secret_env(self, engine: str) -> frozenset[str]:
        """The variables whose values are secrets for ``engine`` (and every engine)."""
        eng = self.engines.get(engine)
        if eng is None:
            return frozenset(name for name, rule in self.env.items() if rule.secret)
        return eng.secret_env(self.env)

    def api_key_env(self, engine: str) -> tuple[str, ...]:
        """The variables that hold ``engine``'s API key (a client sends it as ``Authorization:
        Bearer``): what the agent's readiness probe authenticates with."""
        eng = self.engines.get(engine)
        return () if eng is None else eng.api_key_env(self.env)


def excerpt(text: str, limit: int = 60) -> str:
    """``text`` as a refusal quotes it: cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
