"""The launch policy: what a profile may pass to an engine, read from
``policy.toml`` beside this module (see its header for every key).

One interpreter for the control plane and the node agent. Both call
``check_profile`` (the control plane on every write path and when it builds a
spec; the agent on the part of a spec after the launcher's own arguments) and
the agent calls ``check_spec`` on the whole spec. Standard library only: the
agent imports this on GPU nodes with nothing else installed.

Arguments are read the way each engine's parser reads them: "_" as "-" where
the parser folds them (vLLM, llama.cpp), ``--flag=value`` where it splits them
(argparse, click), the next token as a flag's value. Only the exact spellings
listed pass; anything else (an abbreviation, a dotted vLLM key, a positional
token, a value that looks like a flag) is refused with a sentence that says
which argument and why.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POLICY_PATH = Path(__file__).with_name("policy.toml")
KINDS = ("switch", "int", "float", "choice", "name", "bool", "token", "figures", "json")
JSON_KINDS = ("int", "float", "bool", "name", "int_list")
PLACEHOLDERS = ("{source}", "{port}", "{model}")

_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
_TOKEN = re.compile(r"[A-Za-z0-9_.~+/=:-]{1,512}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# name=number pairs, comma-separated: figures only, so nothing a path, host or code could hide in.
_FIGURES = re.compile(r"[a-z_]{1,32}=\d{1,9}(\.\d{1,6})?(,[a-z_]{1,32}=\d{1,9}(\.\d{1,6})?){0,31}")
_BOOLS = {"1", "0", "true", "false", "yes", "no", "on", "off"}
_PLACEHOLDER = re.compile(r"\{(source|port|model)\}")
# huggingface_hub's validate_repo_id: [\w.-] names, at most 96 characters,
# neither "--" nor ".." inside; here the "org/" part is required.
_REPO_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_PATH_CHARS = re.compile(r"[A-Za-z0-9_.@+=,/-]+")

HOW_TO_ADD = "docs/engine-policy.md says how an operator who has checked one adds it"


class PolicyError(ValueError):
    """The policy file is wrong; the message names the table and the key."""


@dataclass(frozen=True)
class Refusal:
    """Why something may not reach an engine. ``code``: refused_arg,
    refused_env, refused_source, launch_mismatch or too_large; ``subject``:
    the argument or variable named."""

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
    source: str = ""


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

    def canonical(self, name: str) -> str:
        """``name`` as this engine's parser looks it up."""
        if self.underscores_as_dashes and name.startswith("--"):
            return "--" + name[2:].replace("_", "-")
        return name

    def secret_env(self, everywhere: Mapping[str, ValueRule]) -> frozenset[str]:
        rules = {**everywhere, **self.env}
        return frozenset(name for name, rule in rules.items() if rule.secret)


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


# -- loading ---------------------------------------------------------------------------


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
    unknown = set(entry) - {"value", "choices", "min", "max", "keys", "secret", "src"}
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
    bounds = []
    for key in ("min", "max"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise PolicyError(f"{where}, key {key!r}: must be a number")
        bounds.append(value)
    secret = entry.get("secret", False)
    if not isinstance(secret, bool):
        raise PolicyError(f"{where}, key 'secret': must be true or false")
    return ValueRule(
        kind=kind,
        choices=choices,
        minimum=bounds[0],
        maximum=bounds[1],
        keys=dict(keys),
        secret=secret,
        source=sources[src],
    )


def _env_rules(data: Any, where: str, sources: Mapping[str, str]) -> dict[str, ValueRule]:
    rules = {}
    for name, entry in _table(data, where).items():
        if not _ENV_NAME.fullmatch(name):
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
}


