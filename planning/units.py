"""Bytes as operators read them: GiB (2**30 bytes), and lists in prose."""

from __future__ import annotations

from collections.abc import Sequence

GIB = 2**30
FP32 = 4  # bytes of a float32: logits and activations held at full precision


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up, for whole bytes."""
    return -(-a // b)


def gib(n_bytes: int | float, digits: int = 1) -> str:
    """``n_bytes`` in GiB with ``digits`` decimals, e.g. ``gib(3 * 2**29)`` is "1.5"."""
    return f"{n_bytes / GIB:.{digits}f}"


def gib_short(n_bytes: int | float) -> str:
    """``n_bytes`` in GiB without a trailing ".0": 72 GiB is "72", 79.6 GiB "79.6"."""
    text = gib(n_bytes, 1)
    return text[:-2] if text.endswith(".0") else text


def or_list(items: Sequence[object]) -> str:
    """ "1, 2, 4 or 8" — the items joined as a sentence would join them."""
    words = [str(item) for item in items]
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} or {words[-1]}"


def and_list(items: Sequence[object]) -> str:
    """ "a, b and c"."""
    words = [str(item) for item in items]
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} and {words[-1]}"


def cards(n: int) -> str:
    """ "1 card", "4 cards"."""
    return f"{n} card" if n == 1 else f"{n} cards"
