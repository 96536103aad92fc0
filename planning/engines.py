"""The engine registry: each serving engine's spread and memory model, read
from ``engines.toml``, with its spellings and refusals from the launch policy
(``agent/llmgw_policy/policy.toml``, shared with the node agents).

Flag spelling is engine-specific: vLLM reads ``--max_model_len`` as
``--max-model-len``, and the argparse-based engines take any unambiguous
prefix of a long flag for the flag. ``matcher`` folds both in, so that a
refusal cannot be dodged by respelling a flag and a resize drops every
spelling of the TP width.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmgw_policy import GroupSpec, Policy, Refusal, check_profile, default_policy
from llmgw_policy import launch_args as policy_launch_args

from base.errors import DomainError
from planning.args import drop_where, get_where, parse_int
from planning.enginememory import EngineMemory, parse_memory, release_key
from planning.releases import FLOORS, Floor, check_range, parse_version
from planning.units import and_list

DEFAULT_PATH = Path(__file__).with_name("engines.toml")
SPREADS = ("tensor", "layers", "single")
# How one replica runs across nodes (engines.toml ``span``): "pipeline", TP = a node's cards and one
# pipeline stage a node; "tensor", TP over every card of every node; "none", not at all.
SPANS = ("pipeline", "tensor", "none")
_CAPABILITY = re.compile(r"(\d+)\.(\d+)")


class RegistryError(ValueError):
    """The registry file is wrong; the message names the engine and the key."""


@dataclass(frozen=True)
class Engine:
    """One engine: its registry entry (``engines.toml``: spread, capability,
    memory) and what the launch policy says of its arguments."""

    name: str
    spread: str
    tp_flags: tuple[str, ...]
    tp_flag: str | None
    context_flags: tuple[str, ...]
    min_capability: str
    memory: EngineMemory
    experts_on_card: bool
    launch: tuple[str, ...]
    tp_env: tuple[str, ...] = ()
    context_env: tuple[str, ...] = ()
    underscores_as_dashes: bool = False
    abbreviations: bool = False
    # The memory models of older releases (``[[<engine>.older_memory]]``), each
    # with its range; ``memory`` is the current releases' (and a blank release's).
    older_memory: tuple[EngineMemory, ...] = ()
    # The engine's package on the package index (the release watch, the agent's installed release).
    package: str = ""
    # What a node must have, per range of releases, oldest first (``planning.releases.floor_of``).
    floors: tuple[Floor, ...] = ()
    # How a replica runs across nodes (``SPANS``), why it cannot ("none"), and where that comes from.
    span: str = "none"
    span_reason: str = ""
    span_source: str = ""


# -- loading -----------------------------------------------------------------

_REQUIRED = {"spread", "min_capability", "memory", "experts_on_card"}
# memory_of: another engine whose memory model this one has (the stand-in plans as vLLM), in place of memory.
_OPTIONAL: set[str] = {"memory_of", "older_memory", "package", "floors", "span", "span_reason", "span_source"}
_FLOOR_KEYS = {"releases", *FLOORS, "source"}


def load_registry(path: Path | None = None, policy: Policy | None = None) -> dict[str, Engine]:
    """Every engine in the registry file (``engines.toml`` beside this module
    by default), checked, with its launch policy (the shipped one by default).
    Raises ``RegistryError`` naming the engine and key of the first thing wrong."""
    path = path or DEFAULT_PATH
    policy = policy or default_policy()
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{path.name}: not valid TOML: {exc}") from exc

    def fail(where: str, key: str, problem: str) -> RegistryError:
        return RegistryError(f"{path.name}: {where}, key {key!r}: {problem}")

    tables: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            tables[key] = value
        else:
            raise fail("the top level", key, "unknown; expected an engine table")
    if not tables:
        raise RegistryError(f"{path.name}: no engines")

    engines = {}
    for name, table in tables.items():
        where = functools.partial(fail, f"engine {name!r}")
        if "memory_of" in table and "memory" not in table:
            other = tables.get(table["memory_of"]) if isinstance(table["memory_of"], str) else None
            if other is None or "memory" not in other:
                raise where(
                    "memory_of", f"must name another engine with its own memory, not {table['memory_of']!r}"
                )
            table = {
                **{k: v for k, v in table.items() if k != "memory_of"},
                "memory": other["memory"],
                **({"older_memory": other["older_memory"]} if "older_memory" in other else {}),
            }
        engines[name] = _engine(name, table, policy, fail=where)
    return engines


def _engine(
    name: str, table: dict[str, Any], policy: Policy, *, fail: Callable[[str, str], RegistryError]
) -> Engine:
    for key in table:
        if key not in _REQUIRED | _OPTIONAL:
            raise fail(key, "unknown key")
    for key in sorted(_REQUIRED - table.keys()):
        raise fail(key, "missing")
    launch = policy.engine(name)
    if launch is None:
        raise fail("spread", f"the engine has no entry in the launch policy {policy.path}")

    spread = table["spread"]
    if spread not in SPREADS:
        raise fail("spread", f"must be one of {', '.join(SPREADS)}, not {spread!r}")
    if spread == "tensor" and not launch.tp_flag:
        raise fail("spread", f"a tensor-parallel engine needs tp_flag in the launch policy {policy.path}")
    if spread != "tensor" and launch.tp_flag:
        raise fail("spread", f"only a tensor-parallel engine has a tp_flag, and this one spreads by {spread}")

    capability = table["min_capability"]
    if not isinstance(capability, str) or parse_capability(capability) is None:
        raise fail("min_capability", f'must be a string like "8.0", not {capability!r}')

    memory = parse_memory(table["memory"], fail)
    older_tables = table.get("older_memory", [])
    if not isinstance(older_tables, list):
        raise fail(
            "older_memory", "must be an array of tables ([[<engine>.older_memory]]), one a release range"
        )
    older = tuple(parse_memory(t, fail) for t in older_tables)
    for mem in older:
        if mem.below is None:
            raise fail(
                "older_memory", f"{mem.version!r} needs below: the first release it no longer describes"
            )

    experts = table["experts_on_card"]
    if not isinstance(experts, bool):
        raise fail("experts_on_card", f"must be true or false, not {experts!r}")

    package = table.get("package", "")
    if not isinstance(package, str) or (package and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", package)):
        raise fail("package", f"must be the engine's package name on the package index, not {package!r}")

    span, span_reason, span_source = _span(table, spread, fail)
    return Engine(
        name=name,
        spread=spread,
        tp_flags=launch.tp_flags,
        tp_flag=launch.tp_flag,
        context_flags=launch.context_flags,
        min_capability=capability,
        memory=memory,
        experts_on_card=experts,
        launch=launch.launch,
        tp_env=launch.tp_env,
        context_env=launch.context_env,
        underscores_as_dashes=launch.underscores_as_dashes,
        abbreviations=launch.abbreviations,
        older_memory=older,
        package=package,
        floors=_floors(table.get("floors", []), fail),
        span=span,
        span_reason=span_reason,
        span_source=span_source,
    )


def _span(
    table: dict[str, Any], spread: str, fail: Callable[[str, str], RegistryError]
) -> tuple[str, str, str]:
    """The engine's ``span``, ``span_reason`` and ``span_source``, checked: only a tensor-parallel engine
    spans nodes, and an engine that does not says why."""
    span = table.get("span", "none")
    if span not in SPANS:
        raise fail("span", f"must be one of {', '.join(SPANS)}, not {span!r}")
    reason, source = table.get("span_reason", ""), table.get("span_source", "")
    for key, value in (("span_reason", reason), ("span_source", source)):
        if not isinstance(value, str):
            raise fail(key, f"must be a sentence, not {value!r}")
    if span != "none" and spread != "tensor":
        raise fail("span", f"only a tensor-parallel engine spans nodes, and this one spreads by {spread}")
    if span != "none" and not source.strip():
        raise fail("span_source", "must say where the engine's way across nodes comes from")
    if span != "none" and reason:
        raise fail("span_reason", 'is for an engine that cannot span nodes (span = "none")')
    if span == "none" and not reason:
        reason = "the registry gives it no way across nodes (engines.toml, span)"
    return span, reason, source


def _floors(raw: Any, fail: Callable[[str, str], RegistryError]) -> tuple[Floor, ...]:
    """The engine's ``[[<engine>.floors]]``: each a range of releases and what a node needs for them."""
    if not isinstance(raw, list) or not all(isinstance(f, dict) for f in raw):
        raise fail("floors", "must be an array of tables ([[<engine>.floors]])")
    floors = []
    for n, entry in enumerate(raw):
        key = f"floors[{n}]"
        for name in entry:
            if name not in _FLOOR_KEYS:
                raise fail(f"{key}.{name}", f"unknown key (known: {', '.join(sorted(_FLOOR_KEYS))})")
        problem = check_range(entry.get("releases"))
        if problem:
            raise fail(f"{key}.releases", problem)
        for name in ("capability", "driver", "cuda"):
            value = entry.get(name, "")
            if not isinstance(value, str) or (value and parse_version(value) is None):
                raise fail(f"{key}.{name}", f'must be a version string such as "8.0" or "580", not {value!r}')
        arch = entry.get("arch", [])
        if not isinstance(arch, list) or not all(isinstance(a, str) and a for a in arch):
            raise fail(f"{key}.arch", f'must be a list of architectures such as ["x86_64"], not {arch!r}')
        source = entry.get("source", "")
        if not isinstance(source, str) or not source.strip():
            raise fail(f"{key}.source", "must say where the figures come from")
        floors.append(
            Floor(
                releases=entry["releases"].strip(),
                capability=entry.get("capability", ""),
                driver=entry.get("driver", ""),
                cuda=entry.get("cuda", ""),
                arch=tuple(arch),
                source=source,
            )
        )
    return tuple(floors)