def _engine(name: str, table: dict[str, Any], shared_sources: Mapping[str, str]) -> EnginePolicy:
    where = f"engines.{name}"
    unknown = set(table) - _ENGINE_KEYS
    if unknown:
        raise PolicyError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    sources = {**shared_sources, **_reasons(table.get("sources"), f"{where}.sources")}
    flags: dict[str, bool] = {}
    for key in ("underscores_as_dashes", "equals", "abbreviations"):
        value = table.get(key)
        if not isinstance(value, bool):
            raise PolicyError(f"{where}, key {key!r}: must be true or false")
        flags[key] = value
    launch = _strings(table.get("launch"), f"{where}, key 'launch'")
    if not any("{source}" in token for token in launch):
        raise PolicyError(f"{where}, key 'launch': must pass the checkpoint, {{source}}")
    for token in launch:
        for placeholder in re.findall(r"\{[^{}]*\}", token):
            if placeholder not in PLACEHOLDERS:
                raise PolicyError(f"{where}, key 'launch': unknown placeholder {placeholder}")

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

    args: dict[str, ValueRule] = {}
    aliases: dict[str, str] = {}
    raw_args = _table(table.get("args"), f"{where}.args")
    for flag, entry in raw_args.items():
        if not _is_flag(flag) or "=" in flag:
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
        underscores_as_dashes=flags["underscores_as_dashes"],
        equals=flags["equals"],
        abbreviations=flags["abbreviations"],
        owned=owned,
        refused=refused,
        args=args,
        aliases=aliases,
        owned_env=_reasons(table.get("owned_env"), f"{where}.owned_env"),
        refused_env=_reasons(table.get("refused_env"), f"{where}.refused_env"),
        env=_env_rules(table.get("env"), f"{where}.env", sources),
        sources=sources,
    )
    # A spelling is one thing only: owned, refused or allowed.
    seen: dict[str, str] = {}
    groups: tuple[tuple[str, Iterable[str]], ...] = (
        ("owned", owned),
        ("refused", refused),
        ("args", aliases),
    )
    for group, group_spellings in groups:
        for flag in group_spellings:
            canon = eng.canonical(flag)
            if canon in seen:
                raise PolicyError(f"{where}: {flag} is both in {seen[canon]} and in {group}")
            seen[canon] = group
    for flag in tp_flags + context_flags:
        if eng.canonical(flag) != flag:
            raise PolicyError(f"{where}: write {flag} as the parser reads it, {eng.canonical(flag)}")
    return eng


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


# -- reading arguments -----------------------------------------------------------------


def _is_flag(token: str) -> bool:
    """A token that reads as a flag: it starts with "-", is longer than one
    character and is not a negative number."""
    return len(token) > 1 and token.startswith("-") and not _NUMBER.fullmatch(token)


is_flag = _is_flag


@dataclass(frozen=True)
class Occurrence:
    """One flag of an argument list as the engine reads it."""

    written: str  # the name as written (before "=")
    canonical: str  # as the parser looks it up
    value: str | None  # None: no value taken
    index: int
    joined: bool  # written --flag=value


def _split(eng: EnginePolicy, token: str) -> tuple[str, str | None]:
    if "=" in token and eng.equals:
        name, value = token.split("=", 1)
        return name, value
    return token, None


def _abbreviates(eng: EnginePolicy, canon: str) -> str | None:
    """The owned or refused flag an argparse engine would read ``canon`` as."""
    if not (eng.abbreviations and canon.startswith("--") and len(canon) > 2):
        return None
    for flag in (*eng.owned, *eng.refused):
        if flag.startswith("--") and eng.canonical(flag).startswith(canon):
            return flag
    return None


def _value_problem(rule: ValueRule, value: str) -> str | None:
    """What is wrong with ``value`` for ``rule``, or None."""
    if rule.kind in ("int", "float"):
        pattern = _INT if rule.kind == "int" else _FLOAT
        if not pattern.fullmatch(value.strip()):
            return "must be a whole number" if rule.kind == "int" else "must be a number"
        number = int(value) if rule.kind == "int" else float(value)
        if not math.isfinite(number):
            return "must be a finite number"
        if rule.minimum is not None and number < rule.minimum:
            return f"must be at least {rule.minimum:g}"
        if rule.maximum is not None and number > rule.maximum:
            return f"must be at most {rule.maximum:g}"
        return None
    if rule.kind == "choice":
        return None if value in rule.choices else f"must be one of {', '.join(rule.choices)}"
    if rule.kind == "name":
        return None if _NAME.fullmatch(value) else "must be a plain name (letters, digits, '_', '-', '.')"
    if rule.kind == "bool":
        return None if value.strip().lower() in _BOOLS else "must be 1, 0, true or false"
    if rule.kind == "token":
        return (
            None if _TOKEN.fullmatch(value) else "must be a token of letters, digits and _.~+/=:- (no spaces)"
        )
    if rule.kind == "figures":
        return None if _FIGURES.fullmatch(value) else "must be name=number pairs separated by commas"
    if rule.kind == "json":
        return _json_problem(rule, value)
    return None


