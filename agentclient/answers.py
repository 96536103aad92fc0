"""An agent's answers as the agent API defines them (docs/agent-api.md), and nothing else.

An agent URL may reach something that is not an agent, and an agent may be another program than
ours: whatever came back is read into the fields the API defines, each of its type, every text
cleaned (control characters out, one line, bounded) and the node's token taken out; any other field
is dropped, and an answer without the fields every caller relies on is ``NotTheAPI``. Errors are
said in the project's words (``agentclient.client``): an agent's own sentence is kept only when its
answer has the API's error shape with one of its codes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from base.secrets import redact, redact_lines

STATES = ("starting", "loading", "ready", "failed", "stopped")
# The codes of docs/agent-api.md's "Errors" table: an agent's sentence with another is not shown.
ERROR_CODES = frozenset(
    {
        "invalid_spec",
        "invalid_json",
        "unknown_engine",
        "unknown_card",
        "refused_arg",
        "refused_env",
        "refused_source",
        "launch_mismatch",
        "refused_group",
        "invalid_token",
        "token_not_rotatable",
        "invalid_grace",
        "invalid_wait",
        "invalid_state",
        "invalid_lines",
        "unauthorized",
        "not_found",
        "method_not_allowed",
        "spec_conflict",
        "stopping",
        "card_busy",
        "port_busy",
        "length_required",
        "too_large",
        "internal",
        "shutting_down",
    }
)
LINE_LIMIT = 2000  # characters of one log line (the agent cuts its own there)
SENTENCE_LIMIT = 500  # characters of a reason or an error's detail
MAX_LINES = 500  # of a log tail (the agent's most)
MAX_ITEMS = 1024  # cards, processes, replicas, arguments

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class NotTheAPI(Exception):
    """The answer lacks a field the agent API defines (its name is the message)."""


def _clean(value: Any) -> str:
    """A string only; control and direction-changing characters replaced, line breaks made spaces."""
    if not isinstance(value, str):
        return ""
    return _CONTROL.sub(" ", value.replace("\r\n", " ").replace("\n", " ").replace("\t", " "))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def text(value: Any, limit: int = SENTENCE_LIMIT, *, secrets: Iterable[str] = ()) -> str:
    """``value`` as text shown to an operator: cleaned (``_clean``), ``secrets`` redacted (with
    their encoded and split copies, ``base.secrets.redact``), then cut at ``limit``."""
    return _cut(redact(_clean(value), secrets), limit)


def lines(values: Iterable[Any], *, secrets: Iterable[str] = ()) -> list[str]:
    """Log lines: each cleaned, redacted together (a secret split across two lines is caught),
    each cut at ``LINE_LIMIT``."""
    return [_cut(line, LINE_LIMIT) for line in redact_lines([_clean(v) for v in values], secrets)]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _items(value: Any) -> list[Any]:
    return list(value[:MAX_ITEMS]) if isinstance(value, list) else []


def _name(value: Any) -> str | None:
    """An id, engine or model name: the agent API's characters, or None."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}", value):
        return value
    return None


