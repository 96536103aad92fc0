"""Redaction of secret values from text an operator reads: a log tail, a failure's reason, an
error. Shared by the control plane (``base/secrets.py``) and the node agent, which redact the same
copies: exact, upper- or lower-cased, base64'd (standard or URL-safe, at any alignment), hex or
percent-encoded, and split by whitespace or line breaks. Standard library only."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from urllib.parse import quote

REDACTED = "***"

MIN_SECRET = 4  # characters: a shorter "secret" would redact half of every line
MIN_ENCODED = 6  # characters of an encoded copy matched (its core, below)


def _base64_cores(secret: bytes) -> set[str]:
    """The part of ``secret``'s base64 (standard and URL-safe) that does not depend on what comes
    before or after it, at each of the three alignments it can start at in a longer encoded text."""
    cores = set()
    for skip in range(3):
        encoded = base64.b64encode(b"\0" * skip + secret).decode().rstrip("=")
        total = skip + len(secret)
        first = -(-8 * skip // 6)  # the first character made of the secret's bits alone
        last = (8 * total - 6) // 6  # the last one not mixed with padding
        core = encoded[first : last + 1]
        if len(core) >= MIN_ENCODED:
            cores |= {core, core.replace("+", "-").replace("/", "_")}
    return cores


def secret_forms(secret: str) -> set[str]:
    """What a copy of ``secret`` may look like in a log or a message: as it is, base64'd (standard
    or URL-safe, at any alignment), hex, or percent-encoded; matched case- and whitespace-blind."""
    raw = secret.encode("utf-8", "surrogatepass")
    forms = {secret, raw.hex(), quote(secret, safe="")} | _base64_cores(raw)
    return {f.lower() for f in forms if len(f) >= MIN_SECRET}


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every copy of each of ``secrets`` (at least 4 characters) replaced by ``***``:
    exact, upper- or lower-cased, base64'd, hex or percent-encoded (``secret_forms``), with
    whitespace or line breaks inside it, and wrapped onto the next line after whatever that line
    starts with (``_wrapped``). A copy across lines is redacted on each line it touches; the lines
    stay as many."""
    wanted = sorted({s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET})
    if not wanted or not text:
        return text
    hidden = [False] * len(text)
    _whole_copies(text, {f for s in wanted for f in secret_forms(s)}, hidden)
    for secret in wanted:
        _wrapped(text, secret.lower(), hidden)
    if not any(hidden):
        return text
    out: list[str] = []
    for i, ch in enumerate(text):
        if hidden[i] and ch != "\n":
            if not (i > 0 and hidden[i - 1] and text[i - 1] != "\n"):
                out.append(REDACTED)
        else:
            out.append(ch)
    return "".join(out)


def _whole_copies(text: str, forms: set[str], hidden: list[bool]) -> None:
    """Mark each copy of ``forms`` in ``text``, read lower-cased and without its whitespace."""
    kept = [i for i, ch in enumerate(text) if not ch.isspace()]
    squeezed = "".join(text[i] for i in kept).lower()
    for form in forms:
        start = squeezed.find(form)
        while start != -1:
            for i in range(kept[start], kept[start + len(form) - 1] + 1):
                hidden[i] = True
            start = squeezed.find(form, start + 1)


def _wrapped(text: str, secret: str, hidden: list[bool]) -> None:
    """Mark a copy of ``secret`` wrapped over two lines of a log, each with its own prefix (a time,
    a process): a line that ends with the secret's first part and, on the next line, its rest,
    where one of the two parts is a quarter of the secret or more (at least 6 characters). A first
    part that long at a line's end is marked even without its rest: a fragment that long is a leak."""
    shortest = max(MIN_ENCODED, len(secret) // 4)
    start = 0
    lines = text.split("\n")
    for n, line in enumerate(lines):
        end = start + len(line.rstrip())
        low = line.rstrip().lower()
        after = start + len(line) + 1
        below = lines[n + 1].lower() if n + 1 < len(lines) else ""
        for k in range(len(secret) - 1, 0, -1):
            if not low.endswith(secret[:k]):
                continue
            at = below.find(secret[k:])
            if k < shortest and (at == -1 or len(secret) - k < shortest):
                continue
            for i in range(end - k, end):
                hidden[i] = True
            if at != -1:
                for i in range(after + at, after + at + len(secret) - k):
                    hidden[i] = True
            break
        start = after


def redact_lines(lines: Iterable[str], secrets: Iterable[str]) -> list[str]:
    """``lines`` redacted together (``redact``), so that a copy split across lines is caught."""
    return redact("\n".join(lines), secrets).split("\n")