def _json_problem(rule: ValueRule, value: str) -> str | None:
    try:
        data = json.loads(value)
    except ValueError:
        return "must be a JSON object"
    if not isinstance(data, dict):
        return "must be a JSON object"
    for key, item in data.items():
        kind = rule.keys.get(key)
        if kind is None:
            return (
                f"holds the key {key!r}, which is not one of the keys checked as safe "
                f"({', '.join(sorted(rule.keys))}): a key can name a model, a path or code to load"
            )
        ok = {
            "int": isinstance(item, int) and not isinstance(item, bool),
            "float": isinstance(item, int | float) and not isinstance(item, bool),
            "bool": isinstance(item, bool),
            "name": isinstance(item, str) and bool(_NAME.fullmatch(item)),
            "int_list": isinstance(item, list)
            and len(item) <= 1024
            and all(isinstance(i, int) and not isinstance(i, bool) for i in item),
        }[kind]
        if not ok:
            return f"has {key!r} = {json.dumps(item)[:60]}, which must be {kind.replace('_', ' of ')}"
    return None


def _shown(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_profile(
    policy: Policy,
    engine: str,
    args: Sequence[str],
    env: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    *,
    context: bool = True,
    context_max: int | None = None,
) -> list[Refusal]:
    """Every reason the arguments and environment of a profile of ``engine``
    may not be passed; empty when they may.

    ``context``: the engine's context flag may appear once (the context
    operation wrote it), at most ``context_max`` when that is known; when
    False it is refused like the launcher's other flags.
    """
    eng = policy.engines.get(engine)
    if eng is None:
        known = ", ".join(sorted(policy.engines))
        return [
            Refusal(
                "refused_arg",
                engine,
                f"The engine {engine!r} is not in the launch policy (it knows {known}), "
                "so nobody has said which of its arguments are safe.",
            )
        ]
    # By name, as the agent holds a spec's environment: both sides say the same first.
    pairs = sorted(list(env.items()) if isinstance(env, Mapping) else list(env), key=lambda kv: str(kv[0]))
    out = _limits(policy.limits, args, pairs)
    if out:
        return out
    out += _check_args(
        eng, args, context=context, context_max=context_max, max_context=policy.limits.max_context
    )
    out += _check_env(policy, eng, pairs)
    # A flag given twice is one reason, said once.
    unique: dict[tuple[str, str], Refusal] = {}
    for refusal in out:
        unique.setdefault((refusal.subject, refusal.sentence), refusal)
    return list(unique.values())


def _limits(limits: Limits, args: Sequence[str], env: list[tuple[str, str]]) -> list[Refusal]:
    out = []
    if len(args) > limits.max_args:
        out.append(
            Refusal(
                "too_large",
                "args",
                f"The profile has {len(args)} arguments; at most {limits.max_args} are accepted.",
            )
        )
    sizes = [len(a.encode("utf-8", "surrogatepass")) for a in args]
    for arg, size in zip(args, sizes, strict=True):
        if size > limits.max_arg_bytes:
            out.append(
                Refusal(
                    "too_large",
                    _shown(arg, 30),
                    f"The argument {_shown(arg, 30)!r} is {size} bytes; at most {limits.max_arg_bytes} are accepted.",
                )
            )
            break
    if sum(sizes) > limits.max_args_bytes:
        out.append(
            Refusal(
                "too_large",
                "args",
                f"The arguments are {sum(sizes)} bytes together; at most {limits.max_args_bytes} are accepted.",
            )
        )
    if len(env) > limits.max_env:
        out.append(
            Refusal(
                "too_large",
                "env",
                f"The environment has {len(env)} variables; at most {limits.max_env} are accepted.",
            )
        )
    total = 0
    for name, value in env:
        size = len(str(value).encode("utf-8", "surrogatepass"))
        total += size + len(str(name).encode("utf-8", "surrogatepass"))
        if size > limits.max_env_value_bytes:
            out.append(
                Refusal(
                    "too_large",
                    str(name),
                    f"The environment variable {_shown(str(name), 40)} is {size} bytes long; "
                    f"at most {limits.max_env_value_bytes} are accepted.",
                )
            )
            break
    if total > limits.max_env_bytes:
        out.append(
            Refusal(
                "too_large",
                "env",
                f"The environment is {total} bytes together; at most {limits.max_env_bytes} are accepted.",
            )
        )
    return out


def _check_args(
    eng: EnginePolicy, args: Sequence[str], *, context: bool, context_max: int | None, max_context: int
) -> list[Refusal]:
    out: list[Refusal] = []
    seen_context = 0
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not isinstance(token, str):
            out.append(Refusal("refused_arg", repr(token), "Every argument must be a string."))
            continue
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in token):
            out.append(
                Refusal(
                    "refused_arg",
                    _shown(token),
                    f"The argument {_shown(token)!r} holds control characters.",
                )
            )
            continue
        if not _is_flag(token):
            out.append(
                Refusal(
                    "refused_arg",
                    _shown(token),
                    f"{_shown(token)!r} is not an argument a profile may pass to {eng.name}: it is not "
                    "a listed flag nor the value of one (the launcher gives the model; every other "
                    "argument is a flag from the engine's list).",
                )
            )
            continue
        written, joined_value = _split(eng, token)
        canon = eng.canonical(written)
        read = "" if canon == written else f" (read as {canon})"
        refused_for = f"{written} is refused for {eng.name}{read}"

        if "=" in token and not eng.equals:
            written = token.split("=", 1)[0]
            head = eng.canonical(written)
            known = _lookup(eng, eng.refused, head) or _lookup(eng, eng.owned, head)
            if known is not None:
                # The engine would not read it, but it says what was meant: name that.
                how = "" if head == written else f" (read as {head})"
                why = (
                    known[1]
                    if known[1] in eng.refused.values()
                    else f"the launcher sets it, not a profile ({known[1]})"
                )
                out.append(
                    Refusal("refused_arg", written, f"{written} is refused for {eng.name}{how}: {why}.")
                )
                continue
            out.append(
                Refusal(
                    "refused_arg",
                    _shown(token),
                    f"{_shown(token)} is refused for {eng.name}: its parser does not split "
                    f"--flag=value (it would read the whole token as a flag); write {head} and its "
                    "value as two arguments.",
                )
            )
            continue
        if canon in eng.context_flags and context:
            seen_context += 1
            value = joined_value
            if value is None:
                value = args[i] if i < len(args) else None
                i += 1
            problem = None
            if value is None or _is_flag(value) or not _INT.fullmatch(value.strip()):
                problem = "needs a whole number of tokens"
            elif int(value) < 1:
                problem = "must be at least 1"
            elif context_max is not None and int(value) > context_max:
                problem = f"is above the model's context length, {context_max} tokens"
            elif int(value) > max_context:
                problem = f"is above the longest context the launch policy allows, {max_context} tokens"
            elif seen_context > 1:
                problem = "is given twice; the context operation writes it once"
            if problem:
                out.append(
                    Refusal(
                        "refused_arg",
                        written,
                        f"{refused_for}: the context flag {problem}; it is set by the context operation.",
                    )
                )
            continue
        owned = _lookup(eng, eng.owned, canon)
        if owned is not None:
            flag, why = owned
            out.append(
                Refusal(
                    "refused_arg",
                    written,
                    f"{refused_for}: the launcher sets it, not a profile ({why}).",
                )
            )
            i = _skip_value(args, i, joined_value)
            continue
        refused = _lookup(eng, eng.refused, canon)
        if refused is not None:
            flag, why = refused
            out.append(Refusal("refused_arg", written, f"{refused_for}: {why}."))
            i = _skip_value(args, i, joined_value)
            continue
        target = eng.aliases.get(canon)
        if target is None:
            out.append(_not_listed(eng, written, canon, refused_for))
            i = _skip_value(args, i, joined_value)
            continue
        rule = eng.args[target]
        if rule.kind == "switch":
            if joined_value is not None:
                out.append(
                    Refusal("refused_arg", written, f"{refused_for}: it takes no value, but was given one.")
                )
            continue
        value = joined_value
        if value is None:
            if i >= len(args):
                out.append(
                    Refusal("refused_arg", written, f"{refused_for}: it needs a value, and none follows.")
                )
                continue
            value = args[i]
            i += 1
            if _is_flag(value):
                out.append(
                    Refusal(
                        "refused_arg",
                        written,
                        f"{refused_for}: its value {_shown(value)!r} looks like a flag; "
                        f"write {written}=VALUE or give it a value.",
                    )
                )
                continue
        problem = _value_problem(rule, value)
        if problem:
            out.append(
                Refusal(
                    "refused_arg",
                    written,
                    f"{refused_for}: its value {_shown(value)!r} {problem}.",
                )
            )
    return out


