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
    if change.per_card:
        lines.append(f"  memory: {change.per_card}")
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
