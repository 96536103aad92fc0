"""Redaction takes a secret out of text an operator reads in every form a log or a message shows it:
as it is, upper- or lower-cased, base64'd (standard or URL-safe, at any alignment inside a longer
encoded text), hex, percent-encoded, with whitespace inside it, and wrapped over two log lines that
each carry their own prefix. What is around it is kept, and the lines stay as many."""

from __future__ import annotations

import base64
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from base.secrets import redact, redact_lines

KEY = "sk-SecretApiKey_0123456789abcdefXYZ"


def _encoded(secret: str) -> dict[str, str]:
    out = {
        "as it is": secret,
        "upper-cased": secret.upper(),
        "lower-cased": secret.lower(),
        "hex": secret.encode().hex(),
        "percent-encoded": quote(secret + "/+", safe=""),
    }
    for lead in ("", "a", "ab"):  # each alignment inside a longer base64 text
        raw = f"{lead}Authorization: Bearer {secret}".encode()
        out[f"base64 after {len(lead)}"] = base64.b64encode(raw).decode()
        out[f"urlsafe base64 after {len(lead)}"] = base64.urlsafe_b64encode(raw).decode()
    return out


@pytest.mark.parametrize(("form", "copy"), sorted(_encoded(KEY).items()))
def test_each_form_of_a_secret_is_redacted_and_the_rest_kept(form, copy):
    text = f"engine said: {copy} (while loading)"
    out = redact(text, [KEY])
    assert out.startswith("engine said: ") and out.endswith(" (while loading)")
    assert "***" in out
    for length in (len(KEY), 16, 10):
        assert not any(KEY.lower()[i : i + length] in out.lower() for i in range(len(KEY) - length + 1))


def test_a_secret_split_by_whitespace_or_wrapped_over_log_lines_is_redacted_on_each_line():
    assert redact(f"key {KEY[:10]} {KEY[10:]} end", [KEY]) == "key *** end"
    for cut in (3, 8, 17, 30):
        lines = [
            f"2026-12-01T10:00:00 engine[42]: token {KEY[:cut]}",
            f"2026-12-01T10:00:00 engine[42]: {KEY[cut:]} (continued)",
            "2026-12-01T10:00:01 engine[42]: ready",
        ]
        out = redact_lines(lines, [KEY])
        assert len(out) == 3
        assert out[0].endswith("token ***") and out[1].endswith("*** (continued)") and out[2] == lines[2]


def test_short_values_and_text_without_a_secret_are_left_as_they_are():
    text = "nothing to see\nhere at all"
    assert redact(text, [KEY, "ab", ""]) == text
    assert redact_lines(text.split("\n"), []) == text.split("\n")


_TOKEN = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.~+/=:",
    min_size=16,
    max_size=64,
)
_WORDS = st.text(alphabet="éèàqwjvkx ,;!?()[]", max_size=40)


@given(secret=_TOKEN, before=_WORDS, after=_WORDS, form=st.sampled_from(sorted(_encoded("x" * 16))))
def test_no_copy_survives_whatever_surrounds_it(secret, before, after, form):
    copy = _encoded(secret)[form]
    out = redact(f"{before}{copy}{after}", [secret])
    assert secret.lower() not in out.lower()
    assert copy not in out