def _skip_value(args: Sequence[str], i: int, joined_value: str | None) -> int:
    """After a refused flag, its value (when it has one) is not a second refusal."""
    if joined_value is None and i < len(args) and not _is_flag(args[i]):
        return i + 1
    return i


def _lookup(eng: EnginePolicy, table: Mapping[str, str], canon: str) -> tuple[str, str] | None:
    for flag, why in table.items():
        if eng.canonical(flag) == canon:
            return flag, why
    return None


def _not_listed(eng: EnginePolicy, written: str, canon: str, refused_for: str) -> Refusal:
    if eng.name == "vllm" and "." in canon and canon.startswith("--"):
        head = canon.split(".", 1)[0]
        return Refusal(
            "refused_arg",
            written,
            f"{refused_for}: vLLM reads it as a key of {head}'s JSON; give {head} a JSON "
            "object with the keys the policy lists, if it lists the flag.",
        )
    prefix_of = _abbreviates(eng, canon)
    if prefix_of is not None:
        why = eng.owned.get(prefix_of) or eng.refused.get(prefix_of)
        return Refusal(
            "refused_arg",
            written,
            f"{refused_for}: its parser reads it as {prefix_of}, and {why}.",
        )
    listed = [flag for flag in eng.aliases if flag.startswith("--") and eng.canonical(flag).startswith(canon)]
    hint = f" (write it in full: {', '.join(listed[:3])})" if listed and canon.startswith("--") else ""
    return Refusal(
        "refused_arg",
        written,
        f"{refused_for}: it is not on {eng.name}'s list of arguments a profile may pass{hint}; "
        f"an operator who has checked in {eng.name}'s own parser that it reads no files, fetches "
        f"nothing and loads no code can add it under [engines.{eng.name}.args] in the launch policy "
        f"({HOW_TO_ADD}).",
    )


