"""The models list, a model's page, and its resize and context forms.

The forms preview on every change: the server runs the service as a dry run
and answers the preview fragment with status 200, refusals included (the
refusal's sentence is the API's). Apply runs the same service for real,
checked again on the server, and sends the browser back to the model's page,
where the restart it started shows live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import SafeString
from django.views.decorators.http import require_GET, require_POST

from audit.selectors import model_history_q
from audit.views import history_context
from base.api.cached import kept_by_loaded
from base.errors import DomainError
from base.rules import requires
from base.views import (
    RESIZE,
    RESTART,
    VIEW_MODEL,
    fragment,
    kept_filters,
    normalized,
    redirect_or_location,
    render_page,
    wants_partial,
)
from catalog.models import Profile, Replica, ServedModel, Shard
from catalog.selectors import engine_defaults
from operations import views as operation_views
from operations.services.kv_pin import PINNABLE, kv_pin
from operations.services.resize import model_resize, model_set_context
from planning import Change
from versions.cache import remembered
from web.display import Preview, cards_said, hue, profile_memory, shape_facts
from web.forms import ContextForm, ModelFilterForm, ResizeForm
from web.model_rows import model_results


@requires(VIEW_MODEL)
@require_GET
def model_list(request: HttpRequest) -> HttpResponse:
    # The results read only the catalog, and hold nothing of the reader's: kept under its version
    # (versions/cache.py), each row also by what it is drawn from (web/model_rows.py); the page around
    # them is drawn anew.
    query = normalized(request.GET)
    results = remembered(
        "models-results",
        ["structure", "placement", "replicas"],  # the classes' names (fleet), the models, the counts
        [query.urlencode()],
        lambda: model_results(query),
        request=request,
    )
    if wants_partial(request):
        return fragment(results)
    return render_page(
        request,
        "catalog/model_list.html",
        {
            "section": "models",
            "filters": kept_filters(request, "catalog/model_list.html", query, ModelFilterForm.for_catalog),
            "results": results,
        },
    )


def _ranks_of(replica: Replica) -> list[tuple[int, str, str, str]]:
    """A replica across nodes, rank by rank: its rank, node, node state and cards there; empty for
    one on one node (prefetch ``shards__card__node``)."""
    ranks: dict[int, tuple[str, str, list[int]]] = {}
    for s in replica.shards.all():
        ranks.setdefault(s.rank, (s.card.node.name, s.card.node.state, []))[2].append(s.card.index)
    if len(ranks) < 2:
        return []
    return [
        (rank, node, state, cards_said(sorted(cards))) for rank, (node, state, cards) in sorted(ranks.items())
    ]


def _loaded_replicas(model: ServedModel) -> list[Replica]:
    """The model's replicas with their profiles, classes and cards' nodes: all the replicas section reads."""
    shards = Prefetch("shards", queryset=Shard.objects.select_related("card__node").order_by("card__index"))
    return list(
        Replica.objects.filter(profile__model=model)
        .select_related("profile__model", "profile__gpu_class")
        .prefetch_related(shards)
        .order_by("profile__name", "name")
    )


def _replicas_of(replicas: list[Replica]) -> list[Replica]:
    from planning.measured import compare
    from planning.units import gib
    from web.views.replicas import missing_said, planned_of

    for r in replicas:
        r.cards_said = [(node, cards_said(indices)) for node, indices in r.placement]  # type: ignore[attr-defined]
        # Each node it runs on with the node's state: a cordoned or down node is said beside its name.
        r.nodes = list({s.card.node.name: s.card.node.state for s in r.shards.all()}.items())  # type: ignore[attr-defined]
        r.ranks = _ranks_of(r)  # type: ignore[attr-defined]
        r.hue = hue(r.profile.model_id)  # type: ignore[attr-defined]
        # The need planned beside the need measured, over the terms the engine logged.
        r.memory_need = None  # type: ignore[attr-defined]
        r.memory_card = None  # type: ignore[attr-defined]
        r.memory_missing = missing_said(r.measured_memory)  # type: ignore[attr-defined]
        if r.measured_memory and r.measured_memory.get("card_bytes") is not None:
            # What nvidia-smi says its process holds a card: for an engine that prints no memory lines
            # the one measure, beside what was planned for the card.
            planned_need = planned_of(r)[0].get("need")
            r.memory_card = (  # type: ignore[attr-defined]
                gib(planned_need, 2) if planned_need is not None else None,
                gib(r.measured_memory["card_bytes"], 2),
            )
        if r.measured_memory:
            need = next(
                (row for row in compare(planned_of(r)[0], r.measured_memory) if row.term == "need"), None
            )
            if (
                need is not None
                and need.planned is not None
                and need.measured
                and need.difference is not None
            ):
                r.memory_need = (  # type: ignore[attr-defined]
                    gib(need.planned, 2),
                    gib(need.measured, 2),
                    f"{need.difference:+.1%}",
                )
    return replicas


def replicas_section(model: ServedModel) -> tuple[SafeString, int]:
    """The model page's replicas section, drawn, and how many of its live replicas are stale; drawn
    again only when a value loaded with the model or its replicas changed (``kept_by_loaded``): another
    model's replica changing state reads these again, and draws nothing."""
    replicas = _loaded_replicas(model)
    return kept_by_loaded(
        "model-replicas", [model, *replicas], lambda: _draw_replicas(model, _replicas_of(replicas))
    )


