"""How the gpus and context commands print a change."""

from __future__ import annotations

from planning import Change


def describe(change: Change, *, dry_run: bool) -> str:
    unit = "card(s)" if change.kind == "gpus" else "tokens"
    lines = [
        f"{'would change' if dry_run else 'changed'} {change.model}/{change.profile} ({change.engine} on "
        f"{change.gpu_class or 'CPU'}): {change.before if change.before is not None else '?'} → {change.after} {unit}",
        f"  args: {' '.join(change.args) or '(none)'}",
    ]
    nodes = change.new_profile.nodes if change.new_profile is not None else 1
    if nodes > 1:
        lines.append(f"  across {nodes} nodes, a rank on each")
    if change.per_card:
        lines.append(f"  memory: {change.per_card}")
    for place in change.room.places if change.room is not None else ():
        if len(place.ranks) > 1:
            lines.append(f"  place: {place.text}")
    if change.room is not None:
        lines.append(
            "  restart: "
            + (
                "in place (each replica stops before its replacement starts)"
                if change.in_place
                else "rolling"
            )
        )
    if change.restarted:
        lines.append(
            f"  restarting {change.restarted} replica(s): operation #{change.operation} "
            f"(its page /operations/{change.operation}/, or GET /api/operations/{change.operation}/)"
        )
    if change.note:
        lines.append(f"  note: {change.note}")
    return "\n".join(lines)