def _prefixed(table: Mapping[str, str], name: str) -> str | None:
    if name in table:
        return table[name]
    for key, why in table.items():
        if key.endswith("*") and name.startswith(key[:-1]):
            return why
    return None


def _check_env(policy: Policy, eng: EnginePolicy, env: list[tuple[str, str]]) -> list[Refusal]:
    out = []
    for name, value in env:
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            out.append(
                Refusal(
                    "refused_env",
                    _shown(str(name)),
                    f"{_shown(str(name))!r} is not an environment variable name: use letters, digits and '_'.",
                )
            )
            continue
        if not isinstance(value, str):
            out.append(
                Refusal("refused_env", name, f"The environment variable {name} must have a string value.")
            )
            continue
        if name in policy.agent_env:
            out.append(
                Refusal(
                    "refused_env",
                    name,
                    f"{name} is set by the node agent, not by a profile: {policy.agent_env[name]}.",
                )
            )
            continue
        why = _prefixed(eng.owned_env, name)
        if why is not None:
            out.append(
                Refusal(
                    "refused_env",
                    name,
                    f"The environment variable {name} is refused for {eng.name}: the launcher sets it, not a profile ({why}).",
                )
            )
            continue
        why = _prefixed(eng.refused_env, name)
        if why is None and name not in eng.env:
            why = _prefixed(policy.refused_env, name)
        if why is not None:
            out.append(
                Refusal(
                    "refused_env", name, f"The environment variable {name} is refused for {eng.name}: {why}."
                )
            )
            continue
        rule = eng.env.get(name) or policy.env.get(name)
        if rule is None:
            out.append(
                Refusal(
                    "refused_env",
                    name,
                    f"The environment variable {name} is not on {eng.name}'s list of variables a profile "
                    f"may set; an operator who has checked that it names no path, host or code can add "
                    f"it under [engines.{eng.name}.env] in the launch policy ({HOW_TO_ADD}).",
                )
            )
            continue
        if "\0" in value:
            out.append(
                Refusal("refused_env", name, f"The environment variable {name} holds a NUL character.")
            )
            continue
        problem = _value_problem(rule, value)
        if problem:
            shown = "(secret)" if rule.secret else repr(_shown(value))
            out.append(
                Refusal(
                    "refused_env",
                    name,
                    f"The environment variable {name} is refused for {eng.name}: its value {shown} {problem}.",
                )
            )
    return out