def _draw_replicas(model: ServedModel, replicas: list[Replica]) -> tuple[SafeString, int]:
    html = render_to_string(
        "catalog/model_detail.html#replicas",
        {
            "model": model,
            "replicas_shown": [r for r in replicas if r.state != Replica.State.STOPPED],
            # Stopped replicas pile up after restarts: folded away below the ones that run or failed.
            "replicas_stopped": [r for r in replicas if r.state == Replica.State.STOPPED],
        },
    )
    return html, sum(r.is_stale and r.is_live for r in replicas)


def kept_replicas_section(request: HttpRequest, model: ServedModel) -> tuple[SafeString, int]:
    """``replicas_section``, kept under the catalog's version (it reads nothing else)."""
    return remembered(
        "model-replicas",
        ["structure", "placement", "replicas"],
        [model.pk],
        lambda: replicas_section(model),
        request=request,
    )


def kept_profiles(request: HttpRequest, model: ServedModel) -> tuple[list[Profile], list[Any], SafeString]:
    """The model's profiles, each one's card memory as the memory model reckons it, and the page's
    shape and profiles column drawn (they hold nothing of the reader's), kept under the catalog's
    version; after a write to it read again (two queries) but reckoned and drawn again only when a
    value of the model, its profiles and their classes or the engines' default releases changed
    (``kept_by_loaded``): another model's edit draws nothing here."""

    def read() -> tuple[list[Profile], list[Any], SafeString]:
        profiles = list(model.profiles.select_related("gpu_class").order_by("name"))
        # the fleet's default releases, once: a profile without its own release runs its engine's
        defaults = engine_defaults() if profiles else {}

        def reckon() -> tuple[list[Profile], list[Any], SafeString]:
            memories = profile_memory(model, profiles, defaults=defaults)
            columns = render_to_string(
                "catalog/model_detail.html#columns",
                {"model": model, "facts": shape_facts(model), "memories": memories},
            )
            return profiles, memories, columns

        return kept_by_loaded("model-profiles", [model, *profiles], reckon, parts=sorted(defaults.items()))

    return remembered("model-profiles", ["structure"], [model.pk], read, request=request)


