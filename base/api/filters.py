"""The API's filter backend: django-filter's, refusing a query parameter it does not know.

django-filter ignores a parameter no filter declares, so ``/api/replicas/?model=x`` (the
filter is ``profile__model__name``) would answer every replica as if it had been filtered.
Known are the view's filters and the pager's own parameters; anything else is a 400 that
names the known ones. A yes/no filter takes ``true`` or ``false`` (or nothing), as the schema says:
django-filter would read ``null``, ``unknown`` or ``2`` as "no filter" and answer every row.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters import BooleanFilter
from django_filters.rest_framework import DjangoFilterBackend

from base.errors import DomainError

# Read by other parts of DRF, not by a filter: the pager's and the format suffix's.
_ALWAYS_KNOWN = frozenset({"limit", "offset", "format"})


class StrictFilterBackend(DjangoFilterBackend):
    def filter_queryset(self, request: Any, queryset: QuerySet[Any], view: Any) -> QuerySet[Any]:
        filterset_class = self.get_filterset_class(view, queryset)
        known = set(filterset_class.base_filters) if filterset_class is not None else set()
        unknown = sorted(set(request.query_params) - known - _ALWAYS_KNOWN)
        if unknown:
            names = ", ".join(unknown)
            unlisted: frozenset[str] = getattr(filterset_class, "unlisted", frozenset())
            allowed = ", ".join(sorted((known - unlisted) | _ALWAYS_KNOWN))
            raise DomainError(
                "unknown_filter",
                f"Unknown query parameter{'s' if len(unknown) > 1 else ''} {names}: this list is filtered by "
                f"{allowed}. Use one of those, or drop the parameter.",
                status=400,
            )
        for name, spec in filterset_class.base_filters.items() if filterset_class is not None else ():
            if isinstance(spec, BooleanFilter):
                bad = [
                    value
                    for value in request.query_params.getlist(name)
                    if value not in ("true", "false", "")
                ]
                if bad:
                    raise DomainError(
                        "invalid",
                        f"{name} is a yes/no filter: give {name}=true or {name}=false, not {bad[0][:40]!r}.",
                        status=400,
                    )
        return super().filter_queryset(request, queryset, view)
