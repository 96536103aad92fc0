"""Reading ``policy.toml`` (see its header for every key) into the data model,
checked: a ``PolicyError`` names the table and key of the first thing wrong."""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .group import load_group
from .kinds import FIGURE_KINDS, FIGURE_NAME, JSON_KINDS, KINDS
from .model import PLACEHOLDERS, EnginePolicy, Limits, Policy, PolicyError, ValueRule
from .tokens import ENV_NAME, is_flag

POLICY_PATH = Path(__file__).with_name("policy.toml")


def load_policy(path: Path | None = None) -> Policy:
    """The policy in ``path`` (``policy.toml`` beside this module by default),
    checked; ``PolicyError`` naming the table and key of the first thing wrong."""
    path = Path(path or POLICY_PATH)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"{path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{path.name}: not valid TOML: {exc}") from None
    try:
        return _policy(data, digest="sha256:" + hashlib.sha256(raw).hexdigest(), path=path)
    except PolicyError as exc:
        raise PolicyError(f"{path.name}: {exc}") from None


_default: Policy | None = None


def default_policy() -> Policy:
    """The shipped policy, loaded once per process."""
    global _default
    if _default is None:
        _default = load_policy()
    return _default


def _table(data: Any, where: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PolicyError(f"{where}: must be a table")
    return data


def _reasons(data: Any, where: str) -> dict[str, str]:
    table = _table(data, where)
    for key, value in table.items():
        if not isinstance(value, str) or not value.strip():
            raise PolicyError(f"{where}, key {key!r}: the reason must be a sentence")
    return dict(table)


def _strings(data: Any, where: str) -> tuple[str, ...]:
    if data is None:
        return ()
    if not isinstance(data, list) or not all(isinstance(item, str) and item for item in data):
        raise PolicyError(f"{where}: must be a list of strings")
    return tuple(data)


def _rule(entry: Any, where: str, sources: Mapping[str, str]) -> ValueRule:
    if not isinstance(entry, dict):
        raise PolicyError(f"{where}: must be a table with value and src")
    unknown = set(entry) - {"value", "choices", "min", "max", "keys", "secret", "api_key", "src"}
    if unknown:
        raise PolicyError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    kind = entry.get("value")
    if kind not in KINDS:
        raise PolicyError(f"{where}, key 'value': must be one of {', '.join(KINDS)}, not {kind!r}")
    src = entry.get("src")
    if not isinstance(src, str) or src not in sources:
        raise PolicyError(f"{where}, key 'src': {src!r} is not one of the sources {sorted(sources)}")
    choices = _strings(entry.get("choices"), f"{where}, key 'choices'")
    if kind == "choice" and not choices:
        raise PolicyError(f"{where}: a choice needs its choices")
    keys = _table(entry.get("keys"), f"{where}, key 'keys'")
    for key, key_kind in keys.items():
        if key_kind not in JSON_KINDS:
            raise PolicyError(f"{where}, keys.{key}: must be one of {', '.join(JSON_KINDS)}")
    if kind == "json" and not keys:
        raise PolicyError(f"{where}: a json value needs the keys it may hold")
    if kind == "figures":
        if not keys:
            raise PolicyError(f"{where}: a figures value needs the names it may hold, in keys")
        for key, key_kind in keys.items():
            if key_kind not in FIGURE_KINDS or not FIGURE_NAME.fullmatch(key):
                raise PolicyError(
                    f"{where}, keys.{key}: a figure's name is lower-case letters and '_', its kind int or float"
                )
    bounds = []
    for key in ("min", "max"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise PolicyError(f"{where}, key {key!r}: must be a number")
        if value is None and kind == "figures":
            raise PolicyError(f"{where}: a figures value needs its bounds, min and max")
        bounds.append(value)
    secret = entry.get("secret", False)
    if not isinstance(secret, bool):
        raise PolicyError(f"{where}, key 'secret': must be true or false")
    api_key = entry.get("api_key", False)
    if not isinstance(api_key, bool) or (api_key and not secret):
        raise PolicyError(f"{where}, key 'api_key': must be true or false, and true only on a secret")
    return ValueRule(
        kind=kind,
        choices=choices,
        minimum=bounds[0],
        maximum=bounds[1],
        keys=dict(keys),
        secret=secret,
        api_key=api_key,
        source=sources[src],
    )


def _env_rules(data: Any, where: str, sources: Mapping[str, str]) -> dict[str, ValueRule]:
    rules = {}
    for name, entry in _table(data, where).items():
        if not ENV_NAME.fullmatch(name):
            raise PolicyError(f"{where}: {name!r} is not an environment variable name")
        rules[name] = _rule(entry, f"{where}.{name}", sources)
    return rules


_ENGINE_KEYS = {
    "version",
    "launch",
    "tp_flag",
    "tp_flags",
    "context_flags",
    "tp_env",
    "context_env",
    "revision_flag",
    "underscores_as_dashes",
    "equals",
    "abbreviations",
    "sources",
    "owned",
    "refused",
    "args",
    "owned_env",
    "refused_env",
    "env",
    "group",
}


def _engine(name: str, table: dict[str, Any], shared_sources: Mapping[str, str]) -> EnginePolicy:
    where = f"engines.{name}"
    unknown = set(table) - _ENGINE_KEYS
    if unknown:
        raise PolicyError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    sources = {**shared_sources, **_reasons(table.get("sources"), f"{where}.sources")}
    parsing = _parsing(table, where)
    launch = _launch(table, where)
    owned = _reasons(table.get("owned"), f"{where}.owned")
    refused = _reasons(table.get("refused"), f"{where}.refused")
    tp_flags = _strings(table.get("tp_flags"), f"{where}, key 'tp_flags'")
    context_flags = _strings(table.get("context_flags"), f"{where}, key 'context_flags'")
    for key, spellings in (("tp_flags", tp_flags), ("context_flags", context_flags)):
        missing = [flag for flag in spellings if flag not in owned]
        if missing:
            raise PolicyError(f"{where}, key {key!r}: {missing[0]} must also be in {where}.owned, with why")
    tp_flag = table.get("tp_flag")
    if tp_flag is not None and tp_flag not in tp_flags:
        raise PolicyError(f"{where}, key 'tp_flag': {tp_flag} must also be in tp_flags")
    revision_flag = table.get("revision_flag")
    if revision_flag is not None and not isinstance(revision_flag, str):
        raise PolicyError(f"{where}, key 'revision_flag': must be a flag")
    args, aliases = _args(table, where, sources)
    eng = EnginePolicy(
        name=name,
        version=str(table.get("version", "")),
        launch=launch,
        tp_flag=tp_flag,
        tp_flags=tp_flags,
        context_flags=context_flags,
        tp_env=_strings(table.get("tp_env"), f"{where}, key 'tp_env'"),
        context_env=_strings(table.get("context_env"), f"{where}, key 'context_env'"),
        revision_flag=revision_flag,
        underscores_as_dashes=parsing["underscores_as_dashes"],
        equals=parsing["equals"],
        abbreviations=parsing["abbreviations"],
        owned=owned,
        refused=refused,
        args=args,
        aliases=aliases,
        owned_env=_reasons(table.get("owned_env"), f"{where}.owned_env"),
        refused_env=_reasons(table.get("refused_env"), f"{where}.refused_env"),
        env=_env_rules(table.get("env"), f"{where}.env", sources),
        sources=sources,
        group=load_group(table.get("group"), f"{where}.group", owned, sources),
    )
    _check_spellings(eng, where)
    return eng


def _parsing(table: dict[str, Any], where: str) -> dict[str, bool]:
    """How the engine's parser reads flags: each key true or false."""
    flags: dict[str, bool] = {}
    for key in ("underscores_as_dashes", "equals", "abbreviations"):
        value = table.get(key)
        if not isinstance(value, bool):
            raise PolicyError(f"{where}, key {key!r}: must be true or false")
        flags[key] = value
    return flags


def _launch(table: dict[str, Any], where: str) -> tuple[str, ...]:
    """The launch template: it passes the checkpoint, with known placeholders only."""
    launch = _strings(table.get("launch"), f"{where}, key 'launch'")
    if not any("{source}" in token for token in launch):
        raise PolicyError(f"{where}, key 'launch': must pass the checkpoint, {{source}}")
    for token in launch:
        for placeholder in re.findall(r"\{[^{}]*\}", token):
            if placeholder not in PLACEHOLDERS:
                raise PolicyError(f"{where}, key 'launch': unknown placeholder {placeholder}")
    return launch


def _args(
    table: dict[str, Any], where: str, sources: Mapping[str, str]
) -> tuple[dict[str, ValueRule], dict[str, str]]:
    """The allowed flags with their rules, and every spelling (a listed flag
    and each ``same = ...`` alias) with the flag it is listed under."""
    args: dict[str, ValueRule] = {}
    aliases: dict[str, str] = {}
    raw_args = _table(table.get("args"), f"{where}.args")
    for flag, entry in raw_args.items():
        if not is_flag(flag) or "=" in flag:
            raise PolicyError(f"{where}.args: {flag!r} is not a flag")
        if isinstance(entry, dict) and set(entry) == {"same"}:
            target = entry["same"]
            if target not in raw_args or "same" in raw_args[target]:
                raise PolicyError(f"{where}.args.{flag}: same = {target!r} must name a listed flag")
            aliases[flag] = target
        else:
            args[flag] = _rule(entry, f"{where}.args.{flag}", sources)
    for flag in list(args):
        aliases[flag] = flag
    return args, aliases


def _check_spellings(eng: EnginePolicy, where: str) -> None:
    """A spelling is one thing only: owned, refused or allowed; the TP and
    context flags are written as the parser reads them."""
    seen: dict[str, str] = {}
    groups: tuple[tuple[str, Iterable[str]], ...] = (
        ("owned", eng.owned),
        ("refused", eng.refused),
        ("args", eng.aliases),
    )
    for group, group_spellings in groups:
        for flag in group_spellings:
            canon = eng.canonical(flag)
            if canon in seen:
                raise PolicyError(f"{where}: {flag} is both in {seen[canon]} and in {group}")
            seen[canon] = group
    for flag in eng.tp_flags + eng.context_flags:
        if eng.canonical(flag) != flag:
            raise PolicyError(f"{where}: write {flag} as the parser reads it, {eng.canonical(flag)}")


def _policy(data: dict[str, Any], *, digest: str, path: Path) -> Policy:
    unknown = set(data) - {"limits", "agent_env", "refused_env", "env", "sources", "engines"}
    if unknown:
        raise PolicyError(f"unknown top-level key {sorted(unknown)[0]!r}")
    sources = _reasons(data.get("sources"), "sources")
    raw_limits = _table(data.get("limits"), "limits")
    values = {}
    for key in Limits.__dataclass_fields__:
        value = raw_limits.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PolicyError(f"limits, key {key!r}: must be a whole number above 0")
        values[key] = value
    engines_table = _table(data.get("engines"), "engines")
    if not engines_table:
        raise PolicyError("no engines")
    engines = {
        name: _engine(name, _table(t, f"engines.{name}"), sources) for name, t in engines_table.items()
    }
    return Policy(
        engines=engines,
        limits=Limits(**values),
        agent_env=_reasons(data.get("agent_env"), "agent_env"),
        refused_env=_reasons(data.get("refused_env"), "refused_env"),
        env=_env_rules(data.get("env"), "env", sources),
        sources=sources,
        digest=digest,
        path=path,
    )
