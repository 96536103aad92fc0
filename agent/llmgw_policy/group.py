"""The rank flags of a replica across nodes: what each rank's engine is told
about its group (how many ranks, which one it is, where rank 0 waits for the
others). The launch policy writes them from the spec's ``group``, never a
profile: ``group_args`` makes them, ``launch_args`` appends them after the TP
width, and the agent's ``check_spec`` recomputes them and refuses a spec whose
arguments carry any other (or any at all without a ``group``).

An engine's ``[engines.<name>.group]`` table in ``policy.toml`` gives either
``args`` (on every rank) and ``headless`` (on every rank but 0), with the
placeholders of ``GROUP_PLACEHOLDERS``, or ``refused``: why the agent cannot
start that engine across nodes. Each rank flag must also be in the engine's
``owned`` table, so that a profile naming one is refused with its reason."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .model import EnginePolicy, GroupPolicy, PolicyError, Refusal

GROUP_PLACEHOLDERS = ("{size}", "{rank}", "{address}", "{rendezvous_port}")
GROUP_PLACEHOLDER = re.compile(r"\{(size|rank|address|rendezvous_port)\}")
# Rank 0's agent host as the spec gives it: a host name or an IPv4 address (no IPv6 literal: the
# engines' own address flags differ in how they take one, and the fleet's agents use names or IPv4).
ADDRESS = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\Z")
MAX_GROUP_SIZE = 64


@dataclass(frozen=True)
class GroupSpec:
    """One rank of a replica across nodes: ``rank`` of ``size`` ranks, rank 0's agent host
    ``address`` and the rendezvous ``port`` it waits for the others on."""

    rank: int
    size: int
    address: str
    port: int

    @property
    def headless(self) -> bool:
        """A rank > 0: it serves nothing and does not bind the serving port."""
        return self.rank > 0

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "size": self.size, "address": self.address, "port": self.port}

    def problem(self) -> str | None:
        """What is wrong with it, as a sentence; None when nothing is."""
        whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (self.rank, self.size, self.port))
        if not whole:
            return "rank, size and port must be whole numbers"
        if not 2 <= self.size <= MAX_GROUP_SIZE:
            return f"size must be from 2 to {MAX_GROUP_SIZE} ranks (a one-node replica has no group), got {self.size}"
        if not 0 <= self.rank < self.size:
            return f"rank must be from 0 to {self.size - 1} (size {self.size}), got {self.rank}"
        if not 1024 <= self.port <= 65535:
            return f"port (rank 0's rendezvous port) must be from 1024 to 65535, got {self.port}"
        if not isinstance(self.address, str) or not ADDRESS.match(self.address):
            return (
                f"address {str(self.address)[:80]!r} must be rank 0's agent host: a host name or an "
                "IPv4 address (letters, digits, '.' and '-')"
            )
        return None


def group_args(eng: EnginePolicy, rank: int, size: int, address: str, port: int) -> list[str]:
    """The rank flags ``eng`` is started with as ``rank`` of ``size``, rank 0 waiting at
    ``address``:``port``. ``PolicyError`` when the engine cannot run across nodes (its reason)."""
    policy = eng.group
    if policy is None or policy.refused or not policy.args:
        raise PolicyError(group_refused_sentence(eng))
    values = {"size": str(size), "rank": str(rank), "address": address, "rendezvous_port": str(port)}
    tokens = policy.args + (policy.headless if rank > 0 else ())
    return [GROUP_PLACEHOLDER.sub(lambda m: values[m[1]], token) for token in tokens]


def group_refused_sentence(eng: EnginePolicy) -> str:
    why = eng.group.refused if eng.group is not None and eng.group.refused else ""
    if not why:
        why = f"the launch policy gives no rank flags for it (no [engines.{eng.name}.group] args)"
    return f"{eng.name} cannot run a replica across nodes here: {why}."


def check_group_part(
    eng: EnginePolicy, args: Sequence[str], i: int, group: GroupSpec
) -> tuple[int, Refusal | None]:
    """Where the rank flags start (``i``, after the TP width): they must be exactly what
    ``group_args`` makes of ``group``. Where reading goes on, or a refusal."""
    problem = group.problem()
    if problem is not None:
        return 0, Refusal("invalid_spec", "group", f"The spec's group is wrong: {problem}.")
    try:
        expected = group_args(eng, group.rank, group.size, group.address, group.port)
    except PolicyError as exc:
        return 0, Refusal("refused_group", "group", str(exc))
    written = list(args[i : i + len(expected)])
    if written != expected:
        return 0, Refusal(
            "launch_mismatch",
            "args",
            f"After the TP width the launcher writes the rank flags of rank {group.rank} of "
            f"{group.size} ({' '.join(expected)}), from the spec's group; the arguments give "
            f"{' '.join(written) or 'none'}.",
        )
    return i + len(expected), None


def load_group(data: Any, where: str, owned: dict[str, str], sources: dict[str, str]) -> GroupPolicy | None:
    """``[engines.<name>.group]`` read and checked; None when the engine has none."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise PolicyError(f"{where}: must be a table")
    unknown = set(data) - {"args", "headless", "refused", "src", "ranks_bind_port"}
    if unknown:
        raise PolicyError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    src = data.get("src")
    if not isinstance(src, str) or src not in sources:
        raise PolicyError(f"{where}, key 'src': {src!r} is not one of the sources {sorted(sources)}")
    refused = data.get("refused", "")
    if not isinstance(refused, str):
        raise PolicyError(f"{where}, key 'refused': must be a sentence")
    lists = {}
    for key in ("args", "headless"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
            raise PolicyError(f"{where}, key {key!r}: must be a list of strings")
        lists[key] = tuple(value)
    if bool(refused) == bool(lists["args"]):
        raise PolicyError(f"{where}: give either args (the rank flags) or refused (why not), not both")
    for token in lists["args"] + lists["headless"]:
        for placeholder in re.findall(r"\{[^{}]*\}", token):
            if placeholder not in GROUP_PLACEHOLDERS:
                raise PolicyError(f"{where}: unknown placeholder {placeholder}")
        if token.startswith("-") and token not in owned:
            raise PolicyError(f"{where}: {token} must also be in the engine's owned table, with why")
    binds = data.get("ranks_bind_port", False)
    if not isinstance(binds, bool):
        raise PolicyError(f"{where}, key 'ranks_bind_port': must be true or false")
    return GroupPolicy(
        args=lists["args"],
        headless=lists["headless"],
        refused=refused,
        source=sources[src],
        ranks_bind_port=binds,
    )
