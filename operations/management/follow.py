"""Following a restart from a command: a live table on a terminal, a line per change otherwise.

The ``restart`` command and the ``gpus`` and ``context`` commands (whose change starts a restart)
show it the same way and exit the same way: 0 when every replica was restarted, 1 when not, 2
when the operator stopped watching (the restart goes on in the worker).
"""

from __future__ import annotations

import time
from typing import Any, TextIO, cast

from django.core.management.base import CommandError, OutputWrapper
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from operations.models import RestartOperation, RestartStep
from operations.selectors import operations_with_steps

POLL_SECONDS = 0.5
# A restart still queued after this long probably has no worker to run it.
NO_WORKER_HINT_SECONDS = 10.0
STYLES = {
    "succeeded": "green",
    "failed": "red",
    "partly_failed": "red",
    "cancelled": "yellow",
    "waiting": "cyan",
    "starting": "cyan",
    "stopping": "cyan",
    "running": "cyan",
    "queued": "dim",
    "pending": "dim",
}


class _Out:
    """The command's stdout as a file for rich (OutputWrapper would add newlines of its own)."""

    def __init__(self, wrapper: Any):
        self.wrapper = wrapper

    def write(self, text: str) -> int:
        self.wrapper.write(text, ending="")
        return len(text)

    def flush(self) -> None:
        self.wrapper.flush()

    def isatty(self) -> bool:
        return self.wrapper.isatty()


def load(operation_id: int) -> RestartOperation:
    return operations_with_steps().get(pk=operation_id)


def cards_text(cards: list[int]) -> str:
    """``card #3`` or ``cards #3, #4``: indexes, said to be indexes."""
    if not cards:
        return "-"
    return ("card " if len(cards) == 1 else "cards ") + ", ".join(f"#{c}" for c in cards)


def table(op: RestartOperation) -> Group:
    """The steps in a table narrow enough for 80 columns, each step's reason below it on a line
    of its own (the whole width), numbered as the table's rows."""
    title = (
        f"restart #{op.pk} of {op.model.name}/{op.profile.name}: {op.get_state_display()} "
        f"({op.mode}, {op.max_parallel} at a time, asked by {op.requested_by_name})"
    )
    out = Table(title=title, title_justify="left", expand=False)
    out.add_column("#", justify="right", no_wrap=True)
    for column in ("replica", "replacement", "on"):
        out.add_column(column, overflow="fold")
    out.add_column("state", no_wrap=True)
    reasons: list[Text] = []
    for n, step in enumerate(op.steps.all(), start=1):
        out.add_row(
            str(n),
            step.old_replica.name if step.old_replica is not None else "-",
            (step.new_replica.name if step.new_replica is not None else "-")
            + (" (in place)" if step.in_place else ""),
            f"{step.node} {cards_text(list(step.cards))}" if step.node else "-",
            Text(step.get_state_display(), style=STYLES.get(step.state, "")),
        )
        if step.reason:
            reasons.append(Text(f"{n}. {step.reason}"))
    if op.reason:
        reasons.append(Text(op.reason, style="bold"))
    return Group(out, *reasons)


def follow(operation_id: int, stdout: OutputWrapper, stderr: OutputWrapper) -> RestartOperation:
    """Show the operation until it ends, then say how it ended; a CommandError unless it succeeded."""
    try:
        op = _watch(operation_id, stdout, stderr)
    except KeyboardInterrupt:
        raise CommandError(
            f"Stopped watching; restart #{operation_id} goes on in the worker. Cancel it with POST "
            f"/api/operations/{operation_id}/cancel/ or from its page.",
            returncode=2,
        ) from None
    for step in op.steps.all():
        if step.state == RestartStep.State.FAILED:
            stdout.write(
                f"{step.old_replica.name if step.old_replica is not None else 'step'} failed: {step.reason}"
            )
    stdout.write(f"restart #{op.pk} {op.get_state_display()}: {op.reason}")
    if op.state != RestartOperation.State.SUCCEEDED:
        raise CommandError(
            f"restart #{op.pk} of {op.model.name} {op.get_state_display()}: {op.reason}", returncode=1
        )
    return op


def _watch(operation_id: int, stdout: OutputWrapper, stderr: OutputWrapper) -> RestartOperation:
    # rich needs only write, flush and isatty of its file.
    console = Console(file=cast(TextIO, _Out(stdout)), highlight=False, soft_wrap=not stdout.isatty())
    began = time.monotonic()
    hinted = False
    op = load(operation_id)
    if console.is_terminal:
        with Live(table(op), console=console, refresh_per_second=4) as live:
            while op.is_active:
                time.sleep(POLL_SECONDS)
                op = load(operation_id)
                live.update(table(op))
                hinted = hinted or _hint(op, began, stderr)
        return op
    seen: dict[Any, tuple[str, str]] = {}
    while True:
        for step in [None, *op.steps.all()]:
            key, line = _line(op, step)
            if seen.get(key) != line:
                seen[key] = line
                console.print(line[1], markup=False)
        if not op.is_active:
            return op
        hinted = hinted or _hint(op, began, stderr)
        time.sleep(POLL_SECONDS)
        op = load(operation_id)


def _line(op: RestartOperation, step: RestartStep | None) -> tuple[Any, tuple[str, str]]:
    if step is None:
        return "op", (
            op.state,
            f"restart #{op.pk}: {op.get_state_display()}" + (f" ({op.worker})" if op.worker else ""),
        )
    old = step.old_replica.name if step.old_replica is not None else "?"
    new = f" → {step.new_replica.name}" if step.new_replica is not None else ""
    where = f" on {step.node} {cards_text(list(step.cards))}" if step.node else ""
    reason = step.reason.splitlines()[0] if step.reason else ""
    return step.pk, (
        step.state + reason,
        f"  {old}{new}{where}: {step.get_state_display()}" + (f" - {reason}" if reason else ""),
    )


def _hint(op: RestartOperation, began: float, stderr: OutputWrapper) -> bool:
    if op.abandoned_text:
        stderr.write(f"restart #{op.pk}: {op.abandoned_text}")
        return True
    if op.state == RestartOperation.State.QUEUED and time.monotonic() - began > NO_WORKER_HINT_SECONDS:
        stderr.write(f"restart #{op.pk} is still queued: is a worker running? (python manage.py db_worker)")
        return True
    return False
