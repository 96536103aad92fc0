"""List endpoints whose answers are kept under the fleet's versions (versions/cache.py).

The DRF view has signed the caller in, checked the permission and the throttles before ``list``
runs; the kept answer is the serialized page for the query (normalised), the host it was asked
at (the pages' links are absolute) and the format asked for, rendered per request.

A viewset with ``kept_rows`` also keeps each row serialized by what it is serialized from (issue
25): when a write raises a version the page is read again (its queries), but a row whose loaded
values are all as they were is not serialized again, which at 100 rows a page was most of the
answer's time. The row's inputs are every value loaded with it (``row_inputs``: its columns and
annotations, the rows ``select_related`` and ``prefetch_related`` loaded with it, recursively), so
the same inputs always serialize the same; a row whose serializing ran a query (read something
not loaded with it) is not kept.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

from django.core.cache import caches
from django.db import connection
from django.db.models import Model
from rest_framework.request import Request
from rest_framework.response import Response

from base.views import normalized
from versions.cache import ALIAS, remembered

_SKIPPED = ("_state", "_prefetched_objects_cache")
T = TypeVar("T")


@functools.cache
def _columns_of(model: type[Model]) -> frozenset[str]:
    return frozenset(f.attname for f in model._meta.concrete_fields)


def row_inputs(obj: Model, _path: frozenset[int] = frozenset()) -> tuple[Any, ...]:
    """Every value loaded with ``obj``, as plain data whose ``repr`` says them all: its own
    attributes (columns, annotations), and the rows loaded with it (``select_related``'s, each
    prefetched list's), recursively; a row met again on its own path (a prefetched profile's model
    is the model) only named, not followed."""
    if id(obj) in _path:
        return ("again", obj._meta.label, obj.pk)
    path = _path | {id(obj)}
    own = obj.__dict__.copy()  # copied and repr'd in C: a tuple of its pairs built in Python cost twice
    for name in _SKIPPED:
        own.pop(name, None)
    for name in own.keys() - _columns_of(type(obj)):  # annotations, and rows set as attributes
        # A row set as an attribute (a prefetch ``to_attr``'s list): its values, not its ``repr``.
        value = own[name]
        if isinstance(value, Model):
            own[name] = row_inputs(value, path)
        elif isinstance(value, list) and any(isinstance(o, Model) for o in value):
            own[name] = [row_inputs(o, path) if isinstance(o, Model) else o for o in value]
    related = tuple(
        (name, None if other is None else row_inputs(other, path))
        for name, other in sorted(obj._state.fields_cache.items())
    )
    prefetched = tuple(
        (name, tuple(row_inputs(o, path) for o in found))
        for name, found in sorted(getattr(obj, "_prefetched_objects_cache", {}).items())
    )
    return (obj._meta.label, own, related, prefetched)


class _Counted:
    """An execute wrapper that counts the queries run inside it."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.n += 1
        return execute(sql, params, many, context)


def kept_by_loaded(name: str, objects: Iterable[Model], compute: Callable[[], T], *, parts: Any = ()) -> T:
    """``compute()``'s answer, kept by every value loaded with ``objects`` (``row_inputs``) and
    ``parts`` (plain data: its ``repr`` says it): what ``compute`` reads must be those and nothing
    else; if it ran a query (read something else), its answer is given and not kept. The same values always give the same answer, so it is
    kept whoever read them, inside a transaction too."""
    key = (
        f"{name}:loaded:"
        + hashlib.sha256(repr((parts, [row_inputs(o) for o in objects])).encode()).hexdigest()
    )
    cache = caches[ALIAS]
    found = cache.get(key, _MISSING)
    if found is not _MISSING:
        return found
    counted = _Counted()
    with connection.execute_wrapper(counted):
        value = compute()
    if counted.n == 0:
        cache.set(key, value)
    return value


_MISSING = object()


class KeptList:
    """A mixin for a viewset: ``list`` kept under ``kept_areas``' versions; with ``kept_rows``, each
    row also kept by its loaded values."""

    kept_areas: ClassVar[tuple[str, ...]] = ("structure", "placement", "replicas")
    kept_rows: ClassVar[bool] = False

    def keep(self, data: Any) -> bool:
        """Whether an answer may be kept: False for one the clock changes, not only a write."""
        return True

    def keep_row(self, row: dict[str, Any]) -> bool:
        """Whether a row's serialized form may be kept by its values: False for one the clock changes."""
        return True

    def kept_parts(self, request: Request) -> builtins.list[Any]:
        """What else the answer is kept by, beside the versions and the query (none by default)."""
        return []

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        parts = [
            request.scheme,
            request.get_host(),
            request.path,
            normalized(request.query_params).urlencode(),
            getattr(request.accepted_renderer, "format", ""),
            *self.kept_parts(request),
        ]
        data = remembered(
            f"api-{type(self).__name__}",
            self.kept_areas,
            parts,
            lambda: self._page_data(request, *args, **kwargs),
            request=request._request,
            keep=self.keep,
        )
        return Response(data)

    def _page_data(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        if not self.kept_rows:
            return super().list(request, *args, **kwargs).data  # type: ignore[misc]
        queryset = self.filter_queryset(self.get_queryset())  # type: ignore[attr-defined]
        page = self.paginate_queryset(queryset)  # type: ignore[attr-defined]
        rows = self._rows(request, list(queryset if page is None else page))
        if page is None:
            return rows
        return self.get_paginated_response(rows).data  # type: ignore[attr-defined]

    def _rows(self, request: Request, objects: builtins.list[Model]) -> builtins.list[dict[str, Any]]:
        """Each object serialized, or its serialized form kept by its loaded values."""
        serializer = self.get_serializer()  # type: ignore[attr-defined]
        # What else a row's form depends on: the serializer, and the host its links are absolute at.
        around = (type(serializer).__qualname__, request.scheme, request.get_host())
        keys = [
            f"api-row-{type(self).__name__}:"
            + hashlib.sha256(repr((around, row_inputs(obj))).encode()).hexdigest()
            for obj in objects
        ]
        cache = caches[ALIAS]
        found = cache.get_many(keys)
        rows = []
        for obj, key in zip(objects, keys, strict=True):
            row = found.get(key)
            if row is None:
                counted = _Counted()
                with connection.execute_wrapper(counted):
                    row = dict(serializer.to_representation(obj))
                if counted.n == 0 and self.keep_row(row):
                    cache.set(key, row)
            rows.append(row)
        return rows
