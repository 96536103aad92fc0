"""Where a node's agent may be: a plain http(s) base URL whose host, once resolved, is an address
inside the fleet's networks (``LLMGW_AGENT_NETWORKS``; by default the private ranges).

The control plane calls an agent URL an editor typed, from inside the data centre: without this
check an agent URL could make the web process call the database, the cloud's metadata service or
itself, and show the answer. So the URL's host is resolved, every address it resolves to (an IPv6
address that carries an IPv4 one unwrapped to it, as the kernel would connect to it) must lie in a
network the setting names, and the client then connects to the address that was checked
(``agentclient.client``: no second lookup between the check and the connection).
Loopback and link-local are allowed only when the setting names them (the demo and the tests name
127.0.0.0/8); the cloud metadata addresses only when it names each one alone (a /32 or /128);
unspecified, multicast and broadcast addresses never.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from base.errors import DomainError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# What "private" stands for in LLMGW_AGENT_NETWORKS, and its default: RFC 1918 and IPv6 unique local.
PRIVATE_NETWORKS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
# Cloud metadata services (AWS, its IPv6 and ECS task endpoints, GCP, Azure's wire server, Alibaba):
# refused even inside a network the setting names, unless it names the address alone.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "168.63.129.16", "100.100.100.200")
)
METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "metadata.goog"})
# The well-known NAT64 prefix: an address in it reaches the IPv4 address in its last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

SETTING = "LLMGW_AGENT_NETWORKS"


def parse_networks(items: Iterable[str]) -> tuple[IPNetwork, ...]:
    """The networks ``items`` name (CIDRs, or ``private``); ValueError naming the first wrong one."""
    out: list[IPNetwork] = []
    for item in items:
        text = item.strip()
        if not text:
            continue
        if text.lower() == "private":
            out += [ipaddress.ip_network(n) for n in PRIVATE_NETWORKS]
            continue
        try:
            out.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(
                f"{text!r} is not a network: write one as an address and a prefix length, e.g. "
                "10.0.0.0/8 or fd00::/8, or the word private"
            ) from None
    return tuple(out)


@functools.lru_cache(maxsize=8)
def _networks(items: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return parse_networks(items)


def allowed_networks() -> tuple[IPNetwork, ...]:
    return _networks(tuple(settings.LLMGW_AGENT_NETWORKS))


def unwrapped(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (``::ffff:a.b.c.d``, ``::a.b.c.d``, NAT64's
    ``64:ff9b::a.b.c.d``), which is where a connection to it goes; any other address as it is."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        number = int(address)
        if address in _NAT64 or (number >> 32 == 0 and number > 1):
            return ipaddress.IPv4Address(number & 0xFFFFFFFF)
    return address


def _kind(address: IPAddress) -> str:
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_private:
        return "a private address"
    return "a public address"


def address_refusal(address: IPAddress, networks: tuple[IPNetwork, ...]) -> str | None:
    """Why ``address`` (unwrapped) may not be an agent's, or None."""
    if address.is_unspecified or address.is_multicast or address == ipaddress.ip_address("255.255.255.255"):
        return f"{address} is an unspecified, multicast or broadcast address, never an agent's"
    names = ", ".join(str(n) for n in networks) or "none"
    if address in METADATA_ADDRESSES:
        if any(n.num_addresses == 1 and address in n for n in networks):
            return None
        return (
            f"{address} is a cloud metadata address, refused unless {SETTING} names it alone "
            f"({address}/{address.max_prefixlen}); the networks allowed are {names}"
        )
    if any(address in n for n in networks):
        return None
    return (
        f"{address} is {_kind(address)} outside the networks {SETTING} allows ({names}): a node's agent "
        f"is reached on the fleet's own network; if {address} is on it, add its network "
        f"(e.g. {_network_of(address)}) to {SETTING}"
    )


def _network_of(address: IPAddress) -> str:
    """The network an operator would name for ``address``: loopback's, link-local's, or itself."""
    if address.is_loopback:
        return "127.0.0.0/8" if address.version == 4 else "::1/128"
    if address.is_link_local:
        return "169.254.0.0/16" if address.version == 4 else "fe80::/10"
    return f"{address}/{address.max_prefixlen}"


