"""A profile's arguments read as one engine spells them: a flag's value (as text, a float, a
positive int) and whether a flag is given, under any of the engine's spellings of it."""

from __future__ import annotations

from collections.abc import Sequence

from planning.args import flag_name, get_where, is_flag, parse_int
from planning.engines import Engine, spelling_of


def arg_value(eng: Engine, args: Sequence[str], flag: str | None) -> str | None:
    if not flag:
        return None
    return get_where(args, lambda name: spelling_of(eng, name, (flag,)) is not None)


def float_value(eng: Engine, args: Sequence[str], flag: str | None) -> float | None:
    text = arg_value(eng, args, flag)
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def int_value(eng: Engine, args: Sequence[str], flag: str | None) -> int | None:
    value = parse_int(arg_value(eng, args, flag))
    return value if value is not None and value > 0 else None


def flag_given(eng: Engine, args: Sequence[str], flag: str) -> bool:
    return any(is_flag(t) and spelling_of(eng, flag_name(t), (flag,)) is not None for t in args)
