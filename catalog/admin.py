"""The catalog editors' admin. Every save and delete goes through the services."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import path, reverse

from audit.services import snapshot
from base.errors import DomainError
from base.secrets import masked_env, placeholder, unmasked_env
from catalog.models import (
    Card,
    GPUClass,
    Node,
    Profile,
    Replica,
    ServedModel,
    Shard,
    live_replicas_q,
    stale_replicas_q,
)
from catalog.services import catalog as services
from planning.types import SHAPE_FIELDS

SAVE: dict[type[models.Model], Callable[..., Any]] = {
    GPUClass: services.gpu_class_save,
    Node: services.node_save,
    Card: services.card_save,
    ServedModel: services.model_save,
    Profile: services.profile_save,
    Replica: services.replica_save,
    Shard: services.shard_save,
}
DELETE: dict[type[models.Model], Callable[..., Any]] = {
    GPUClass: services.gpu_class_delete,
    Node: services.node_delete,
    Card: services.card_delete,
    ServedModel: services.model_delete,
    Profile: services.profile_delete,
    Replica: services.replica_delete,
    Shard: services.shard_delete,
}


class ServiceAdmin(admin.ModelAdmin):
    """Routes the admin's writes through the services, which audit them.

    A refusal (a declared model, a card in use) is shown as an error message;
    the change is not saved.
    """

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        SAVE[type(obj)](instance=obj)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        DELETE[type(obj)](instance=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for obj in queryset:
            DELETE[type(obj)](instance=obj)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        instances = formset.save(commit=False)
        for obj in formset.deleted_objects:
            DELETE[type(obj)](instance=obj)
        for obj in instances:
            SAVE[type(obj)](instance=obj)
        formset.save_m2m()

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().changeform_view(request, *args, **kwargs)
        except DomainError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().delete_view(request, *args, **kwargs)
        except DomainError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        try:
            return super().changelist_view(request, extra_context)
        except DomainError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())


class WriteOnlySecrets:
    """Secrets are write-only in the admin: where a form shows its fields read-only (a lead, who may
    only view; a declared model's profiles, for everyone), each secret field is shown by a display
    that gives its placeholder (``base/secrets.py``), never the value. The edit forms mask them
    themselves (a token's field is never rendered back, an environment's secret values are
    placeholders that keep the stored value when sent back)."""

    # A secret field -> the display (a method of the admin) shown in its place when read-only.
    secrets_shown_as: dict[str, str] = {}

    def _shows_read_only(self, request: HttpRequest, obj: Any) -> bool:
        # An inline is asked about its parent: a declared model's, or a lead's view of any.
        return obj is not None and not self.has_change_permission(request, obj)  # type: ignore[attr-defined]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)  # type: ignore[misc]
        if not self._shows_read_only(request, obj):
            return fields
        shown = [self.secrets_shown_as.get(name, name) for name in fields]
        return list(dict.fromkeys(shown))  # a display the read-only fields already named, once

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        if self._shows_read_only(request, obj):
            fields += [name for name in self.secrets_shown_as.values() if name not in fields]
        return fields

    @admin.display(description="agent token")
    def agent_token_shown(self, node: Node) -> str:
        return placeholder(node.agent_token)

    @admin.display(description="env")
    def env_shown(self, profile: Profile) -> str:
        return json.dumps(masked_env(profile.engine, profile.env or {}), ensure_ascii=False)


@admin.register(GPUClass)
class GPUClassAdmin(ServiceAdmin):
    list_display = ["name", "memory_mib", "usable_mib", "compute_capability", "card_count"]
    search_fields = ["name"]
    list_filter = ["compute_capability"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(_cards=Count("cards"))

    @admin.display(description="cards", ordering="_cards")
    def card_count(self, obj: GPUClass) -> int:
        return obj._cards  # type: ignore[attr-defined]  # annotated by get_queryset


class CardInline(admin.TabularInline):
    model = Card
    extra = 0
    fields = ["index", "gpu_class", "held_by"]
    readonly_fields = ["held_by"]

    @admin.display(description="held by")
    def held_by(self, card: Card) -> str:
        shard = getattr(card, "shard", None) if card.pk else None
        return shard.replica.name if shard else "free"


class CheckedForm(forms.ModelForm):
    """Runs the service's own checks as form validation, so that a refusal is
    shown on the form with everything the editor typed kept (the service
    checks again when it saves)."""

    def _post_clean(self) -> None:
        # Django's hook once the instance is built from the form; django-stubs leaves private hooks out.
        super()._post_clean()  # type: ignore[misc]
        if self.errors:
            return
        try:
            self.check_with_services(self.instance)
        except DomainError as exc:
            self.add_error(None, exc.message)

    def check_with_services(self, instance: Any) -> None:
        raise NotImplementedError


class NodeAdminForm(CheckedForm):
    # Agents listen on the fleet's own network, over https unless LLMGW_AGENT_PLAIN_HTTP_NETWORKS names it.
    agent_url = forms.URLField(
        assume_scheme="https",
        help_text="Base URL of the node agent, e.g. https://10.0.0.5:9101 (plain http:// is called only "
        "inside LLMGW_AGENT_PLAIN_HTTP_NETWORKS, loopback by default: the agent token would go in clear)",
    )
    # Write-only: never rendered back; left empty on a change, the token stays as it is.
    agent_token = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        required=False,
        help_text="Bearer token the node agent expects. Never shown; leave empty to keep it "
        "(it must be given again when the agent URL changes).",
    )

    class Meta:
        model = Node
        # The state is cordon's, uncordon's and drain's: shown read-only (NodeAdmin.readonly_fields).
        fields = ["name", "agent_url", "agent_token", "fabric_domain"]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        current = Node.objects.filter(pk=self.instance.pk).first() if self.instance.pk else None
        token = data.get("agent_token") or ""
        if current is None and not token:
            self.add_error("agent_token", "A new node needs the token its agent expects.")
        elif current is not None and not token:
            if data.get("agent_url") and data["agent_url"] != current.agent_url:
                self.add_error("agent_token", "Changing the agent URL needs the agent token again.")
            data["agent_token"] = current.agent_token
        return data

    def check_with_services(self, instance: Node) -> None:
        services.validate_agent_url(instance.agent_url)


class ProfileAdminForm(CheckedForm):
    class Meta:
        model = Profile
        fields = ["model", "name", "engine", "gpu_class", "gpus_per_node", "tp", "nodes", "pp", "args", "env"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk and "env" in self.fields and not self.is_bound:
            # Secret values (API keys) are write-only: shown as placeholders.
            self.initial["env"] = masked_env(self.instance.engine, self.instance.env or {})

    def clean_env(self) -> Any:
        env = self.cleaned_data.get("env")
        if self.instance.pk and isinstance(env, dict):
            stored = Profile.objects.filter(pk=self.instance.pk).values_list("env", flat=True).first() or {}
            return unmasked_env(env, stored)
        return env

    def check_with_services(self, instance: Profile) -> None:
        if not getattr(instance, "model_id", None):
            return
        before = None
        if instance.pk:
            stored = Profile.objects.filter(pk=instance.pk).first()
            before = snapshot(stored) if stored is not None else None
        services.ensure_not_declared(instance.model)
        services.validate_profile_spec(instance, before=before)


# The shape's figures that are never unknown, only 0 by default (sliding_layers,
# replicated_bytes): left empty on the form, each stays as it was.
_DEFAULTED_SHAPE_FIELDS = tuple(
    f.name
    for f in ServedModel._meta.concrete_fields
    if f.name in SHAPE_FIELDS and not f.null and f.has_default()
)


class ServedModelAdminForm(CheckedForm):
    class Meta:
        model = ServedModel
        # Every shape field, as the API and the settings file take them (an editor corrects what an
        # import read wrong).
        fields = ["name", "source", "context_length", *SHAPE_FIELDS, "declared", "declared_in"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in _DEFAULTED_SHAPE_FIELDS:
            if name in self.fields:
                self.fields[name].required = False

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        for name in _DEFAULTED_SHAPE_FIELDS:
            if name in self.fields and name in data and data[name] is None:
                data[name] = getattr(self.instance, name)  # as it was; a new model's is the default
        return data

    def check_with_services(self, instance: ServedModel) -> None:
        services.validate_model_source(instance.source)


@admin.register(Node)
class NodeAdmin(WriteOnlySecrets, ServiceAdmin):
    form = NodeAdminForm
    secrets_shown_as = {"agent_token": "agent_token_shown"}
    inlines = [CardInline]
    list_display = ["name", "state", "reachable", "last_seen_at", "agent_url", "cards_total", "free_cards"]
    # The state (changed by cordon, uncordon and drain) and what the reconciler learnt from the agent
    # (operations/services/reconcile.py): shown, never edited.
    readonly_fields = ["state", "reachable", "last_seen_at", "unreachable_reason", "orphans"]

    @admin.display(description="last seen")
    def last_seen_at(self, node: Node) -> Any:
        return node.last_seen_at

    list_filter = ["state", "cards__gpu_class"]
    search_fields = ["name", "agent_url"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).prefetch_related("cards__gpu_class", "cards__shard")

    @admin.display(description="cards")
    def cards_total(self, node: Node) -> int:
        return len(node.cards.all())

    @admin.display(description="free cards per class")
    def free_cards(self, node: Node) -> str:
        free: dict[str, list[int]] = {}
        for card in node.cards.all():
            counts = free.setdefault(card.gpu_class.name, [0, 0])
            counts[1] += 1
            if not hasattr(card, "shard"):
                counts[0] += 1
        return ", ".join(f"{name}: {f}/{t} free" for name, (f, t) in sorted(free.items())) or "no cards"


class ProfileInline(WriteOnlySecrets, admin.StackedInline):
    model = Profile
    form = ProfileAdminForm
    secrets_shown_as = {"env": "env_shown"}
    extra = 0
    fields = ["name", "engine", "gpu_class", "gpus_per_node", "tp", "nodes", "pp", "args", "env", "revision"]
    readonly_fields = ["revision"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return not (obj and obj.declared) and super().has_add_permission(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return not (obj and obj.declared) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return not (obj and obj.declared) and super().has_delete_permission(request, obj)


class ImportConfigForm(forms.Form):
    name = forms.CharField(max_length=128, help_text="The served model's name, e.g. llama-3.1-8b.")
    source = forms.CharField(max_length=500, help_text="Hugging Face repo id or a path on the nodes.")
    config = forms.FileField(label="config.json", required=False)
    index = forms.FileField(label="model.safetensors.index.json", required=False)
    from_hub = forms.BooleanField(
        required=False,
        label="Fetch from the Hub",
        help_text="Instead of uploading: fetch config.json and the safetensors index of the source, a "
        "Hugging Face repo id (HF_TOKEN, HF_ENDPOINT, the cache and HF_HUB_OFFLINE apply).",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not data.get("from_hub") and not data.get("config"):
            raise forms.ValidationError(
                "Upload config.json, or tick Fetch from the Hub for a repo id source."
            )
        return data


@admin.register(ServedModel)
class ServedModelAdmin(ServiceAdmin):
    form = ServedModelAdminForm
    inlines = [ProfileInline]
    list_display = [
        "name",
        "source",
        "attention",
        "context_length",
        "declared",
        "replica_count",
        "stale_count",
    ]
    list_filter = ["declared", "attention", "profiles__engine", "profiles__gpu_class"]
    search_fields = ["name", "source"]
    change_list_template = "admin/catalog/servedmodel/change_list.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        live = live_replicas_q("profiles__replicas__")
        return (
            super()
            .get_queryset(request)
            .annotate(
                _replicas=Count("profiles__replicas", filter=live, distinct=True),
                _stale=Count(
                    "profiles__replicas",
                    filter=live & stale_replicas_q("profiles__replicas__"),
                    distinct=True,
                ),
            )
        )

    @admin.display(description="replicas", ordering="_replicas")
    def replica_count(self, obj: ServedModel) -> int:
        return obj._replicas  # type: ignore[attr-defined]  # annotated by get_queryset

    @admin.display(description="stale")
    def stale_count(self, obj: ServedModel) -> int:
        return obj._stale  # type: ignore[attr-defined]  # annotated by get_queryset

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is not None and obj.declared:
            return [f.name for f in ServedModel._meta.concrete_fields if not f.primary_key]
        return ["declared", "declared_in"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return not (obj and obj.declared) and super().has_delete_permission(request, obj)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ):
        obj = self.get_object(request, object_id)
        if obj is not None and obj.declared:
            self.message_user(
                request,
                services.declared_refusal(obj).message,
                messages.WARNING,
            )
        return super().change_view(request, object_id, form_url, extra_context)

    def get_urls(self) -> list[Any]:
        return [
            path(
                "import-config/",
                self.admin_site.admin_view(self.import_config_view),
                name="catalog_model_import",
            ),
            *super().get_urls(),
        ]

    def import_config_view(self, request: HttpRequest) -> HttpResponse:
        """Create or refresh a model's shape from an uploaded config.json (and index)."""
        from catalog.modelfiles import (
            parse_config_bytes,
            parse_index_bytes,
            shape_from_config,
            shape_from_hub,
        )

        if not self.has_add_permission(request):
            return HttpResponse(status=403)
        form = ImportConfigForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            try:
                if form.cleaned_data["from_hub"]:
                    shape = shape_from_hub(form.cleaned_data["source"])
                else:
                    config = parse_config_bytes(form.cleaned_data["config"].read(), "config.json")
                    upload = form.cleaned_data["index"]
                    index = parse_index_bytes(upload.read(), upload.name) if upload else None
                    shape = shape_from_config(config, index=index, source="config.json")
                model = services.model_import(
                    name=form.cleaned_data["name"],
                    source=form.cleaned_data["source"],
                    shape=shape.as_fields(),
                )
            except DomainError as exc:
                form.add_error(None, exc.message)
            else:
                for note in shape.notes:
                    self.message_user(request, note, messages.WARNING)
                self.message_user(request, f"Imported the shape of {model.name}.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:catalog_servedmodel_change", args=[model.pk]))
        context = {
            **self.admin_site.each_context(request),
            "form": form,
            "opts": self.model._meta,
            "title": "Import a model from config.json",
        }
        return render(request, "admin/catalog/servedmodel/import_config.html", context)


