"""The grammar of what a profile writes: which argument tokens read as flags,
which as whole numbers, and what names an environment variable.

The one definition of it: the launch policy reads a profile's arguments by
it, and so does the planning core when it finds, drops and sets a flag
(``planning/args.py``).
"""

from __future__ import annotations

import re

# A negative number ("-1", "-0.5", "-1e3") is a value, not a flag.
NEGATIVE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
WHOLE_NUMBER = re.compile(r"[-+]?\d+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_flag(token: str) -> bool:
    """True when ``token`` reads as a flag: it starts with "-", is longer than
    one character, and is not a negative number (``-1``, ``-0.5``)."""
    return len(token) > 1 and token.startswith("-") and not NEGATIVE_NUMBER.fullmatch(token)


def parse_int(value: str | None) -> int | None:
    """``value`` as a plain decimal whole number (spaces around it allowed),
    or None when it is not one."""
    if value is None or not WHOLE_NUMBER.fullmatch(value.strip()):
        return None
    return int(value)
