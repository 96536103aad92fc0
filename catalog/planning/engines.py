"""The engine registry: each serving engine's spellings, spread, memory model
and refusals, read from ``engines.toml``.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from catalog.errors import DomainError
from catalog.planning.args import drop_where, flag_name, get_where, is_flag, parse_int
from catalog.planning.enginememory import EngineMemory, parse_memory
from catalog.planning.units import and_list

DEFAULT_PATH = Path(__file__).with_name("engines.toml")
SPREADS = ("tensor", "layers", "single")
PLACEHOLDERS = ("{source}", "{port}", "{model}")

_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CAPABILITY = re.compile(r"(\d+)\.(\d+)")


class RegistryError(ValueError):
    """The registry file is wrong; the message names the engine and the key."""


@dataclass(frozen=True)
class Engine:
    """One engine's entry in the registry (see ``engines.toml`` for each key)."""

    name: str
    spread: str
    tp_flags: tuple[str, ...]
    tp_flag: str | None
    context_flags: tuple[str, ...]
    min_capability: str
    memory: EngineMemory
    experts_on_card: bool
    launch: tuple[str, ...]
    refused_args: tuple[str, ...]
    refused_env: tuple[str, ...]
    refused_env_prefixes: tuple[str, ...]
    command: tuple[str, ...] = ()
    tp_env: tuple[str, ...] = ()
    context_env: tuple[str, ...] = ()
    reserved_env: tuple[str, ...] = ()
    underscores_as_dashes: bool = False
    abbreviations: bool = False


# -- loading -----------------------------------------------------------------

_REQUIRED = {
    "launch",
    "spread",
    "tp_flags",
    "context_flags",
    "min_capability",
    "memory",
    "experts_on_card",
    "refused_args",
    "refused_env",
    "refused_env_prefixes",
}
_OPTIONAL = {"command", "tp_flag", "tp_env", "context_env", "underscores_as_dashes", "abbreviations"}
_SHARED = {"refused_env_everywhere", "reserved_env"}


def load_registry(path: Path | None = None) -> dict[str, Engine]:
    """Every engine in the registry file (``engines.toml`` beside this module
    by default), checked. Raises ``RegistryError`` naming the engine and key
    of the first thing wrong."""
    path = path or DEFAULT_PATH
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{path.name}: not valid TOML: {exc}") from exc

    def fail(where: str, key: str, problem: str) -> RegistryError:
        return RegistryError(f"{path.name}: {where}, key {key!r}: {problem}")

    shared: dict[str, tuple[str, ...]] = {}
    tables: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            tables[key] = value
        elif key in _SHARED:
            shared[key] = _env_names(value, functools.partial(fail, "the top level", key))
        else:
            raise fail("the top level", key, f"unknown; expected an engine table or one of {sorted(_SHARED)}")
    if not tables:
        raise RegistryError(f"{path.name}: no engines")

    engines = {}
    for name, table in tables.items():
        engines[name] = _engine(
            name,
            table,
            everywhere=shared.get("refused_env_everywhere", ()),
            reserved=shared.get("reserved_env", ()),
            fail=functools.partial(fail, f"engine {name!r}"),
        )
    return engines


