"""An entry's summary line and its field-by-field diff, in the operators' words.

"llama-3.1-8b/h100: 1 → 2 cards" reads better than a list of changed columns:
a profile's spread is said as its card count, the columns as the pages name
them, and what has no words of its own falls back to the entry's message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from audit.models import AuditEntry
from audit.words import action_label, object_type_label

# The pages' words for the columns an operator changes most.
LABELS = {
    "gpus_per_node": "cards per node",
    "tp": "TP",
    "pp": "pipeline stages",
    "nodes": "nodes",
    "args": "arguments",
    "env": "environment",
    "revision": "revision",
    "usable_mib": "usable memory (MiB)",
    "memory_mib": "memory (MiB)",
    "agent_url": "agent URL",
    "agent_token": "agent token",
    "state": "state",
    "context_length": "context length",
    "gpu_class": "GPU class",
}
SPREAD = ("gpus_per_node", "tp", "nodes", "pp")
# Actions whose message says it in the operators' words better than the changed fields would
# ("replica x adopted revision 5 without a restart: ..." rather than "revision 3 → 5").
SAID_BY_MESSAGE = frozenset({"adopt"})


def label(field: str) -> str:
    return LABELS.get(field, field.replace("_", " "))


def cards(snapshot: dict[str, Any]) -> int | None:
    """A profile's card count, as ``Profile.cards`` counts it."""
    try:
        per_node = max(int(snapshot.get("gpus_per_node") or 1), int(snapshot.get("tp") or 1), 1)
        nodes = max(int(snapshot.get("nodes") or 1), int(snapshot.get("pp") or 0), 1)
    except (TypeError, ValueError):
        return None
    return per_node * nodes


def short(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return " ".join(str(v) for v in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    return str(value)


def changed(entry: AuditEntry) -> list[str]:
    before, after = entry.before or {}, entry.after or {}
    if not entry.before or not entry.after:
        return []
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def summarize(entry: AuditEntry) -> str:
    """One line saying what changed: spread as cards, the rest as "label before → after"."""
    name = entry.object_key
    if entry.before is None and entry.after is not None and entry.action in ("create", "import"):
        return f"{object_type_label(entry.object_type)} {entry.object_repr} added"
    if entry.after is None and entry.before is not None and entry.action == "delete":
        return f"{object_type_label(entry.object_type)} {entry.object_repr} removed"
    if entry.action in SAID_BY_MESSAGE and entry.message:
        return entry.message
    fields = changed(entry)
    if not fields:
        return entry.message or f"{object_type_label(entry.object_type)} {name}: {action_label(entry.action)}"
    before, after = entry.before or {}, entry.after or {}
    parts = []
    if entry.object_type == "profile" and any(f in SPREAD for f in fields):
        was, now = cards(before), cards(after)
        if was != now:
            parts.append(f"{was} → {now} cards")
        fields = [f for f in fields if f not in SPREAD]
    for field in fields:
        if field == "revision":
            continue  # follows every change of what runs: said by the change itself
        parts.append(f"{label(field)} {short(before.get(field))} → {short(after.get(field))}")
    if not parts:
        parts = [f"revision {before.get('revision')} → {after.get('revision')}"]
    return f"{name}: " + "; ".join(parts)


@dataclass(frozen=True)
class DiffRow:
    field: str
    label: str
    before: str
    after: str
    changed: bool


# Values that mean "not set" in a field, said so rather than as their number.
NOT_SET = {"pp": 0}


def pretty(value: Any, field: str = "") -> str:
    if field in NOT_SET and value == NOT_SET[field]:
        return "none"
    if isinstance(value, (dict, list)):
        return json.dumps(value, indent=2, sort_keys=True)
    return "" if value is None else str(value)


def diff_rows(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[DiffRow]:
    """Every field of either side, the changed ones marked (both sides present: an update)."""
    b, a = before or {}, after or {}
    both = before is not None and after is not None
    return [
        DiffRow(
            field=k,
            label=label(k),
            before=pretty(b.get(k), k) if before is not None else "",
            after=pretty(a.get(k), k) if after is not None else "",
            changed=both and b.get(k) != a.get(k),
        )
        for k in sorted(set(b) | set(a))
    ]


def compact(value: Any, limit: int = 120) -> str:
    """A value on one short line: lists and maps flattened (``short``), cut at ``limit`` characters."""
    text = short(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def change_rows(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[DiffRow]:
    """What a change did, field by field, each value on one line: an update's changed fields only;
    an added or removed row's fields that hold something."""
    b, a = before or {}, after or {}
    if before is not None and after is not None:
        keys = sorted(k for k in set(b) | set(a) if b.get(k) != a.get(k))
    else:
        keys = sorted(
            k
            for k in set(b) | set(a)
            if (b.get(k) if before is not None else a.get(k)) not in (None, "", [], {})
        )
    return [
        DiffRow(
            field=k,
            label=label(k),
            before=compact(b.get(k)) if before is not None else "",
            after=compact(a.get(k)) if after is not None else "",
            changed=before is not None and after is not None,
        )
        for k in keys
    ]
