"""The operator pages' forms: they parse what was typed, the services judge it.

Ranges (1 to 64 cards, 1 to the model's context) are not validated here: the
planner refuses them with the same sentence the API gives, and the preview
shows that sentence. The inputs still carry ``min``/``max`` so that the arrow
keys stay in range; the forms are ``novalidate`` so the browser does not
block the preview.
"""

from __future__ import annotations

from typing import Any

from django import forms

from catalog.models import GPUClass, Profile, ServedModel

STATE_CHOICES = [("", "any"), ("editable", "set here"), ("declared", "declared in the cluster settings")]
CPU = "cpu"


def choice_field(form: forms.BaseForm, name: str) -> forms.ChoiceField:
    """The form's choice field ``name``, to set its choices."""
    field = form.fields[name]
    if not isinstance(field, forms.ChoiceField):
        raise TypeError(f"{name} is a {type(field).__name__}, not a choice field")
    return field


class ModelFilterForm(forms.Form):
    """The models list's search and filters; every field optional."""

    q = forms.CharField(
        required=False,
        label="Search",
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "name or source"}),
    )
    engine = forms.ChoiceField(required=False, label="Engine")
    gpu_class = forms.ChoiceField(required=False, label="GPU class")
    state = forms.ChoiceField(required=False, label="State", choices=STATE_CHOICES)
    stale = forms.BooleanField(required=False, label="Has stale replicas")

    def __init__(self, *args: Any, engines: list[str], gpu_classes: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choice_field(self, "engine").choices = [("", "any"), *((e, e) for e in engines)]
        choice_field(self, "gpu_class").choices = [
            ("", "any"),
            *((c, c) for c in gpu_classes),
            (CPU, "CPU only"),
        ]

    @classmethod
    def for_catalog(cls, data: Any) -> ModelFilterForm:
        engines = list(Profile.objects.order_by("engine").values_list("engine", flat=True).distinct())
        classes = list(GPUClass.objects.order_by("name").values_list("name", flat=True))
        return cls(data, engines=engines, gpu_classes=classes)


class _ChangeForm(forms.Form):
    """What resize and context share: the profile and in place."""

    prefix_id = "change"  # each form's ids start with its own, so both fit on one page
    profile = forms.ChoiceField(label="Profile")
    in_place = forms.BooleanField(
        required=False,
        label="In place",
        help_text="When no node has the cards free beside the running replicas: stop each replica before its "
        "replacement starts. The model does not answer while the new one loads.",
    )

    def __init__(self, *args: Any, model: ServedModel, profiles: list[Profile], **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", f"{self.prefix_id}_%s")
        super().__init__(*args, **kwargs)
        self.model = model
        self.fields["in_place"].widget.attrs["aria-describedby"] = f"{self.prefix_id}_in_place_help"
        on_cards = [p.name for p in profiles if p.gpu_class_id]
        field = choice_field(self, "profile")
        field.choices = [(name, name) for name in on_cards]
        if len(on_cards) == 1:
            # One profile on cards: nothing to choose, the form still says which.
            field.widget = forms.HiddenInput()
        if on_cards and not self.is_bound:
            self.initial.setdefault("profile", on_cards[0])


class ResizeForm(_ChangeForm):
    prefix_id = "resize"
    gpus = forms.IntegerField(
        label="Cards per replica",
        widget=forms.NumberInput(attrs={"min": 1, "max": 64, "inputmode": "numeric", "class": "narrow"}),
        error_messages={"required": "Type a card count.", "invalid": "A card count is a whole number."},
    )
    nodes = forms.IntegerField(
        label="Nodes (empty: as few as hold them)",
        required=False,
        widget=forms.NumberInput(attrs={"min": 1, "max": 64, "inputmode": "numeric", "class": "narrow"}),
        error_messages={"invalid": "A node count is a whole number."},
    )
    field_order = ["gpus", "nodes", "profile", "in_place"]


class ContextForm(_ChangeForm):
    prefix_id = "context"
    tokens = forms.IntegerField(
        label="Context (tokens)",
        widget=forms.NumberInput(attrs={"min": 1, "inputmode": "numeric"}),
        error_messages={
            "required": "Type a context length in tokens.",
            "invalid": "A context length is a whole number of tokens.",
        },
    )
    field_order = ["tokens", "profile", "in_place"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.model.context_length:
            self.fields["tokens"].widget.attrs["max"] = self.model.context_length


NODE_STATE_CHOICES = [("", "any"), *((s, s) for s in ("ready", "cordoned", "down"))]
NODE_VIEWS = [("cards", "cards"), ("compact", "compact")]


class NodeFilterForm(forms.Form):
    """The nodes page's filters and its view (a tile per card, or compact); every field optional."""

    name = forms.CharField(
        required=False,
        label="Name",
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "part of a node's name"}),
    )
    gpu_class = forms.ChoiceField(required=False, label="GPU class")
    state = forms.ChoiceField(required=False, label="State", choices=NODE_STATE_CHOICES)
    free = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=64,
        label="Free cards, at least",
        widget=forms.NumberInput(attrs={"min": 0, "max": 64, "inputmode": "numeric", "class": "narrow"}),
        error_messages={"invalid": "Free cards is a whole number."},
    )
    model = forms.CharField(
        required=False,
        label="Holding cards of",
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "a model's name"}),
    )
    view = forms.ChoiceField(required=False, label="View", choices=NODE_VIEWS)

    def __init__(self, *args: Any, gpu_classes: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["gpu_class"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", "any"), *((c, c) for c in gpu_classes)]

    @classmethod
    def for_fleet(cls, data: Any) -> NodeFilterForm:
        return cls(data, gpu_classes=list(GPUClass.objects.order_by("name").values_list("name", flat=True)))