def _detail_context(
    request: HttpRequest,
    model: ServedModel,
    *,
    resize_form: ResizeForm | None = None,
    context_form: ContextForm | None = None,
    resize_preview: Preview | None = None,
    context_preview: Preview | None = None,
) -> dict[str, Any]:
    profiles, memories, columns = kept_profiles(request, model)
    on_cards = [m for m in memories if m.profile.gpu_class_id]
    can_resize = request.user.has_perm(RESIZE) and not model.declared and bool(on_cards)
    if can_resize:
        first = on_cards[0]
        resize_form = resize_form or ResizeForm(
            model=model, profiles=profiles, initial={"gpus": first.profile.cards}
        )
        context_form = context_form or ContextForm(
            model=model, profiles=profiles, initial={"tokens": first.context}
        )
    operation, rollback = operation_views.kept_latest_for(request, model)
    replicas, stale_live = kept_replicas_section(request, model)
    return {
        **(
            operation_views.progress_context(request, operation, rollback=rollback)
            if operation
            else {"operation": None}
        ),
        "section": "models",
        "model": model,
        "hue": hue(model.pk),
        "columns_html": columns,
        "memories": memories,
        "on_cards": on_cards,
        "replicas": replicas,
        "stale_live": stale_live,
        # A profile its cards cannot hold is not offered a restart: the restart would refuse it.
        "unfit": [m for m in on_cards if m.bar is not None and not m.bar.fits],
        "can_resize": can_resize,
        "can_restart": request.user.has_perm(RESTART),
        "resize_form": resize_form if can_resize else None,
        "context_form": context_form if can_resize else None,
        "resize_preview": resize_preview,
        "context_preview": context_preview,
        "kv_pins": _kv_pins(request, model, on_cards),
        **history_context(request, model_history_q(model.name), object_type="model", object=model.name),
    }


def _kv_pins(request: HttpRequest, model: ServedModel, on_cards: list[Any]) -> list[dict[str, Any]]:
    """For an editor, each profile whose engine can pin its KV pool: the pin its replicas' measured
    pools offer (operations.services.kv_pin), or why there is none yet; kept under the catalog's
    version, as the profiles' column is."""
    if not request.user.has_perm("catalog.change_profile") or model.declared:
        return []
    names = [m.profile.name for m in on_cards if m.profile.engine in PINNABLE]
    if not names:
        return []
    return remembered(
        "model-kv-pins",
        ["structure", "replicas"],
        [model.pk, names],
        lambda: _kv_offers(model, names),
        request=request,
    )