# -- the model's source ----------------------------------------------------------------


def parse_roots(text: str) -> tuple[str, ...]:
    """Model roots from a comma- or colon-separated list; empty items dropped."""
    return tuple(part.strip().rstrip("/") or "/" for part in re.split(r"[,:]", text or "") if part.strip())


def split_source(source: str) -> tuple[str, str | None]:
    """A repo id source as (repo, revision); a path as (path, None)."""
    if not source.startswith("/") and "@" in source:
        repo, revision = source.rsplit("@", 1)
        return repo, revision
    return source, None


def source_refusal(source: str, roots: Sequence[str]) -> Refusal | None:
    """Why ``source`` cannot be a model's source, or None: it must be a
    Hugging Face repo id (``org/name``, optionally ``@revision``) or an
    absolute path under one of ``roots``."""
    if not isinstance(source, str) or not source:
        return Refusal("refused_source", "source", "A model's source must be a repo id or a path.")
    shown = _shown(source)
    if source.startswith("/"):
        if not roots:
            return Refusal(
                "refused_source",
                "source",
                f"The source {shown!r} is a path, and no model roots are configured: set "
                "LLMGW_MODEL_ROOTS (and model_roots on the agents) to the directories models live in, "
                "or give a Hugging Face repo id.",
            )
        if (
            not _PATH_CHARS.fullmatch(source)
            or os.path.normpath(source) != source
            or "/../" in source + "/"
            or "/./" in source + "/"
        ):
            return Refusal(
                "refused_source",
                "source",
                f"The source {shown!r} is not a plain absolute path (no '..', '.', '//', trailing '/' "
                "or characters beyond letters, digits and _.@+=,-).",
            )
        for root in roots:
            if root == "/" or source == root or source.startswith(root + "/"):
                return None
        return Refusal(
            "refused_source",
            "source",
            f"The source {shown!r} is not under the model roots ({', '.join(roots)}); "
            "move the checkpoint there or ask an operator to add its directory to LLMGW_MODEL_ROOTS.",
        )
    repo, revision = split_source(source)
    parts = repo.split("/")
    ok = (
        len(parts) == 2
        and all(_REPO_PART.fullmatch(p) for p in parts)
        and len(repo) <= 96
        and "--" not in repo
        and ".." not in repo
        and not repo.endswith(".git")
    )
    if ok and revision is not None and not _REVISION.fullmatch(revision):
        return Refusal(
            "refused_source",
            "source",
            f"The revision in {shown!r} must be a branch, tag or commit: letters, digits, '_', '-', '.'.",
        )
    if not ok:
        return Refusal(
            "refused_source",
            "source",
            f"The source {shown!r} is neither a Hugging Face repo id (org/name, optionally @revision) "
            "nor an absolute path under the model roots.",
        )
    return None