@functools.cache
def registry() -> dict[str, Engine]:
    """The default registry, loaded once per process."""
    return load_registry()


def engine(name: str) -> Engine:
    """The engine called ``name``; ``DomainError("unknown_engine")`` listing the
    known ones when there is none."""
    known = registry()
    try:
        return known[name]
    except KeyError:
        raise DomainError(
            "unknown_engine",
            f"There is no engine {name!r}; the registry knows {and_list(sorted(known))}.",
        ) from None


def terms_for(eng: Engine | str, release: str | None) -> Engine:
    """The engine with the memory model of ``release`` (such as "0.19.1"): the
    older table whose range holds it, else the current releases' model, which
    a blank or unreadable release also gets (the fleet's default release is the
    caller's to pass). ``eng`` is an engine or its name (``unknown_engine``
    when the registry has none)."""
    eng = engine(eng) if isinstance(eng, str) else eng
    key = release_key(release)
    if key is None or eng.memory.covers(key):
        return eng
    for mem in eng.older_memory:
        if mem.covers(key):
            return replace(eng, memory=mem)
    return eng


def engine_at(name: str, release: str) -> Engine:
    """The engine called ``name`` as it is at ``release`` (blank: not known): the memory terms of
    that release (``terms_for``); the floors per release are picked apart
    (``planning.releases.floor_of``)."""
    return terms_for(engine(name), release)


