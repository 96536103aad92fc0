"""Engine arguments as tokens: dropping, reading and setting a flag."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planning.args import drop_arg, get_arg, get_int_arg, is_flag, set_arg


@pytest.mark.parametrize(
    ("args", "flag", "expected"),
    [
        # both forms go, with the value of the spaced form
        (["--tp", "4", "--x"], "--tp", ["--x"]),
        (["--tp=4", "--x"], "--tp", ["--x"]),
        (["--a", "1", "--tp", "2", "--tp=3"], "--tp", ["--a", "1"]),
        # a flag sharing a prefix is another flag
        (["--tp-size", "4", "--tp", "2"], "--tp", ["--tp-size", "4"]),
        (["--tp", "2", "--tp-size", "4"], "--tp-size", ["--tp", "2"]),
        (["--tp_size", "4"], "--tp", ["--tp_size", "4"]),
        (["--tpx=1"], "--tp", ["--tpx=1"]),
        # the Go dropped whatever followed; here a following flag stays
        (["--tp", "--other", "1"], "--tp", ["--other", "1"]),
        # the flag last, without a value
        (["--x", "--tp"], "--tp", ["--x"]),
        # a negative number is a value, not a flag
        (["--offset", "-1", "--x"], "--offset", ["--x"]),
        (["--offset", "-0.5"], "--offset", []),
        # short flags
        (["-ts", "1,1", "-t", "8"], "-ts", ["-t", "8"]),
        (["-c", "4096", "-cb"], "-c", ["-cb"]),
        # absent: untouched
        (["--a", "1"], "--tp", ["--a", "1"]),
        ([], "--tp", []),
    ],
)
def test_drop_arg_drops_the_flag_in_both_forms_and_only_it(args, flag, expected):
    assert drop_arg(args, flag) == expected


def test_drop_arg_does_not_change_its_input():
    args = ["--tp", "2"]
    drop_arg(args, "--tp")
    assert args == ["--tp", "2"]


@pytest.mark.parametrize(
    ("token", "flag"),
    [
        ("--tp", True),
        ("-c", True),
        ("-1", False),
        ("-0.5", False),
        ("-1e3", False),
        ("-", False),
        ("4", False),
    ],
)
def test_is_flag_tells_a_negative_number_from_a_flag(token, flag):
    assert is_flag(token) is flag


@pytest.mark.parametrize(
    ("args", "flags", "expected"),
    [
        (["--ctx-size", "4096"], ("--ctx-size",), "4096"),
        (["--ctx-size=4096"], ("--ctx-size",), "4096"),
        # the last occurrence of any spelling wins
        (["-c", "1024", "--ctx-size", "2048", "-c=4096"], ("--ctx-size", "-c"), "4096"),
        (["--ctx-size", "2048", "-c", "1024"], ("--ctx-size", "-c"), "1024"),
        (["--x", "1"], ("--ctx-size",), None),
        # present without a value
        (["--flag"], ("--flag",), ""),
        (["--flag", "--next"], ("--flag",), ""),
        (["--a=b=c"], ("--a",), "b=c"),
    ],
)
def test_get_arg_answers_the_last_value(args, flags, expected):
    assert get_arg(args, *flags) == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-model-len", "8192"], 8192),
        (["--max-model-len=-3"], -3),
        (["--max-model-len", "8k"], None),
        (["--max-model-len", "1_000"], None),
        (["--max-model-len", "1.5"], None),
        (["--max-model-len"], None),
        ([], None),
    ],
)
def test_get_int_arg_answers_none_for_what_is_not_a_whole_number(args, expected):
    assert get_int_arg(args, "--max-model-len") == expected


def test_set_arg_replaces_the_flag_and_its_aliases_and_appends_it():
    args = ["-c", "1024", "--threads", "8", "--ctx-size=2048"]
    assert set_arg(args, "--ctx-size", 4096, aliases=("-c",)) == ["--threads", "8", "--ctx-size", "4096"]


def test_set_arg_writes_a_flag_like_value_with_an_equals_sign():
    assert set_arg([], "--stop", "--end") == ["--stop=--end"]
    assert get_arg(set_arg([], "--stop", "--end"), "--stop") == "--end"


# -- properties ------------------------------------------------------------------

# Flags that share prefixes with one another, in both separators.
FLAGS = [
    "--tp",
    "--tp-size",
    "--tp_size",
    "--tpx",
    "-tp",
    "-t",
    "--t",
    "--tensor-parallel-size",
    "-c",
    "--ctx-size",
]
VALUES = st.one_of(
    st.sampled_from(["4", "-1", "-0.5", "x", "", "a=b"]),
    st.integers(-100, 100).map(str),
)
TOKENS = st.one_of(
    st.sampled_from(FLAGS),
    st.tuples(st.sampled_from(FLAGS), VALUES).map(lambda fv: f"{fv[0]}={fv[1]}"),
    VALUES,
)


def _flags_other_than(args: list[str], flag: str) -> list[str]:
    return [t for t in args if is_flag(t) and t.split("=", 1)[0] != flag]


@given(st.lists(TOKENS, max_size=12), st.sampled_from(FLAGS))
def test_drop_arg_never_drops_another_flag(args, flag):
    out = drop_arg(args, flag)
    assert _flags_other_than(out, flag) == _flags_other_than(args, flag)
    assert not any(is_flag(t) and t.split("=", 1)[0] == flag for t in out)


@given(st.lists(TOKENS, max_size=12), st.sampled_from(FLAGS), VALUES | st.sampled_from(["--x", "-y"]))
def test_set_arg_then_get_arg_reads_back_the_value(args, flag, value):
    assert get_arg(set_arg(args, flag, value), flag) == value


@given(st.lists(TOKENS, max_size=12), st.sampled_from(FLAGS), st.integers(-(10**9), 10**9))
def test_set_arg_then_get_int_arg_reads_back_an_integer(args, flag, value):
    assert get_int_arg(set_arg(args, flag, value), flag) == value