@dataclass(frozen=True)
class AgentAddress:
    """An agent URL's host and the address a connection to it goes to (checked)."""

    host: str
    port: int
    address: IPAddress


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` stands for (itself when it is one), each unwrapped, in order."""
    try:
        return [unwrapped(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise DomainError(
            "refused_agent_url",
            f"The agent URL's host {host} does not resolve ({exc}): name a host the control plane "
            "can resolve, or the agent's address.",
        ) from None
    out: list[IPAddress] = []
    for info in infos:
        address = unwrapped(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
        if address not in out:
            out.append(address)
    return out


def checked_address(url: str) -> AgentAddress:
    """The address a call to ``url`` connects to: its host resolved, every address it resolves to
    inside the allowed networks (``refused_agent_url`` naming the first that is not)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise DomainError(
            "refused_agent_url", f"The agent URL {url!r} has a port that is not a number."
        ) from None
    if host in METADATA_NAMES:
        raise DomainError(
            "refused_agent_url",
            f"The agent URL {url!r} names {host}, a cloud metadata service: a node's agent is reached "
            "on the fleet's own network.",
        )
    networks = allowed_networks()
    addresses = resolve(host, port)
    if not addresses:
        raise DomainError("refused_agent_url", f"The agent URL's host {host} resolves to no address.")
    for address in addresses:
        why = address_refusal(address, networks)
        if why is not None:
            named = "" if str(address) == host else f"{host} resolves to {address}: "
            raise DomainError("refused_agent_url", f"The agent URL {url!r} is refused: {named}{why}.")
    return AgentAddress(host=host, port=port, address=addresses[0])


PLAIN_SETTING = "LLMGW_AGENT_PLAIN_HTTP_NETWORKS"


def plaintext_refusal(url: str, target: AgentAddress) -> str | None:
    """Why ``url`` may not be called as it is written, or None: plain http carries the agent token in
    clear, allowed only to an address inside ``LLMGW_AGENT_PLAIN_HTTP_NETWORKS`` (loopback by default)."""
    if urlsplit(url).scheme != "http":
        return None
    networks = _networks(tuple(settings.LLMGW_AGENT_PLAIN_HTTP_NETWORKS))
    if any(target.address in n for n in networks):
        return None
    names = ", ".join(str(n) for n in networks) or "none"
    return (
        f"the URL is plain http to {target.address}, outside the networks {PLAIN_SETTING} allows "
        f"({names}), and the agent token would cross the network in clear; serve the agent over https "
        "(LLMGW_AGENT_TLS_CERT_FILE and LLMGW_AGENT_TLS_KEY_FILE on the node) and write https:// in the "
        f"node's agent URL, or, on a network trusted as the token is, add it (e.g. "
        f"{_network_of(target.address)}) to {PLAIN_SETTING}"
    )


def validate_agent_url(url: str) -> AgentAddress:
    """http(s), a plain base URL, to a host ``LLMGW_AGENT_HOSTS`` allows (when set) whose every
    address is inside ``LLMGW_AGENT_NETWORKS``; ``refused_agent_url`` otherwise."""
    parts = urlsplit(url or "")
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        raise DomainError(
            "refused_agent_url", f"The agent URL {url!r} must be http:// or https:// and name a host."
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise DomainError(
            "refused_agent_url",
            f"The agent URL {url!r} must be a plain base URL (no user, query or fragment).",
        )
    allowed = settings.LLMGW_AGENT_HOSTS
    if allowed and not any(_host_allowed(host, pattern) for pattern in allowed):
        raise DomainError(
            "refused_agent_url",
            f"The agent URL's host {host} is not one LLMGW_AGENT_HOSTS allows ({', '.join(allowed)}); "
            "an operator adds the fleet's hosts or networks there.",
        )
    return checked_address(url)


def _host_allowed(host: str, pattern: str) -> bool:
    pattern = pattern.strip().lower()
    if "/" in pattern:
        try:
            return unwrapped(ipaddress.ip_address(host.strip("[]"))) in ipaddress.ip_network(
                pattern, strict=False
            )
        except ValueError:
            return False
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern
