from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from base.commands import ActorCommand
from operations.services.upgrade import Upgrade, upgrade_apply, upgrade_what_if


def say(plan: Upgrade) -> list[str]:
    """The dry run (or what was applied), line by line."""
    what = f"{plan.engine}'s default" if plan.scope == "default" else "the profile"
    lines = [
        f"{what}: {plan.before or 'no release'} → {plan.release}; {len(plan.profiles)} profile(s) touched"
    ]
    for p in plan.profiles:
        tokens = (
            f"KV tokens a card {p.kv_tokens_before} → {p.kv_tokens_after}"
            if p.kv_tokens_after is not None
            else "memory not known"
        )
        status = f"would not run: {p.refusal}" if p.stops_fitting else "fits"
        lines.append(f"  {p.model}/{p.profile} ({p.live_replicas} live): {tokens}; {status}")
        for n in p.nodes_lacking:
            lines.append(f"    {n['node']}: {n['reason']}")
        if p.nodes_unknown:
            lines.append(f"    not known (their agents never reported): {', '.join(p.nodes_unknown)}")
    if plan.note:
        lines.append(plan.note)
    return lines


class Command(ActorCommand):
    help = (
        "Upgrade an engine: the fleet's default release of ENGINE (or, with --profile, one profile's release) to "
        "RELEASE. --dry-run re-plans every profile it touches under the new release (KV tokens before and after, "
        "the profiles that would no longer fit, the nodes that lack the release) and changes nothing; it exits 1 "
        "when a profile would no longer fit. Without it the change is made, audited, and the touched profiles' "
        "replicas restart."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("engine")
        parser.add_argument("release")
        parser.add_argument(
            "--profile", default=None, metavar="MODEL/PROFILE", help="only this profile's release"
        )
        parser.add_argument("--dry-run", action="store_true", help="say what it would do; change nothing")

    def act(self, *args: Any, **options: Any) -> None:
        kw = {"engine_name": options["engine"], "release": options["release"], "profile": options["profile"]}
        plan = upgrade_what_if(**kw) if options["dry_run"] else upgrade_apply(**kw)
        for line in say(plan):
            self.stdout.write(line)
        if plan.applied:
            ops = ", ".join(f"#{n}" for n in plan.operations) or "none (no live replicas)"
            self.stdout.write(f"Applied. Restarts: {ops}.")
        elif any(p.stops_fitting for p in plan.profiles):
            raise CommandError("Some profiles would no longer run on this release (above).", returncode=1)