# -- the launcher's part and a whole spec ------------------------------------------------


def launch_args(
    policy: Policy, engine: str, *, source: str, port: int, model: str, tp: int, args: Sequence[str]
) -> list[str]:
    """The arguments a replica starts with (after the agent's program): the
    engine's launch template filled in, the revision when the source pins
    one, the TP width for a tensor-parallel engine, then the profile's own."""
    eng = policy.engines[engine]
    repo, revision = split_source(source)
    values = {"{source}": repo, "{port}": str(port), "{model}": model}
    out = [_PLACEHOLDER.sub(lambda m: values[m[0]], token) for token in eng.launch]
    if revision is not None and eng.revision_flag:
        out += [eng.revision_flag, revision]
    if eng.tp_flag:
        out += [eng.tp_flag, str(tp)]
    return [*out, *args]


def check_spec(
    policy: Policy,
    engine: str,
    args: Sequence[str],
    env: Mapping[str, str] | Iterable[tuple[str, str]],
    *,
    port: int,
    model: str,
    roots: Sequence[str] = (),
) -> list[Refusal]:
    """Every reason the agent may not start this spec: its arguments must
    begin with the engine's launch template naming the spec's own port and
    model and a checked source (then the revision and TP width the launcher
    writes), and what follows is checked as a profile's arguments."""
    eng = policy.engines.get(engine)
    if eng is None:
        return check_profile(policy, engine, args, env)
    own, refusal = _launcher_part(eng, args, port=port, model=model, roots=roots)
    if refusal is not None:
        return [refusal]
    return check_profile(policy, engine, args[own:], env)


def _launcher_part(
    eng: EnginePolicy, args: Sequence[str], *, port: int, model: str, roots: Sequence[str]
) -> tuple[int, Refusal | None]:
    def mismatch(sentence: str) -> tuple[int, Refusal]:
        return 0, Refusal("launch_mismatch", "args", sentence)

    template = eng.launch
    if len(args) < len(template):
        return mismatch(
            f"The arguments must begin with the launcher's own for {eng.name} "
            f"({' '.join(template)}), and they are shorter."
        )
    values: dict[str, str] = {}
    for pattern, token in zip(template, args, strict=False):
        match = re.fullmatch(_template_regex(pattern), token)
        if match is None:
            return mismatch(
                f"The arguments must begin with the launcher's own for {eng.name} "
                f"({' '.join(template)}); {_shown(token)!r} is not {pattern}."
            )
        values.update(match.groupdict())
    if values.get("port") != str(port):
        return mismatch(
            f"The launch arguments give port {values.get('port')}, but the spec's port is {port}."
        )
    if values.get("model") != model:
        return mismatch(
            f"The launch arguments serve the model as {values.get('model')!r}, but the spec's model is {model!r}."
        )
    source = values.get("source", "")
    i = len(template)
    if eng.revision_flag and i + 1 < len(args) and args[i] == eng.revision_flag:
        source = f"{source}@{args[i + 1]}"
        i += 2
    bad_source = source_refusal(source, roots)
    if bad_source is not None:
        return 0, bad_source
    if eng.tp_flag:
        if i + 1 >= len(args) or args[i] != eng.tp_flag or not re.fullmatch(r"[1-9]\d{0,2}", args[i + 1]):
            return mismatch(
                f"After the launch arguments the launcher writes {eng.tp_flag} and the width; "
                "they are missing or not a whole number from 1 to 999."
            )
        i += 2
    return i, None


def _template_regex(pattern: str) -> str:
    parts, seen, pos = [], set(), 0
    for match in _PLACEHOLDER.finditer(pattern):
        parts.append(re.escape(pattern[pos : match.start()]))
        parts.append(f"(?P={match[1]})" if match[1] in seen else f"(?P<{match[1]}>.+)")
        seen.add(match[1])
        pos = match.end()
    parts.append(re.escape(pattern[pos:]))
    return "".join(parts)
