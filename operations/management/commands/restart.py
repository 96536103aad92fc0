from __future__ import annotations

import time
from typing import Any, TextIO, cast

from django.core.management.base import CommandError, CommandParser
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from catalog.management.base import ActorCommand
from operations.models import RestartOperation, RestartStep
from operations.selectors import operations_with_steps
from operations.services.start import MAX_PARALLEL, restart_start

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


def table(op: RestartOperation) -> Table:
    title = (
        f"restart #{op.pk} of {op.model.name}/{op.profile.name}: {op.get_state_display()} "
        f"({op.mode}, {op.max_parallel} at a time, asked by {op.requested_by_name})"
    )
    out = Table(title=title, title_justify="left", expand=False)
    for column in ("replica", "replacement", "node", "cards", "state"):
        out.add_column(column, no_wrap=True)
    out.add_column("reason", overflow="fold", ratio=1)
    for step in op.steps.all():
        out.add_row(
            step.old_replica.name if step.old_replica is not None else "-",
            (step.new_replica.name if step.new_replica is not None else "-")
            + (" (in place)" if step.in_place else ""),
            step.node or "-",
            ", ".join(str(c) for c in step.cards) or "-",
            Text(step.get_state_display(), style=STYLES.get(step.state, "")),
            step.reason,
        )
    return out


class Command(ActorCommand):
    help = (
        "Restart a model's replicas through the node agents: those running an older profile revision, or the "
        "ones named. A worker runs it (python manage.py db_worker); this shows its steps live until it ends "
        "and exits 1 unless every replica was restarted."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("model", help="the model's name")
        parser.add_argument(
            "--replica",
            dest="replicas",
            action="append",
            metavar="NAME",
            default=None,
            help="a live replica to restart (repeat for several); default: the stale ones",
        )
        parser.add_argument(
            "--in-place",
            action="store_const",
            const=True,
            default=None,
            help="stop each replica before its replacement starts on its cards (the model does "
            "not answer while the new one loads); default: rolling where a node has room",
        )
        parser.add_argument(
            "--rolling",
            dest="in_place",
            action="store_const",
            const=False,
            help="rolling only: a replica with no room beside it is not restarted",
        )
        parser.add_argument(
            "--max-parallel",
            type=int,
            default=1,
            metavar="N",
            help=f"replicas restarted at once, 1 to {MAX_PARALLEL} (default 1)",
        )
        parser.add_argument(
            "--ready-timeout",
            type=float,
            default=600,
            metavar="SECONDS",
            help="seconds a replacement has to become ready (default 600)",
        )
        parser.add_argument(
            "--settle",
            type=float,
            default=None,
            metavar="SECONDS",
            help="seconds a replacement must stay ready before its old replica is stopped "
            "(default: LLMGW_RESTART_SETTLE_SECONDS)",
        )
        parser.add_argument(
            "--stop-at-first-failure",
            action="store_true",
            help="start no new step once one failed (default: every replica is still tried, so a fault on "
            "one node does not leave the others on the old revision)",
        )
        parser.add_argument(
            "--no-wait",
            action="store_true",
            help="start the restart and exit; follow it in the pages or at /api/operations/ID/",
        )

    def act(self, *args: Any, **options: Any) -> None:
        op = restart_start(
            model_name=options["model"],
            replicas=options["replicas"],
            in_place=options["in_place"],
            max_parallel=options["max_parallel"],
            ready_timeout=options["ready_timeout"],
            settle_seconds=options["settle"],
            stop_at_first_failure=options["stop_at_first_failure"],
        )
        names = ", ".join(
            s.old_replica.name for s in op.steps.select_related("old_replica") if s.old_replica is not None
        )
        self.stdout.write(f"restart #{op.pk} of {op.model.name} queued: {names} ({op.mode})")
        if options["no_wait"]:
            self.stdout.write(f"follow it: /operations/{op.pk}/ (pages) or /api/operations/{op.pk}/")
            return
        try:
            op = self.watch(op.pk)
        except KeyboardInterrupt:
            raise CommandError(
                f"Stopped watching; restart #{op.pk} goes on in the worker. Cancel it with POST "
                f"/api/operations/{op.pk}/cancel/ or from its page.",
                returncode=2,
            ) from None
        for step in op.steps.all():
            if step.state == RestartStep.State.FAILED:
                self.stdout.write(
                    f"{step.old_replica.name if step.old_replica is not None else 'step'} failed: {step.reason}"
                )
        self.stdout.write(f"restart #{op.pk} {op.get_state_display()}: {op.reason}")
        if op.state != RestartOperation.State.SUCCEEDED:
            raise CommandError(
                f"restart #{op.pk} of {op.model.name} {op.get_state_display()}: {op.reason}", returncode=1
            )

    def watch(self, operation_id: int) -> RestartOperation:
        """Show the operation until it ends: a live table on a terminal, a line per change otherwise."""
        # rich needs only write, flush and isatty of its file.
        console = Console(
            file=cast(TextIO, _Out(self.stdout)), highlight=False, soft_wrap=not self.stdout.isatty()
        )
        began = time.monotonic()
        hinted = False
        op = load(operation_id)
        if console.is_terminal:
            with Live(table(op), console=console, refresh_per_second=4) as live:
                while op.is_active:
                    time.sleep(POLL_SECONDS)
                    op = load(operation_id)
                    live.update(table(op))
                    hinted = hinted or self._hint(op, began)
            return op
        seen: dict[Any, tuple[str, str]] = {}
        while True:
            for step in [None, *op.steps.all()]:
                key, line = self._line(op, step)
                if seen.get(key) != line:
                    seen[key] = line
                    console.print(line[1], markup=False)
            if not op.is_active:
                return op
            hinted = hinted or self._hint(op, began)
            time.sleep(POLL_SECONDS)
            op = load(operation_id)

    def _line(self, op: RestartOperation, step: RestartStep | None) -> tuple[Any, tuple[str, str]]:
        if step is None:
            return "op", (
                op.state,
                f"restart #{op.pk}: {op.get_state_display()}" + (f" ({op.worker})" if op.worker else ""),
            )
        old = step.old_replica.name if step.old_replica is not None else "?"
        new = f" -> {step.new_replica.name}" if step.new_replica is not None else ""
        where = f" on {step.node} {list(step.cards)}" if step.node else ""
        reason = step.reason.splitlines()[0] if step.reason else ""
        return step.pk, (
            step.state + reason,
            f"  {old}{new}{where}: {step.get_state_display()}" + (f" - {reason}" if reason else ""),
        )

    def _hint(self, op: RestartOperation, began: float) -> bool:
        if op.abandoned_text:
            self.stderr.write(f"restart #{op.pk}: {op.abandoned_text}")
            return True
        if op.state == RestartOperation.State.QUEUED and time.monotonic() - began > NO_WORKER_HINT_SECONDS:
            self.stderr.write(
                f"restart #{op.pk} is still queued: is a worker running? (python manage.py db_worker)"
            )
            return True
        return False