def _kv_offers(model: ServedModel, names: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in names:
        try:
            pin = kv_pin(model=model.name, profile=name)
        except DomainError as err:
            out.append({"profile": name, "pin": None, "why": err.message.split(": ", 1)[-1]})
            continue
        if pin.args_after != pin.args_before:
            out.append({"profile": name, "pin": pin, "why": ""})
    return out


@requires("catalog.change_profile")
@require_POST
def profile_pin_kv(request: HttpRequest, name: str, profile: str) -> HttpResponse:
    """Pin the profile's KV pool to the smallest its replicas measured (the audited profile save)."""
    back = reverse("model-detail", args=[name])
    try:
        done = kv_pin(model=name, profile=profile, dry_run=False)
    except DomainError as err:
        messages.error(request, f"{err.message} Nothing was changed.")
        return redirect_or_location(request, back)
    messages.success(
        request,
        f"The {profile} profile's KV cache pool is pinned at {done.kv_bytes} bytes a card (revision "
        f"{done.revision}); restart its replicas to put it in force.",
    )
    return redirect_or_location(request, back)


@requires(VIEW_MODEL)
@require_GET
def model_detail(request: HttpRequest, name: str) -> HttpResponse:
    model = get_object_or_404(ServedModel, name=name)
    return render_page(request, "catalog/model_detail.html", _detail_context(request, model))


@requires(VIEW_MODEL)
@require_GET
def model_replicas(request: HttpRequest, name: str) -> HttpResponse:
    """The model page's replicas section alone: what the page swaps in as its restart progresses."""
    model = get_object_or_404(ServedModel, name=name)
    return HttpResponse(kept_replicas_section(request, model)[0])


# -- resize and context: preview (dry run) and apply ---------------------------------------------------


@dataclass(frozen=True)
class ChangeKind:
    """One of the two changes the model page offers: its form, its service and its preview partial."""

    kind: str  # the Change's kind: "gpus" or "context"
    key: str  # "resize" or "context": the form's ids, the page's context and the partial's name
    value: str  # the form field that is also the service's keyword: "gpus" or "tokens"
    form_class: type[ResizeForm] | type[ContextForm]
    service: Callable[..., Change]

    @property
    def partial(self) -> str:
        return f"{self.key}-preview"

    def run(self, name: str, data: dict[str, Any], *, dry_run: bool) -> Change:
        return self.service(
            name=name,
            profile=data["profile"] or None,
            in_place=data["in_place"],
            dry_run=dry_run,
            **{self.value: data[self.value]},
            # A resize may name the nodes one replica spans (none: as few as hold the cards).
            **({"nodes": data.get("nodes")} if self.kind == "gpus" else {}),
        )


RESIZE_CHANGE = ChangeKind("gpus", "resize", "gpus", ResizeForm, model_resize)
CONTEXT_CHANGE = ChangeKind("context", "context", "tokens", ContextForm, model_set_context)


def _model_and_form(request: HttpRequest, name: str, change: ChangeKind) -> tuple[ServedModel, Any]:
    """The model and the bound form (the view has checked the resize permission)."""
    model = get_object_or_404(ServedModel, name=name)
    profiles = list(model.profiles.select_related("gpu_class").order_by("name"))
    return model, change.form_class(request.POST, model=model, profiles=profiles)


def _answer(
    request: HttpRequest, change: ChangeKind, model: ServedModel, form: Any, preview: Preview
) -> HttpResponse:
    """The preview fragment (htmx: status 200, refusals included), or the whole page showing it."""
    if wants_partial(request):
        return render_page(
            request, "catalog/model_detail.html", {"model": model, "preview": preview}, partial=change.partial
        )
    context = _detail_context(
        request, model, **{f"{change.key}_form": form, f"{change.key}_preview": preview}
    )
    return render_page(request, "catalog/model_detail.html", context)


def _preview(request: HttpRequest, name: str, change: ChangeKind) -> HttpResponse:
    """A dry run of the change as typed so far."""
    model, form = _model_and_form(request, name, change)
    if not form.is_valid():
        return _answer(request, change, model, form, Preview.of_form_errors(change.kind, form.errors))
    try:
        preview = Preview.of_change(change.run(model.name, form.cleaned_data, dry_run=True))
    except DomainError as err:
        preview = Preview.of_refusal(change.kind, err)
    return _answer(request, change, model, form, preview)


def _apply(request: HttpRequest, name: str, change: ChangeKind) -> HttpResponse:
    """The change for real: every check runs again; a refusal shows as the preview did."""
    model, form = _model_and_form(request, name, change)
    if not form.is_valid():
        return _answer(request, change, model, form, Preview.of_form_errors(change.kind, form.errors))
    try:
        done = change.run(model.name, form.cleaned_data, dry_run=False)
    except DomainError as err:
        return _answer(request, change, model, form, Preview.of_refusal(change.kind, err))
    messages.success(request, _applied_sentence(done))
    return redirect_or_location(request, reverse("model-detail", args=[model.name]) + "#restart")


def _applied_sentence(change: Change) -> str:
    revision = (
        Profile.objects.filter(model__name=change.model, name=change.profile)
        .values_list("revision", flat=True)
        .first()
    )
    unit = "cards" if change.kind == "gpus" else "tokens"
    text = (
        f"{change.model}/{change.profile}: {change.before} → {change.after} {unit}, saved as revision "
        f"{revision}."
    )
    operation = operation_views.operation_of(change)
    if operation is not None:
        text += f" Restart #{operation.pk} started."
    if change.note:
        text += f" {change.note}"
    return text


@requires(RESIZE)
@require_POST
def resize_preview(request: HttpRequest, name: str) -> HttpResponse:
    return _preview(request, name, RESIZE_CHANGE)


@requires(RESIZE)
@require_POST
def resize_apply(request: HttpRequest, name: str) -> HttpResponse:
    return _apply(request, name, RESIZE_CHANGE)


@requires(RESIZE)
@require_POST
def context_preview(request: HttpRequest, name: str) -> HttpResponse:
    return _preview(request, name, CONTEXT_CHANGE)


@requires(RESIZE)
@require_POST
def context_apply(request: HttpRequest, name: str) -> HttpResponse:
    return _apply(request, name, CONTEXT_CHANGE)
