"""A replica spec: what the control plane asks the agent to run, checked for
shape. Whether it fits this node (engine, cards, ports, refusals) is the
supervisor's business."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmgw_policy import GroupSpec

REPLICA_ID = re.compile(r"[A-Za-z0-9._-]{1,128}\Z")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
SPEC_KEYS = ("engine", "model", "args", "env", "cards", "port", "ready_timeout", "group")
GROUP_KEYS = ("rank", "size", "address", "port")
DEFAULT_READY_TIMEOUT = 600.0
MAX_READY_TIMEOUT = 7 * 24 * 3600.0
MAX_ARGS = 1000


class AgentError(Exception):
    """A refusal with an HTTP status, a stable code and a plain sentence."""

    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail

    def as_dict(self) -> dict[str, str]:
        return {"detail": self.detail, "code": self.code}


def invalid(detail: str) -> AgentError:
    return AgentError(400, "invalid_spec", detail)


@dataclass(frozen=True)
class Spec:
    engine: str
    model: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # sorted by name
    cards: tuple[int, ...]  # in the caller's order: it is the order CUDA numbers them in
    port: int
    ready_timeout: float = DEFAULT_READY_TIMEOUT
    # One rank of a replica across nodes; None: a replica on this node alone.
    group: GroupSpec | None = None

    @property
    def headless(self) -> bool:
        """A rank > 0 of a replica across nodes: it serves nothing and does not bind ``port``
        (rank 0's serving port, possibly held by rank 0 on this very host)."""
        return self.group is not None and self.group.headless

    def runs_same_as(self, other: Spec) -> bool:
        """True when both specs would start the same process. The readiness
        deadline is not part of that: a retried PUT with another deadline is
        still the same replica."""
        return (self.engine, self.model, self.args, self.env, self.cards, self.port, self.group) == (
            other.engine,
            other.model,
            other.args,
            other.env,
            other.cards,
            other.port,
            other.group,
        )

    def as_dict(self) -> dict[str, Any]:
        out = {
            "engine": self.engine,
            "model": self.model,
            "args": list(self.args),
            "env": dict(self.env),
            "cards": list(self.cards),
            "port": self.port,
            "ready_timeout": self.ready_timeout,
        }
        if self.group is not None:
            out["group"] = self.group.as_dict()
        return out


def check_replica_id(replica_id: str) -> None:
    if not REPLICA_ID.match(replica_id):
        raise invalid(
            f"Replica id {replica_id[:140]!r} is not valid: use 1 to 128 letters, digits, '.', '_' or '-'."
        )


def parse_spec(body: Any) -> Spec:
    """The spec in a PUT body, or AgentError(400, "invalid_spec") naming the
    first field that is wrong."""
    if not isinstance(body, Mapping):
        raise invalid("The body must be a JSON object with engine, model, cards and port.")
    unknown = [key for key in body if key not in SPEC_KEYS]
    if unknown:
        raise invalid(f"Unknown field {unknown[0]!r} in the spec; the fields are {', '.join(SPEC_KEYS)}.")
    for key in ("engine", "model", "cards", "port"):
        if key not in body:
            raise invalid(f"Field {key!r} is required.")

    engine, model = body["engine"], body["model"]
    if not isinstance(engine, str) or not engine:
        raise invalid("Field 'engine' must be a non-empty string.")
    if not isinstance(model, str) or not model.strip() or len(model) > 512 or _has_control(model):
        raise invalid(
            "Field 'model' must be the served model name: a non-empty string of at most 512 characters."
        )

    args = body.get("args", [])
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise invalid("Field 'args' must be a list of strings (never a shell line).")
    if len(args) > MAX_ARGS:
        raise invalid(f"Field 'args' has {len(args)} items; at most {MAX_ARGS} are accepted.")
    if any("\0" in arg for arg in args):
        raise invalid("Field 'args' must not contain NUL characters.")

    env = body.get("env", {})
    if not isinstance(env, Mapping):
        raise invalid("Field 'env' must be an object of variable names to string values.")
    for name, value in env.items():
        if not ENV_NAME.match(name):
            raise invalid(
                f"Environment variable name {name[:140]!r} is not valid: use letters, digits and '_'."
            )
        if not isinstance(value, str) or "\0" in value:
            raise invalid(f"Environment variable {name} must have a string value without NUL characters.")

    cards = body["cards"]
    if not isinstance(cards, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in cards):
        raise invalid("Field 'cards' must be a list of card indices (whole numbers), for example [0, 1].")
    if len(set(cards)) != len(cards):
        raise invalid(f"Field 'cards' lists a card twice: {cards}.")

    port = body["port"]
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise invalid(f"Field 'port' must be a whole number from 1024 to 65535, got {port!r}.")

    ready_timeout = body.get("ready_timeout", DEFAULT_READY_TIMEOUT)
    if (
        isinstance(ready_timeout, bool)
        or not isinstance(ready_timeout, int | float)
        or not math.isfinite(ready_timeout)
        or not 0 < ready_timeout <= MAX_READY_TIMEOUT
    ):
        raise invalid(
            f"Field 'ready_timeout' must be a number of seconds above 0 and at most {MAX_READY_TIMEOUT:g}, "
            f"got {ready_timeout!r}."
        )

    return Spec(
        engine=engine,
        model=model,
        args=tuple(args),
        env=tuple(sorted(env.items())),
        cards=tuple(cards),
        port=port,
        ready_timeout=float(ready_timeout),
        group=parse_group(body.get("group")),
    )


def parse_group(raw: Any) -> GroupSpec | None:
    """A spec's ``group`` (one rank of a replica across nodes), or None when absent;
    AgentError(400, "invalid_spec") saying what is wrong."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or set(raw) != set(GROUP_KEYS):
        raise invalid(
            "Field 'group' must be an object with exactly rank, size, address and port: this "
            "node's rank, how many ranks the replica has, rank 0's agent host and its rendezvous "
            "port (leave 'group' out for a replica on one node)."
        )
    group = GroupSpec(rank=raw["rank"], size=raw["size"], address=raw["address"], port=raw["port"])
    problem = group.problem()
    if problem is not None:
        raise invalid(f"Field 'group' is wrong: {problem}.")
    return group


def _has_control(text: str) -> bool:
    return any(ord(ch) < 32 or ord(ch) == 127 for ch in text)


def engine_env(replica_id: str, spec: Spec, program_path: str) -> dict[str, str]:
    """The engine's environment: the agent's own without its ``LLMGW_`` settings, the spec's
    variables, its cards (in PCI bus order, as nvidia-smi numbers them) and who it is."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LLMGW_")}
    env["PATH"] = program_path
    env.update(spec.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(card) for card in spec.cards)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["LLMGW_REPLICA_ID"] = replica_id
    env["LLMGW_REPLICA_PORT"] = str(spec.port)
    env["LLMGW_SERVED_MODEL"] = spec.model
    return env
