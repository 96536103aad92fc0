"""The audit list's filters: the page, the API and the exports read them through this form."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from audit.models import Via
from audit.words import ACTIONS, OBJECT_TYPES, action_label, choices, object_type_label


class AuditFilterForm(forms.Form):
    """Every field optional; a bad value (a date that is no date, an operation that is no number) is an
    error naming the field, and nothing is listed."""

    who = forms.CharField(required=False, max_length=150, label="Who", help_text="user or command name")
    object_type = forms.ChoiceField(required=False, choices=choices(OBJECT_TYPES), label="Kind of object")
    object = forms.CharField(required=False, max_length=200, label="Object name")
    action = forms.ChoiceField(required=False, choices=choices(ACTIONS), label="Action")
    via = forms.ChoiceField(required=False, choices=[("", "any"), *Via.choices], label="Via")
    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))
    request_id = forms.CharField(required=False, max_length=64, label="Request id")
    operation = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1, label="Operation")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # An entry's own code that has no word yet (a link from an older entry) is still a choice.
        for name, words, label in (
            ("action", ACTIONS, action_label),
            ("object_type", OBJECT_TYPES, object_type_label),
        ):
            asked = self.data.get(name) if hasattr(self.data, "get") else None
            if asked and re.fullmatch(r"[a-z_]{1,64}", asked) and asked not in words:
                field = self.fields[name]
                field.choices = [*choices(words), (asked, label(asked))]  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            raise forms.ValidationError("“From” is after “To”: swap the dates.", code="dates_swapped")
        return data

    def errors_sentence(self) -> str:
        parts = []
        for field, errors in self.errors.items():
            where = "" if field == "__all__" else f"{self.fields[field].label}: "
            parts.append(where + " ".join(str(e) for e in errors))
        return "; ".join(parts)
