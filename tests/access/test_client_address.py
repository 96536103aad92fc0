"""The client's address every limit counts (access/client.py): the connection's own, or behind the
proxies LLMGW_BEHIND_PROXY says are there, the entry the last trusted one appended; never what a
client wrote itself."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from access.client import client_address


def address(remote: str, forwarded_for: str | None = None) -> str | None:
    request = RequestFactory().get("/", REMOTE_ADDR=remote)
    if forwarded_for is not None:
        request.META["HTTP_X_FORWARDED_FOR"] = forwarded_for
    return client_address(request)


def test_without_the_proxy_setting_it_is_the_connections_address_whatever_the_header_says(settings):
    settings.LLMGW_BEHIND_PROXY = False
    assert address("198.51.100.7", "203.0.113.5") == "198.51.100.7"


@pytest.mark.parametrize(
    ("proxies", "forwarded_for", "client"),
    [
        (1, "203.0.113.5", "203.0.113.5"),
        (1, "192.0.2.1, 203.0.113.5", "203.0.113.5"),  # the left entry is the client's own writing
        (2, "192.0.2.1, 203.0.113.5, 10.0.0.1", "203.0.113.5"),  # two proxies: second from the right
        (2, "203.0.113.5", "203.0.113.5"),  # the outer proxy was not passed: the only entry is trusted
        (1, "not-an-address", "10.0.0.2"),  # nothing usable: the proxy's own
        (1, "203.0.113.5:51234", "203.0.113.5"),
        (1, "[2001:db8::1]:443", "2001:db8::"),
    ],
)
def test_behind_the_proxies_it_is_the_entry_the_last_trusted_one_appended(
    settings, proxies, forwarded_for, client
):
    settings.LLMGW_BEHIND_PROXY = True
    settings.LLMGW_TRUSTED_PROXIES = proxies
    assert address("10.0.0.2", forwarded_for) == client


def test_an_ipv6_client_counts_by_its_64_and_a_mapped_ipv4_one_as_itself(settings):
    settings.LLMGW_BEHIND_PROXY = False
    assert address("2001:db8:1:2::a") == address("2001:db8:1:2:ffff::b") == "2001:db8:1:2::"
    assert address("2001:db8:1:3::a") == "2001:db8:1:3::"
    assert address("::ffff:198.51.100.7") == "198.51.100.7"