def _required(body: Any, *names: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise NotTheAPI("an object")
    for name in names:
        if name not in body:
            raise NotTheAPI(name)
    return body


def error(body: Any, *, secrets: Iterable[str] = ()) -> tuple[str, str]:
    """The API's error shape: its code (one of ``ERROR_CODES``) and its sentence, cleaned; ("", "")
    for anything else."""
    if not isinstance(body, dict):
        return "", ""
    code = body.get("code")
    if not isinstance(code, str) or code not in ERROR_CODES:
        return "", ""
    return code, text(body.get("detail"), secrets=secrets)


def replica_state(body: Any, *, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """``GET /v1/replicas/{id}``'s fields (and the extras the API names), each of its type."""
    raw = _required(body, "state")
    state = raw["state"] if raw["state"] in STATES else None
    if state is None:
        raise NotTheAPI("state")
    memory = raw.get("memory")
    return {
        "id": _name(raw.get("id")),  # the caller asked about one: it knows which
        "state": state,
        "engine": _name(raw.get("engine")),
        "model": _name(raw.get("model")),
        "cards": [c for c in _items(raw.get("cards")) if _int(c) is not None],
        "port": _int(raw.get("port")),
        "pid": _int(raw.get("pid")),
        "started_at": text(raw.get("started_at"), 40) or None,
        "ready_at": text(raw.get("ready_at"), 40) or None,
        "finished_at": text(raw.get("finished_at"), 40) or None,
        "exit_code": _int(raw.get("exit_code")),
        "log_tail": lines(_items(raw.get("log_tail"))[-MAX_LINES:], secrets=secrets),
        "reason": text(raw.get("reason"), secrets=secrets),
        "args": [text(a, LINE_LIMIT, secrets=secrets) for a in _items(raw.get("args"))],
        "adopted": raw.get("adopted") is True,
        "memory": _figures(memory) if isinstance(memory, dict) else {},
    }


def _figures(memory: dict[Any, Any]) -> dict[str, float | int]:
    """The engine's memory figures: names to finite numbers (at most 32 of them)."""
    out: dict[str, float | int] = {}
    for key, value in list(memory.items())[:32]:
        number = _number(value)
        if _name(key) is not None and number is not None:
            out[key] = number
    return out


def replica_list(body: Any, *, secrets: Iterable[str] = ()) -> list[dict[str, Any]]:
    """``GET /v1/replicas``: each state as ``replica_state`` reads it (one that is not, or that names
    no id, left out)."""
    if not isinstance(body, list):
        raise NotTheAPI("a list of replica states")
    out = []
    for item in body[:MAX_ITEMS]:
        try:
            state = replica_state(item, secrets=secrets)
        except NotTheAPI:
            continue
        if state["id"] is not None:
            out.append(state)
    return out


def log_tail(body: Any, *, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """``GET /v1/replicas/{id}/log``: the id, the state and the lines (each cleaned and cut)."""
    raw = _required(body, "lines")
    if not isinstance(raw["lines"], list):
        raise NotTheAPI("lines")
    return {
        "id": _name(raw.get("id")),
        "state": raw.get("state") if raw.get("state") in STATES else None,
        "lines": lines(
            [line for line in raw["lines"][-MAX_LINES:] if isinstance(line, str)], secrets=secrets
        ),
    }


def attempt_list(body: Any, *, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """``GET /v1/replicas/{id}/attempts``: the start attempts whose logs the agent keeps."""
    raw = _required(body, "attempts")
    attempts = [
        {
            "attempt": a["attempt"],
            "started_at": text(a.get("started_at"), 40) or None,
            "bytes": _int(a.get("bytes")),
            "current": a.get("current") is True,
            "cut": a.get("cut") is True,
        }
        for a in _items(raw["attempts"])
        if isinstance(a, dict) and _int(a.get("attempt")) is not None
    ]
    return {"id": _name(raw.get("id")), "attempts": attempts}


def node_info(body: Any, *, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """``GET /v1/node``: the node, its cards, the agent's version and the policy's digest."""
    raw = _required(body, "cards")
    cards = []
    for card in _items(raw["cards"]):
        if isinstance(card, dict) and _int(card.get("index")) is not None:
            cards.append(
                {
                    "index": card["index"],
                    "name": text(card.get("name"), 120),
                    "memory_mib": _int(card.get("memory_mib")),
                    "replica": _name(card.get("replica")),
                }
            )
    engines = raw.get("engines")
    return {
        "node": _name(raw.get("node")),
        "cards": cards,
        "agent_version": text(raw.get("agent_version"), 40),
        "cards_source": text(raw.get("cards_source"), 32),
        "policy": text(raw.get("policy"), 80, secrets=secrets),
        # The node's facts (an agent older than them says none: ``facts`` is False then).
        "facts": isinstance(engines, dict),
        "driver_version": text(raw.get("driver_version"), 32),
        "cuda_version": text(raw.get("cuda_version"), 16),
        "arch": text(raw.get("arch"), 32),
        "engines": {
            str(name): text(version, 64)
            for name, version in list(engines.items())[:MAX_ITEMS]
            if _name(name) is not None and isinstance(version, str) and version
        }
        if isinstance(engines, dict)
        else {},
        "facts_errors": lines(_items(raw.get("facts_errors")), secrets=secrets),
    }


def telemetry(body: Any, *, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """``GET /v1/telemetry``: each card's figures and the processes holding memory on it."""
    raw = _required(body, "cards")
    cards = []
    for card in _items(raw["cards"]):
        if not isinstance(card, dict) or _int(card.get("index")) is None:
            continue
        processes = [
            {
                "pid": _int(p.get("pid")),
                "used_mib": _int(p.get("used_mib")),
                "name": text(p.get("name"), 120, secrets=secrets),
                "replica": _name(p.get("replica")),
            }
            for p in _items(card.get("processes"))
            if isinstance(p, dict)
        ]
        cards.append(
            {
                "index": card["index"],
                **{
                    key: _int(card.get(key))
                    for key in (
                        "memory_used_mib",
                        "memory_total_mib",
                        "utilization_percent",
                        "temperature_c",
                        "ecc_uncorrected",
                    )
                },
                "processes": processes,
            }
        )
    return {
        "node": _name(raw.get("node")),
        "at": _number(raw.get("at")),
        "source": text(raw.get("source"), 32),
        "cards": cards,
    }


def rotated(body: Any, *, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """``POST /v1/token``: whether it rotated, and the grace the old token keeps."""
    raw = _required(body, "rotated")
    return {"rotated": raw["rotated"] is True, "grace_seconds": _number(raw.get("grace_seconds"))}