def span_refusal(eng: Engine) -> str | None:
    """Why a replica of ``eng`` cannot run across nodes; None when it can."""
    if eng.span != "none":
        return None
    return eng.span_reason or f"the {eng.name} engine does not span nodes"


def group_widths(eng: Engine, per_node: int, nodes: int) -> tuple[int, int]:
    """The tensor- and pipeline-parallel widths an engine runs a replica of ``nodes`` nodes of
    ``per_node`` cards each with: TP ``per_node`` and PP ``nodes`` for a "pipeline" engine (vLLM),
    TP ``per_node × nodes`` and PP 1 for a "tensor" one (SGLang). One node: TP ``per_node``, PP 1.

    A profile keeps TP as the width within a node (``tp``, the cards formula ``max(gpus_per_node,
    tp) × max(nodes, pp)``); this is what the engine itself is told."""
    if nodes <= 1 or eng.span == "none":
        return per_node, 1
    if eng.span == "tensor":
        return per_node * nodes, 1
    return per_node, nodes


def parse_capability(text: str) -> tuple[int, int] | None:
    """ "8.0" as (8, 0), for comparing ("12.0" is newer than "9.0"); None when
    it is not of that form."""
    match = _CAPABILITY.fullmatch(text.strip()) if isinstance(text, str) else None
    return (int(match[1]), int(match[2])) if match else None


# -- spelling ------------------------------------------------------------------


def _canonical(eng: Engine, name: str) -> str:
    if eng.underscores_as_dashes and name.startswith("--"):
        return "--" + name[2:].replace("_", "-")
    return name


