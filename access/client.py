"""The client's address, as every limit counts it (the sign-in waits through django-axes'
``AXES_CLIENT_IP_CALLABLE``, the API's anonymous rate through access/throttles.py): one answer for both.

Without ``LLMGW_BEHIND_PROXY`` it is the connection's own address (``REMOTE_ADDR``) and
``X-Forwarded-For`` is ignored: any client can write that header. With it, the
``LLMGW_TRUSTED_PROXIES`` proxies in front each append the address they were connected from, so the
client is that many entries from the right; what a client wrote there itself stands further left
and is never read. An entry that is not an address falls back to ``REMOTE_ADDR``.

An IPv6 client is counted by its /64: one subscriber is usually given a whole /64, and counting
each of its addresses apart would let it start afresh at every request.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def _address(text: str | None) -> str | None:
    """``text`` as the address a limit counts, or None when it is none."""
    if not text:
        return None
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "203.0.113.9:443"
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False).network_address)
    return str(ip)


def client_address(request: HttpRequest) -> str | None:
    """The address the sign-in waits and the API's anonymous rate count this request under."""
    remote = _address(request.META.get("REMOTE_ADDR"))
    if not settings.LLMGW_BEHIND_PROXY:
        return remote
    hops = [hop for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    if not hops:
        return remote
    # Each trusted proxy appended one entry. Fewer entries than proxies: the request came in past the
    # outer ones, and every entry there is still one a trusted proxy wrote.
    return _address(hops[-min(settings.LLMGW_TRUSTED_PROXIES, len(hops))]) or remote
