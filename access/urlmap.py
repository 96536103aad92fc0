"""Every URL pattern of the project with its view, walked from the URL configuration.

The system check (access/checks.py) and the role × URL matrix test (tests/access/test_access_matrix.py)
both read the project's URLs from here, so neither can miss one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver


@dataclass(frozen=True)
class Route:
    name: str  # "namespace:name", or the pattern when it has no name
    pattern: str  # the whole route, e.g. "api/models/<str:name>/"
    callback: Any
    namespace: str  # "admin" for the admin's

    @property
    def in_admin(self) -> bool:
        return self.namespace.split(":")[0] == "admin"


def routes() -> Iterator[Route]:
    def walk(patterns: list[Any], prefix: str, namespace: str) -> Iterator[Route]:
        for p in patterns:
            if isinstance(p, URLResolver):
                ns = ":".join(n for n in (namespace, p.namespace or "") if n)
                yield from walk(p.url_patterns, prefix + str(p.pattern), ns)
            elif isinstance(p, URLPattern):
                full = prefix + str(p.pattern)
                name = f"{namespace}:{p.name}" if namespace and p.name else (p.name or full)
                yield Route(name, full, p.callback, namespace)

    yield from walk(get_resolver().url_patterns, "", "")
