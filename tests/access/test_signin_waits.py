"""The sign-in waits' rule (access/signin.py), pure: a second past the limit, doubling per failure,
never beyond the longest; and what it allows a guesser who has any number of addresses."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from access.signin import Limits, forget_after, wait_after

FIFTEEN_MINUTES = timedelta(minutes=15)


def test_the_wait_starts_at_a_second_past_the_limit_doubles_and_stops_at_the_longest():
    waits = [wait_after(n, 5, FIFTEEN_MINUTES).total_seconds() for n in range(20)]
    assert waits == [0] * 5 + [1, 2, 4, 8, 16, 32, 64, 128, 256, 512] + [900] * 5


@given(st.integers(0, 10_000), st.integers(1, 100), st.integers(1, 24 * 60))
def test_the_wait_grows_with_each_failure_and_never_passes_the_longest(failures, free, minutes):
    longest = timedelta(minutes=minutes)
    wait = wait_after(failures, free, longest)
    assert timedelta(0) <= wait <= longest
    assert wait <= wait_after(failures + 1, free, longest)
    assert forget_after(longest) >= 2 * longest  # a count outlives its wait


def test_a_guesser_with_any_number_of_addresses_gets_under_a_hundred_tries_an_hour_at_one_account():
    # OWASP ASVS 4.0.3 V2.2.1: no more than 100 failed attempts an hour on one account. Each try from a
    # fresh address owes nothing for that address, so only the account's wait holds the guesser.
    limits = Limits.from_settings()
    elapsed, tries = timedelta(0), 0
    while (elapsed := elapsed + wait_after(tries, limits.account_free, limits.longest)) < timedelta(hours=1):
        tries += 1
    assert tries == 62  # fifty, then one after each wait of 1 s, 2 s, ... 512 s, 15 min, 15 min
    assert tries < 100