@admin.register(Profile)
class ProfileAdmin(WriteOnlySecrets, ServiceAdmin):
    form = ProfileAdminForm
    secrets_shown_as = {"env": "env_shown"}
    list_display = ["__str__", "engine", "gpu_class", "gpus_per_node", "tp", "nodes", "pp", "revision"]
    list_filter = ["engine", "gpu_class"]
    search_fields = ["name", "model__name"]
    list_select_related = ["model", "gpu_class"]
    readonly_fields = ["revision", "engine_version"]  # the release: an upgrade's (the releases page)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return not (obj and obj.model.declared) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return not (obj and obj.model.declared) and super().has_delete_permission(request, obj)


class ShardInline(admin.TabularInline):
    model = Shard
    extra = 0
    autocomplete_fields = ["card"]


@admin.register(Card)
class CardAdmin(ServiceAdmin):
    list_display = ["__str__", "gpu_class", "node", "cordoned"]
    # Changed by card_cordon / card_uncordon only (the node page, the API, the commands), audited there.
    readonly_fields = ["cordoned", "cordon_reason"]
    list_filter = ["gpu_class", "node"]
    search_fields = ["node__name"]
    list_select_related = ["node", "gpu_class"]


@admin.register(Replica)
class ReplicaAdmin(ServiceAdmin):
    inlines = [ShardInline]
    list_display = ["name", "model_name", "profile", "state", "revision", "is_stale", "port"]
    list_filter = ["state", "profile__engine", "profile__model"]
    search_fields = ["name", "profile__model__name"]
    list_select_related = ["profile__model"]

    @admin.display(description="model", ordering="profile__model__name")
    def model_name(self, obj: Replica) -> str:
        return obj.profile.model.name

    @admin.display(description="stale", boolean=True)
    def is_stale(self, obj: Replica) -> bool:
        return obj.is_stale
