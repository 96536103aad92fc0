"""Value kinds: what an allowed argument's or variable's value may be, and
the check that says what is wrong with one."""

from __future__ import annotations

import json
import math
import re

from .model import ValueRule
from .tokens import WHOLE_NUMBER

KINDS = ("switch", "int", "float", "choice", "name", "bool", "token", "figures", "json")
JSON_KINDS = ("int", "float", "bool", "name", "int_list")
FIGURE_KINDS = ("int", "float")
FIGURE_NAME = re.compile(r"[a-z_]{1,32}")
MAX_FIGURES = 32

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
_TOKEN = re.compile(r"[A-Za-z0-9_.~+/=:-]{1,512}")
# One name=number pair: figures only, so nothing a path, host or code could hide in.
_FIGURE = re.compile(r"([a-z_]{1,32})=(\d{1,9}(?:\.\d{1,6})?)")
_BOOLS = {"1", "0", "true", "false", "yes", "no", "on", "off"}


def value_problem(rule: ValueRule, value: str) -> str | None:
    """What is wrong with ``value`` for ``rule``, or None."""
    if rule.kind in ("int", "float"):
        return _number_problem(rule, value)
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
        return _figures_problem(rule, value)
    if rule.kind == "json":
        return _json_problem(rule, value)
    return None


def _number_problem(rule: ValueRule, value: str) -> str | None:
    pattern = WHOLE_NUMBER if rule.kind == "int" else _FLOAT
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


def plain_number(number: float) -> str:
    """A bound as an operator writes it: 16777216, 0.5 (not 1.67772e+07)."""
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def _figures_problem(rule: ValueRule, value: str) -> str | None:
    """name=number pairs, comma-separated: each name one of the rule's keys, once, each number of
    its key's kind and within the rule's bounds."""
    names = ", ".join(sorted(rule.keys))
    pairs = value.split(",")
    if not value or len(pairs) > MAX_FIGURES:
        return f"must be 1 to {MAX_FIGURES} name=number pairs separated by commas, the names among {names}"
    seen: set[str] = set()
    for pair in pairs:
        match = _FIGURE.fullmatch(pair.strip())
        if match is None:
            return f"must be name=number pairs separated by commas (names among {names}), not {pair.strip()[:40]!r}"
        name, number = match[1], match[2]
        if name not in rule.keys:
            return f"names the figure {name!r}, which is not one of {names}"
        if name in seen:
            return f"names the figure {name!r} twice"
        seen.add(name)
        if rule.keys[name] == "int" and "." in number:
            return f"has {name}={number}, which must be a whole number"
        figure = float(number)
        if rule.minimum is not None and figure < rule.minimum:
            return f"has {name}={number}, below {plain_number(rule.minimum)}"
        if rule.maximum is not None and figure > rule.maximum:
            return f"has {name}={number}, above {plain_number(rule.maximum)}"
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