def _engine(
    name: str,
    table: dict[str, Any],
    *,
    everywhere: tuple[str, ...],
    reserved: tuple[str, ...],
    fail: Callable[[str, str], RegistryError],
) -> Engine:
    for key in table:
        if key not in _REQUIRED | _OPTIONAL:
            raise fail(key, "unknown key")
    for key in sorted(_REQUIRED - table.keys()):
        raise fail(key, "missing")

    def flags(key: str) -> tuple[str, ...]:
        return _flags(table.get(key, []), lambda problem: fail(key, problem))

    def env(key: str) -> tuple[str, ...]:
        return _env_names(table.get(key, []), lambda problem: fail(key, problem))

    def boolean(key: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise fail(key, f"must be true or false, not {value!r}")
        return value

    spread = table["spread"]
    if spread not in SPREADS:
        raise fail("spread", f"must be one of {', '.join(SPREADS)}, not {spread!r}")

    tp_flags = flags("tp_flags")
    tp_flag = table.get("tp_flag")
    if spread == "tensor":
        if not isinstance(tp_flag, str):
            raise fail("tp_flag", "a tensor-parallel engine needs the flag the launcher writes")
        _flags([tp_flag], lambda problem: fail("tp_flag", problem))
        if tp_flag not in tp_flags:
            raise fail("tp_flag", f"{tp_flag} must also be in tp_flags, so that a profile's own is dropped")
    elif tp_flag is not None:
        raise fail("tp_flag", f"only a tensor-parallel engine has one, and this one spreads by {spread}")

    capability = table["min_capability"]
    if not isinstance(capability, str) or parse_capability(capability) is None:
        raise fail("min_capability", f'must be a string like "8.0", not {capability!r}')

    memory = parse_memory(table["memory"], fail)

    launch = table["launch"]
    if not isinstance(launch, list) or not launch or not all(isinstance(t, str) for t in launch):
        raise fail("launch", "must be a non-empty list of strings")
    for token in launch:
        for placeholder in _PLACEHOLDER.findall(token):
            if placeholder not in PLACEHOLDERS:
                raise fail(
                    "launch",
                    f"unknown placeholder {placeholder}; the known ones are {', '.join(PLACEHOLDERS)}",
                )
    if not any("{source}" in token for token in launch):
        raise fail("launch", "must pass the checkpoint, {source}")

    command = table.get("command", [])
    if not isinstance(command, list) or not all(isinstance(t, str) and t for t in command):
        raise fail("command", "must be a list of non-empty strings")

    refused_args = flags("refused_args")
    context_flags = flags("context_flags")
    for key, own in (("tp_flags", tp_flags), ("context_flags", context_flags)):
        clash = sorted(set(own) & set(refused_args))
        if clash:
            raise fail(key, f"{', '.join(clash)} cannot be both the engine's own and refused")

    prefixes = env("refused_env_prefixes")
    if any(not p for p in prefixes):
        raise fail("refused_env_prefixes", "an empty prefix would refuse every variable")

    return Engine(
        name=name,
        spread=spread,
        tp_flags=tp_flags,
        tp_flag=tp_flag,
        context_flags=context_flags,
        min_capability=capability,
        memory=memory,
        experts_on_card=boolean("experts_on_card", True),
        launch=tuple(launch),
        refused_args=refused_args,
        refused_env=tuple(dict.fromkeys((*env("refused_env"), *everywhere))),
        refused_env_prefixes=prefixes,
        command=tuple(command),
        tp_env=env("tp_env"),
        context_env=env("context_env"),
        reserved_env=reserved,
        underscores_as_dashes=boolean("underscores_as_dashes", False),
        abbreviations=boolean("abbreviations", False),
    )


def _flags(value: object, fail: Callable[[str], RegistryError]) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise fail(f"must be a list of flags, not {value!r}")
    for flag in value:
        if not isinstance(flag, str) or not is_flag(flag) or "=" in flag or " " in flag:
            raise fail(f"{flag!r} is not a flag (it must start with '-', without '=' or spaces)")
    return tuple(value)


def _env_names(value: object, fail: Callable[[str], RegistryError]) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise fail(f"must be a list of variable names, not {value!r}")
    for name in value:
        # A prefix may end with "_", which the pattern allows; it may not be empty.
        if not isinstance(name, str) or (name and not _ENV_NAME.fullmatch(name)):
            raise fail(f"{name!r} is not an environment variable name")
    return tuple(value)


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


def with_context(eng: Engine, args: Sequence[str], tokens: int) -> list[str]:
    """``args`` with every spelling of the context flag dropped and the
    engine's first spelling set to ``tokens``."""
    if not eng.context_flags:
        raise DomainError(
            "no_context_flag", f"The {eng.name} engine has no context-length flag in the registry."
        )
    return [*drop_spellings(eng, args, eng.context_flags), eng.context_flags[0], str(tokens)]


# -- refusals and launching ----------------------------------------------------


def _env_keys(env: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[str]:
    if isinstance(env, Mapping):
        return list(env.keys())
    return [key for key, _ in env]


def refused(
    eng: Engine, args: Sequence[str], env: Mapping[str, str] | Iterable[tuple[str, str]] = ()
) -> list[str]:
    """A plain sentence for each argument and environment variable of a profile
    that this engine may not be given; empty when nothing is refused.

    Arguments are caught in both forms (``--flag v``, ``--flag=v``) and in
    every spelling the engine's parser accepts. The environment is a mapping
    or a sequence of (name, value) pairs.
    """
    sentences: list[str] = []
    seen: set[str] = set()
    for token in args:
        if not is_flag(token):
            continue
        name = flag_name(token)
        if name in seen:
            continue
        target = spelling_of(eng, name, eng.refused_args)
        if target is None:
            continue
        seen.add(name)
        reads = "flags that read files, fetch from the network or load code are not passed to an engine"
        if target == name:
            sentences.append(f"{name} is refused for {eng.name}: {reads}.")
        else:
            sentences.append(f"{name} is refused for {eng.name}: it is read as {target}, and {reads}.")
    for key in dict.fromkeys(_env_keys(env)):
        if key in eng.reserved_env:
            sentences.append(
                f"{key} is set by the node agent from the cards it assigns; a profile cannot set it."
            )
        elif key in eng.refused_env or any(key.startswith(p) for p in eng.refused_env_prefixes):
            sentences.append(
                f"The environment variable {key} is refused for {eng.name}: "
                "variables that name paths, other hosts or code to load are not passed to an engine."
            )
    return sentences


def launch_args(
    eng: Engine, *, source: str, port: int, model: str, tp: int, args: Sequence[str]
) -> list[str]:
    """The arguments the node agent starts the engine with (after
    ``eng.command``): the registry's template filled in, then the TP width
    for a tensor-parallel engine, then the profile's own arguments."""
    values = {"{source}": source, "{port}": str(port), "{model}": model}
    out = [_PLACEHOLDER.sub(lambda m: values.get(m[0], m[0]), token) for token in eng.launch]
    if eng.spread == "tensor" and eng.tp_flag:
        out += [eng.tp_flag, str(tp)]
    return [*out, *args]


def argv(eng: Engine, *, source: str, port: int, model: str, tp: int, args: Sequence[str]) -> list[str]:
    """The whole command line: ``eng.command`` then ``launch_args``."""
    return [*eng.command, *launch_args(eng, source=source, port=port, model=model, tp=tp, args=args)]
