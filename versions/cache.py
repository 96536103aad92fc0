"""Answers kept under the fleet's versions: computed once per version, given to every reader after.

``remembered(name, areas, parts, compute)`` gives what ``compute()`` gave when the ``areas``'
versions were what they are now and ``parts`` (what else the answer depends on: the path, the
normalised query or body, the reader's role) were the same; else computes, keeps and gives it.
The versions are read from the database at every call (one query a request: ``versions_of``), so
a process's own memory is never stale (Django's local-memory cache, one per gunicorn worker, the
``answers`` alias: settings.CACHES).

An answer is never kept, nor given, inside a transaction: there the reader may see its own
writes before they commit, or roll them back, and nobody else may be given those under any
version (versions/triggers.py says why reading the versions first and the data after is safe).
Whatever checks a request needs (sign-in, permissions, throttles) run before the view asks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.core.cache import caches
from django.db import connection

from versions.models import Version
from versions.triggers import ALIASES, ORDER

T = TypeVar("T")
ALIAS = "answers"
_MEMO = "_llmgw_versions"  # on the request: the versions read once for all its answers


def versions_of(request: Any = None) -> dict[str, str]:
    """Every area's version, ``born.n``: one query, once a request when ``request`` is given (a DRF
    request's memo is its Django request's: the permission gate and the view share one)."""
    if request is not None:
        request = getattr(request, "_request", request)
        memo = getattr(request, _MEMO, None)
        if memo is not None:
            return memo
    found = {area: f"{born}.{n}" for area, n, born in Version.objects.values_list("area", "n", "born")}
    if request is not None:
        setattr(request, _MEMO, found)
    return found


def usable() -> bool:
    """Outside any transaction: the only place an answer may be kept or given."""
    return not connection.in_atomic_block


def areas_meant(areas: Iterable[str]) -> tuple[str, ...]:
    """The areas named, each alias (``ALIASES``: ``structure``) given as the areas it stands for."""
    return tuple(sorted({a for named in areas for a in ALIASES.get(named, (named,))}))


def key_of(name: str, areas: Iterable[str], parts: Iterable[Any], *, request: Any = None) -> str:
    areas = areas_meant(areas)
    unknown = sorted(set(areas) - set(ORDER))
    if unknown:
        # A counter nobody raises would keep the answer forever: a name from before the split, or a typo.
        raise ValueError(
            f"{name}: no such version area {unknown}; the areas are {list(ORDER)} (or {sorted(ALIASES)})"
        )
    versions = versions_of(request)
    stamp = ",".join(f"{a}={versions.get(a, 'none')}" for a in areas)
    digest = hashlib.sha256(repr(tuple(parts)).encode()).hexdigest()[:32]
    return f"{name}:{stamp}:{digest}"


def remembered(
    name: str,
    areas: Iterable[str],
    parts: Iterable[Any],
    compute: Callable[[], T],
    *,
    request: Any = None,
    keep: Callable[[T], bool] | None = None,
) -> T:
    """``compute()``'s answer for these versions and parts, computed at most once per process.
    ``keep``: whether this answer may be kept (one that shows what the clock changes may not)."""
    if not usable():
        return compute()
    cache = caches[ALIAS]
    key = key_of(name, areas, parts, request=request)
    found = cache.get(key, _MISSING)
    if found is not _MISSING:
        return found
    value = compute()
    if keep is None or keep(value):
        cache.set(key, value)
    return value


_MISSING = object()
_HELD: dict[str, tuple[str, Any]] = {}  # kept_here's: each name's last key and its answer, as objects


def forget_kept_here() -> None:
    """Every answer ``kept_here`` holds dropped (the tests, whose databases are emptied between them)."""
    _HELD.clear()


def kept_here(name: str, areas: Iterable[str], parts: Iterable[Any], compute: Callable[[], T]) -> T:
    """As ``remembered``, but kept in this process's memory as the object itself, the last key's answer
    alone for each name: for a large answer read whole at every use (the fleet's cards every change
    plans on), which the answers cache would unpickle at every get, at a cost near computing it. Its
    readers must not change it: make it of frozen dataclasses, tuples and mappings nobody writes."""
    if not usable():
        return compute()
    key = key_of(name, areas, parts)
    found = _HELD.get(name)
    if found is not None and found[0] == key:
        return found[1]
    value = compute()
    _HELD[name] = (key, value)
    return value


def drawn_from(name: str, inputs: Any, draw: Callable[[], str]) -> str:
    """``draw()``'s HTML, kept by what it is drawn from rather than by the fleet's versions: ``inputs``
    must hold everything ``draw`` reads (its ``repr`` is hashed), so that the same inputs always draw
    the same page and a kept drawing is never stale, whenever and by whomever they were read. For
    the parts whose reading is cheap and drawing is not: after a write the inputs are read again
    (the caller's queries) and, if the write changed none of them, nothing is drawn. Pure, so kept
    inside a transaction too (a reader's own uncommitted rows are only inputs like any other)."""
    return drawing(name, inputs, draw)[1]


def drawing(name: str, inputs: Any, draw: Callable[[], str]) -> tuple[str, str]:
    """As ``drawn_from``, with the digest of what it was drawn from: a name for the drawing, under
    which what is made of it alone (the nodes grid with its readings put in) may be kept in turn."""
    digest = hashlib.sha256(repr(inputs).encode()).hexdigest()
    cache = caches[ALIAS]
    key = f"{name}:drawn:{digest}"
    found = cache.get(key)
    if found is None:
        found = draw()
        cache.set(key, found)
    return digest, found


def query_parts(query: Any, *, drop: Iterable[str] = ()) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A QueryDict as sorted pairs, each key's values in order: ``?b=1&a=2`` is ``?a=2&b=1``."""
    left_out = set(drop)
    return tuple(sorted((k, tuple(v)) for k, v in query.lists() if k not in left_out))
