"""Engine arguments as a list of strings: find, drop and set a flag.

A profile's arguments are never a shell line, so these work on tokens. A flag
is written either ``--flag value`` or ``--flag=value``; the functions here
accept both and never confuse two flags that share a prefix (``--tp`` and
``--tp-size``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

# What a flag is and what a whole number is: the launch policy's grammar (its
# one definition), so that a flag found, dropped or set here is the flag the
# policy checks. The planning core's modules take both from here.
from llmgw_policy import is_flag, parse_int


def flag_name(token: str) -> str:
    """The flag part of a token: ``--a=1`` gives ``--a``, ``--a`` gives ``--a``."""
    return token.split("=", 1)[0]


def drop_where(args: Sequence[str], matches: Callable[[str], bool]) -> list[str]:
    """``args`` without every flag whose name ``matches`` accepts, and its value.

    ``--flag=value`` goes as one token. After ``--flag`` alone, the next token
    goes with it only when there is one and it is not itself a flag — so a
    value-less flag never takes the flag after it.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if is_flag(token) and matches(flag_name(token)):
            if "=" not in token and i + 1 < len(args) and not is_flag(args[i + 1]):
                i += 1  # its value
        else:
            out.append(token)
        i += 1
    return out


def get_where(args: Sequence[str], matches: Callable[[str], bool]) -> str | None:
    """The value of the last flag whose name ``matches`` accepts.

    None when there is no such flag; "" when the last one has no value (it is
    last, or a flag follows it).
    """
    found: str | None = None
    for i, token in enumerate(args):
        if not (is_flag(token) and matches(flag_name(token))):
            continue
        if "=" in token:
            found = token.split("=", 1)[1]
        elif i + 1 < len(args) and not is_flag(args[i + 1]):
            found = args[i + 1]
        else:
            found = ""
    return found


def drop_arg(args: Sequence[str], flag: str) -> list[str]:
    """``args`` without ``flag``, in both its forms, and its value.

    Only the exact flag goes: ``drop_arg(args, "--tp")`` keeps ``--tp-size``.
    The value after ``flag`` is dropped only when it exists and is not itself
    a flag (a negative number is a value). This deliberately differs from the
    Go original, which dropped whatever token followed, flag or not.
    """
    return drop_where(args, lambda name: name == flag)


def drop_args(args: Sequence[str], flags: Iterable[str]) -> list[str]:
    """``args`` without any of ``flags`` (see ``drop_arg``)."""
    wanted = set(flags)
    return drop_where(args, lambda name: name in wanted)


def get_arg(args: Sequence[str], *flags: str) -> str | None:
    """The value of the last occurrence of any of ``flags``, or None.

    "" when that occurrence has no value.
    """
    wanted = set(flags)
    return get_where(args, lambda name: name in wanted)


def get_int_arg(args: Sequence[str], *flags: str) -> int | None:
    """The last occurrence of any of ``flags`` as an integer; None when it is
    missing or its value is not a whole number."""
    return parse_int(get_arg(args, *flags))


def set_arg(args: Sequence[str], flag: str, value: object, *, aliases: Iterable[str] = ()) -> list[str]:
    """``args`` with ``flag`` (and each of ``aliases``) dropped, then
    ``flag value`` appended.

    A value that would read as a flag is written ``flag=value`` instead, so
    that ``get_arg`` reads back exactly what was set.
    """
    text = str(value)
    out = drop_args(args, [flag, *aliases])
    if is_flag(text):
        return [*out, f"{flag}={text}"]
    return [*out, flag, text]