def spelling_of(eng: Engine, name: str, flags: Iterable[str]) -> str | None:
    """Which of ``flags`` the flag ``name`` is to this engine's parser: the flag
    itself, the same with "_" for "-" where the parser folds them, or an
    abbreviation where the parser accepts one. None when it is none of them."""
    canonical = {_canonical(eng, f): f for f in flags}
    mine = _canonical(eng, name)
    if mine in canonical:
        return canonical[mine]
    if eng.abbreviations and mine.startswith("--") and len(mine) > 2:
        # argparse resolves a proper prefix of a long flag to that flag; where
        # it is ambiguous argparse refuses it anyway, so naming it is harmless.
        for flag, original in canonical.items():
            if flag.startswith("--") and flag.startswith(mine):
                return original
    return None


def matcher(eng: Engine, flags: Iterable[str]) -> Callable[[str], bool]:
    """A test of flag names: does this engine read the name as one of ``flags``?"""
    wanted = tuple(flags)
    return lambda name: spelling_of(eng, name, wanted) is not None


def drop_spellings(eng: Engine, args: Sequence[str], flags: Iterable[str]) -> list[str]:
    """``args`` without any spelling of ``flags`` this engine would read, each
    with its value (see ``args.drop_where``)."""
    return drop_where(args, matcher(eng, flags))


def int_value(eng: Engine, args: Sequence[str], flags: Iterable[str]) -> int | None:
    """The last of ``flags`` in ``args``, in any spelling, as an integer; None
    when absent or not a whole number."""
    return parse_int(get_where(args, matcher(eng, flags)))


def context_arg(eng: Engine, args: Sequence[str]) -> str | None:
    """The value of the last context flag in ``args`` as written, in any
    spelling this engine's parser would take for it (see ``matcher``); None
    when there is none, "" when it has no value. The one reading of a
    profile's context flag: the planner's context (``rules.context_of``) and
    the catalog's guard that only the context operation writes it."""
    return get_where(args, matcher(eng, eng.context_flags))


def with_context(eng: Engine, args: Sequence[str], tokens: int) -> list[str]:
    """``args`` with every spelling of the context flag dropped and the
    engine's first spelling set to ``tokens``."""
    if not eng.context_flags:
        raise DomainError(
            "no_context_flag", f"The {eng.name} engine has no context-length flag in the registry."
        )
    return [*drop_spellings(eng, args, eng.context_flags), eng.context_flags[0], str(tokens)]


# -- refusals and launching ----------------------------------------------------


def _pairs(env: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return list(env.items()) if isinstance(env, Mapping) else list(env)


def refusals(
    eng: Engine,
    args: Sequence[str],
    env: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    *,
    context: bool = True,
    context_max: int | None = None,
) -> list[Refusal]:
    """The launch policy's refusals of a profile's arguments and environment
    (see ``llmgw_policy.check_profile``); empty when nothing is refused."""
    return check_profile(
        default_policy(), eng.name, list(args), _pairs(env), context=context, context_max=context_max
    )


def refused(
    eng: Engine, args: Sequence[str], env: Mapping[str, str] | Iterable[tuple[str, str]] = ()
) -> list[str]:
    """A plain sentence for each argument and environment variable of a profile
    that this engine may not be given; empty when nothing is refused.

    The launch policy's allowlist decides (``agent/llmgw_policy``): only the
    spellings it lists pass, read as the engine's parser reads them. The
    environment is a mapping or a sequence of (name, value) pairs.
    """
    return [r.sentence for r in refusals(eng, args, env)]


def launch_args(
    eng: Engine,
    *,
    source: str,
    port: int,
    model: str,
    tp: int,
    args: Sequence[str],
    group: GroupSpec | None = None,
) -> list[str]:
    """The arguments the node agent starts the engine with (after the
    agent's own program for it): the launch template filled in, the
    revision a source pins, then the TP width for a tensor-parallel engine,
    then for one rank of a replica across nodes (``group``: its rank, the
    group's size, rank 0's agent host and rendezvous port) the rank flags
    the launch policy makes (``llmgw_policy.group_args``; ``PolicyError`` for
    an engine that cannot span nodes), then the profile's own arguments.
    The agent recomputes the rank flags from the spec's ``group`` and
    refuses any other."""
    return policy_launch_args(
        default_policy(),
        eng.name,
        source=source,
        port=port,
        model=model,
        tp=tp,
        args=list(args),
        group=group,
    )
