"""The operators' words for what the audit log stores as codes: each action, each kind of object and
each path ("via") a change came through. The pages, the filters' choices and the CSV say these; the
API and JSON Lines keep the stored codes (docs/design.md, "Glossary")."""

from __future__ import annotations

from base.actor import Via

ACTIONS = {
    "create": "added",
    "import": "imported",
    "update": "changed",
    "delete": "removed",
    "resize": "resized",
    "set_context": "context changed",
    "rollback": "rolled back",
    "adopt": "took a revision without a restart",
    "cordon": "cordoned",
    "uncordon": "uncordoned",
    "drain": "drained",
    "move_port": "port moved",
    "rotate_token": "agent token rotated",
    "restart_start": "restart asked",
    "restart_finish": "restart ended",
    "restart_cancel": "restart cancelled",
    "restart_takeover": "restart taken over",
    "start": "started",
    "starting": "starting",
    "loading": "loading",
    "ready": "ready",
    "stop": "stopped",
    "stop_unconfirmed": "stop not confirmed",
    "fail": "failed",
    "reconcile": "set right by the reconciler",
    "orphans": "engines the catalog does not know",
    "reachable": "agent answering again",
    "unreachable": "agent not answering",
    "version": "agent version",
}

OBJECT_TYPES = {
    "gpuclass": "GPU class",
    "node": "node",
    "card": "card",
    "model": "model",
    "profile": "profile",
    "replica": "replica",
    "shard": "replica's card",
    "restart": "restart",
    "token": "API token",
    "user": "user",
    "group": "role",
}


def action_label(code: str) -> str:
    return ACTIONS.get(code, code.replace("_", " "))


def object_type_label(code: str) -> str:
    return OBJECT_TYPES.get(code, code.replace("_", " "))


def via_label(code: str) -> str:
    """The one word for the path a change came through: pages, API, admin, command, worker."""
    try:
        return str(Via(code).label)
    except ValueError:
        return code


def choices(labels: dict[str, str]) -> list[tuple[str, str]]:
    """A filter's choices: any, then each code by its label in alphabetical order."""
    return [("", "any"), *sorted(labels.items(), key=lambda item: item[1])]
