"""The models list's results: which models a query shows, and each one's row drawn by what it shows.

The page is kept under the fleet's versions (``web/views/models.py``, ``model_list``); after a write
that raises one of them it is read again, and each row is kept by what it is drawn from
(``versions/cache.py``, ``drawn_from``): the model's columns, its profiles' (with their class's),
the fleet's default releases (by which its served contexts are reckoned) and its replicas counted.
A replica's state changed, or a model's source edited, draws that model's row again, not the page's
fifty: the inputs are read as values in four queries, and only a row whose inputs changed reckons
its contexts and is drawn.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Any

from django.core.paginator import Paginator
from django.db.models import Count, Q, QuerySet
from django.http import QueryDict
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

from catalog.models import GPUClass, Profile, Replica, ServedModel, live_replicas_q, stale_replicas_q
from catalog.selectors import engine_defaults
from versions.cache import drawn_from
from web.display import served_contexts
from web.forms import CPU, ModelFilterForm

PAGE_SIZE = 50  # models on a page of the list: it pages and filters, whatever the catalog's size
TEMPLATE = "catalog/model_list.html"

_MODEL_COLUMNS = tuple(f.attname for f in ServedModel._meta.concrete_fields)
_PROFILE_COLUMNS = tuple(f.attname for f in Profile._meta.concrete_fields)
_CLASS_COLUMNS = tuple(f.attname for f in GPUClass._meta.concrete_fields)
_NO_USE = {"cards_in_use": 0, "live_replicas": 0, "stale_replicas": 0}


def models_matching(filters: dict[str, Any] | None = None) -> QuerySet[ServedModel]:
    """The models the list's filters let through, by name. Filters go through subqueries on the
    profiles, so they never multiply rows; only the stale filter needs the counts."""
    f = filters or {}
    qs = ServedModel.objects.all()
    if q := f.get("q"):
        qs = qs.filter(Q(name__icontains=q) | Q(source__icontains=q))
    if eng := f.get("engine"):
        qs = qs.filter(pk__in=Profile.objects.filter(engine=eng).values("model"))
    if cls := f.get("gpu_class"):
        on = Q(gpu_class__isnull=True) if cls == CPU else Q(gpu_class__name=cls)
        qs = qs.filter(pk__in=Profile.objects.filter(on).values("model"))
    if f.get("state") == "declared":
        qs = qs.filter(declared=True)
    elif f.get("state") == "editable":
        qs = qs.filter(declared=False)
    if f.get("stale"):
        through = "profiles__replicas__"
        stale = Count(
            "profiles__replicas",
            filter=live_replicas_q(through) & stale_replicas_q(through),
            distinct=True,
        )
        qs = qs.annotate(stale_replicas=stale).filter(stale_replicas__gt=0)
    return qs.order_by("name")


def usage_of(ids: list[int]) -> dict[int, dict[str, int]]:
    """Each model's live replicas, the cards they hold and how many run an older revision than their
    profile's, counted in the database, grouped by model: one query over these models' replicas."""
    rows = (
        Replica.objects.filter(live_replicas_q(), profile__model__in=ids)
        .values("profile__model")
        .annotate(
            live_replicas=Count("id", distinct=True),
            cards_in_use=Count("shards", distinct=True),
            stale_replicas=Count("id", filter=stale_replicas_q(), distinct=True),
        )
        .order_by()
    )
    return {
        r["profile__model"]: {k: r[k] for k in ("cards_in_use", "live_replicas", "stale_replicas")}
        for r in rows
    }


def row_inputs(ids: list[int]) -> list[tuple[Any, ...]]:
    """Everything each model's row is drawn from, as values, in the order of ``ids``: the model's
    columns, each profile's (by name) with its class's, the fleet's default releases and its
    usage. Four queries whatever the page's size."""
    models = {m["id"]: m for m in ServedModel.objects.filter(pk__in=ids).values(*_MODEL_COLUMNS)}
    profiles: dict[int, list[tuple[dict[str, Any], dict[str, Any] | None]]] = defaultdict(list)
    classed = [f"gpu_class__{c}" for c in _CLASS_COLUMNS]
    for p in Profile.objects.filter(model__in=ids).order_by("name").values(*_PROFILE_COLUMNS, *classed):
        cls = {c: p.pop(f"gpu_class__{c}") for c in _CLASS_COLUMNS}
        profiles[p["model_id"]].append((p, cls if p["gpu_class_id"] is not None else None))
    defaults = tuple(sorted(engine_defaults().items())) if profiles else ()
    usage = usage_of(ids)
    return [
        (models[pk], tuple(profiles.get(pk, ())), defaults, usage.get(pk, _NO_USE))
        for pk in ids
        if pk in models  # one removed between the two reads is not shown
    ]


def draw_row(inputs: tuple[Any, ...]) -> str:
    """One model's row from its inputs (``row_inputs``), reading nothing else."""
    values, profile_rows, defaults, usage = inputs
    model = ServedModel(**values)
    profiles = []
    for p, cls in profile_rows:
        profile = Profile(**p)
        profile.gpu_class = GPUClass(**cls) if cls is not None else None
        profile.model = model
        profiles.append(profile)
    return render_to_string(
        f"{TEMPLATE}#row",
        {
            "m": model,
            "profiles": profiles,
            "served_contexts": served_contexts(model, profiles, defaults=dict(defaults)),
            **usage,
        },
    )


def model_results(query: QueryDict) -> SafeString:
    """The models list's results (count, the page of models with their profiles and usage, pager)
    for the query's filters and page: what an htmx filter swaps in, and the page shows."""
    form = ModelFilterForm.for_catalog(query or None)
    filters = form.cleaned_data if form.is_bound and form.is_valid() else {}
    page = Paginator(models_matching(filters).only("pk"), PAGE_SIZE).get_page(query.get("page"))
    ids = [m.pk for m in page.object_list]
    rows = [drawn_from("models-row", inputs, partial(draw_row, inputs)) for inputs in row_inputs(ids)]
    rest = query.copy()
    rest.pop("page", None)
    return render_to_string(
        f"{TEMPLATE}#results",
        {
            "page": page,
            "rows": mark_safe("".join(rows)),  # noqa: S308 - each drawn by the template, escaped there
            "filtered": any(v not in (None, "", False) for v in filters.values()),
            "query": rest.urlencode(),
        },
    )
