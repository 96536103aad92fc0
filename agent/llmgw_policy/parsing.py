"""Reading a profile's argument list the way each engine's parser reads it:
``--flag=value`` split where the parser splits it, a flag looked up after the
parser's own folding (``_`` as ``-``), the prefix an argparse engine would
take for a flag, and the next token as a flag's value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .model import EnginePolicy
from .tokens import is_flag


def split_flag(eng: EnginePolicy, token: str) -> tuple[str, str | None]:
    """``token`` as (the flag as written, its joined value or None)."""
    if "=" in token and eng.equals:
        name, value = token.split("=", 1)
        return name, value
    return token, None


def lookup(eng: EnginePolicy, table: Mapping[str, str], canon: str) -> tuple[str, str] | None:
    """The entry of ``table`` the parser would read ``canon`` as: (flag, why)."""
    for flag, why in table.items():
        if eng.canonical(flag) == canon:
            return flag, why
    return None


def abbreviates(eng: EnginePolicy, canon: str) -> str | None:
    """The owned or refused flag an argparse engine would read ``canon`` as."""
    if not (eng.abbreviations and canon.startswith("--") and len(canon) > 2):
        return None
    for flag in (*eng.owned, *eng.refused):
        if flag.startswith("--") and eng.canonical(flag).startswith(canon):
            return flag
    return None


def skip_value(args: Sequence[str], i: int, joined_value: str | None) -> int:
    """After a refused flag, its value (when it has one) is not a second refusal."""
    if joined_value is None and i < len(args) and not is_flag(args[i]):
        return i + 1
    return i
