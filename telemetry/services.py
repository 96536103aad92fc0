"""Sampling the agents' card telemetry and keeping it: the latest reading per card, a bounded
history, each node's last answer. A process holding memory on a card is *foreign* unless the
catalog has a live replica of that name on that card.

**Written in bulk.** A round asks the agents ``sampling_parallel(n)`` at a time (threads that
only talk HTTP, no database) and writes their answers as they come, up to
LLMGW_TELEMETRY_BATCH nodes at a time, through ``readings_write``: one transaction and the same
handful of statements whatever the batch's size (the batch's cards, the live replicas on them,
one upsert of the latest readings, one insert of samples, one upsert each of the nodes that
answered and those that did not). The history is pruned once a round (``readings_prune``: one
``DELETE``, by age and by count).

**Versions.** Readings are written only by ``readings_write`` and ``readings_prune``, each one
transaction; the database raises the ``telemetry`` area's counter once at each one's commit
(versions/triggers.py): about ``n / LLMGW_TELEMETRY_BATCH + 1`` raises a round, not one a node.
That counter is the readings' own (the telemetry app's tables hold nothing else), so only kept
answers that read readings are invalidated by it. Were readings given a counter of another name,
these two functions are where it is raised.

**Adaptive.** ``sampling_parallel(n) = clamp(ceil(n / LLMGW_TELEMETRY_NODES_PER_THREAD), 4,
LLMGW_TELEMETRY_MAX_PARALLEL)`` agents are asked at once; the next round is due
``next_interval(took) = max(LLMGW_TELEMETRY_SECONDS, 3 × took)`` after a round that took
``took`` seconds, so a round never takes more than a third of its interval however big the
fleet or busy the machine.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agentclient.client import AgentCallFailed, AgentClient
from base.errors import DomainError
from catalog.models import Card, Node, Shard, live_replicas_q
from catalog.services.cards import card_cordon
from telemetry.models import CardReading, CardSample, NodeReading

log = logging.getLogger("telemetry")

# A node's outcome in a round: its agent's answer (a dict), or why it gave none (a str).
Outcome = dict[str, Any] | str
_READING_FIELDS = [
    "at",
    "memory_used_mib",
    "memory_total_mib",
    "utilization_percent",
    "temperature_c",
    "processes",
    "foreign_mib",
]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _readings_of(
    body: dict[str, Any],
    cards: dict[int, tuple[int, bool]],
    known: dict[int, set[str]],
    now: datetime,
    failing: dict[int, int],
) -> list[CardReading]:
    """The cards' readings in one agent's answer; ``cards``: the node's card ids (and whether each
    is cordoned) by index, ``known``: the live replicas' names by card id. ``failing`` gains the
    index of each card not yet cordoned whose agent reports uncorrected ECC errors, with their
    count."""
    readings = []
    for raw in body.get("cards") or []:
        at = raw.get("index") if isinstance(raw, dict) else None
        found = cards.get(at) if isinstance(at, int) else None
        if found is None:
            continue  # a card the catalog does not list: nothing to attach it to
        card_id, cordoned = found
        ecc = _int(raw.get("ecc_uncorrected"))
        if ecc and not cordoned and isinstance(at, int):
            failing[at] = ecc
        processes = []
        for p in raw.get("processes") or []:
            if not isinstance(p, dict):
                continue
            replica = p.get("replica") if isinstance(p.get("replica"), str) else None
            processes.append(
                {
                    "pid": _int(p.get("pid")),
                    "used_mib": _int(p.get("used_mib")),
                    "name": str(p.get("name") or "")[:120],
                    "replica": replica,
                    "foreign": replica is None or replica not in known.get(card_id, set()),
                }
            )
        readings.append(
            CardReading(
                card_id=card_id,
                at=now,
                memory_used_mib=_int(raw.get("memory_used_mib")),
                memory_total_mib=_int(raw.get("memory_total_mib")),
                utilization_percent=_int(raw.get("utilization_percent")),
                temperature_c=raw.get("temperature_c") if isinstance(raw.get("temperature_c"), int) else None,
                processes=processes,
                foreign_mib=sum(p["used_mib"] or 0 for p in processes if p["foreign"]),
            )
        )
    return readings


def readings_write(
    outcomes: Sequence[tuple[Node, Outcome]], *, at: datetime | None = None
) -> list[CardReading]:
    """Keep a batch of nodes' outcomes in one transaction, in at most seven statements whatever
    the batch's size: the cards' latest readings (replaced) and a sample each, and each node's
    last answer, or for a node that gave none, when it was asked and why not (its last answer
    kept). ``at``: the round's time, which all its readings take (else now). The one place
    readings are written (the module's docstring: versions)."""
    if not outcomes:
        return []
    now = at or timezone.now()
    answered = [(node, body) for node, body in outcomes if isinstance(body, dict)]
    ids = [node.pk for node, _ in answered]
    cards: dict[int, dict[int, tuple[int, bool]]] = {}
    known: dict[int, set[str]] = {}
    if ids:
        for card_id, node_id, index, cordoned in Card.objects.filter(node_id__in=ids).values_list(
            "id", "node_id", "index", "cordoned"
        ):
            cards.setdefault(node_id, {})[index] = (card_id, cordoned)
        for card_id, name in Shard.objects.filter(
            live_replicas_q("replica__"), card__node_id__in=ids
        ).values_list("card_id", "replica__name"):
            known.setdefault(card_id, set()).add(name)
    failing: dict[int, dict[int, int]] = {}  # node id: {card index: uncorrected ECC errors}
    readings = [
        r
        for node, body in answered
        for r in _readings_of(body, cards.get(node.pk, {}), known, now, failing.setdefault(node.pk, {}))
    ]
    with transaction.atomic():
        if readings:
            _keep_readings(readings, now)
        if answered:
            NodeReading.objects.bulk_create(
                [
                    NodeReading(
                        node=node,
                        seen_at=now,
                        asked_at=now,
                        error="",
                        source=str(body.get("source", ""))[:32],
                    )
                    for node, body in answered
                ],
                update_conflicts=True,
                unique_fields=["node"],
                update_fields=["seen_at", "asked_at", "error", "source"],
            )
        silent = [
            NodeReading(node=node, asked_at=now, error=why[:1000])
            for node, why in outcomes
            if isinstance(why, str)
        ]
        if silent:
            NodeReading.objects.bulk_create(
                silent, update_conflicts=True, unique_fields=["node"], update_fields=["asked_at", "error"]
            )
    # Cordons after the readings' commit, each its own audited write (rare: a card's first report).
    for node, _ in answered:
        for index, errors in sorted(failing.get(node.pk, {}).items()):
            _cordon_failing(node, index, errors)
    return readings


def _keep_readings(readings: list[CardReading], now: datetime) -> None:
    """The cards' latest readings replaced, and a sample of each added. On PostgreSQL two
    statements over the batch's columns as arrays (``unnest``): Django's ``bulk_create`` prepared
    every value of every row in Python, most of the write's CPU (a round's 16,000 rows, on the
    cores the sampling threads share); elsewhere (SQLite) ``bulk_create``."""
    if connection.vendor != "postgresql":
        CardReading.objects.bulk_create(
            readings, update_conflicts=True, unique_fields=["card"], update_fields=_READING_FIELDS
        )
        CardSample.objects.bulk_create(
            CardSample(
                card_id=r.card_id,
                at=now,
                memory_used_mib=r.memory_used_mib,
                utilization_percent=r.utilization_percent,
                temperature_c=r.temperature_c,
                foreign_mib=r.foreign_mib,
            )
            for r in readings
        )
        return
    cards = [r.card_id for r in readings]
    used = [r.memory_used_mib for r in readings]
    utilization = [r.utilization_percent for r in readings]
    temperature = [r.temperature_c for r in readings]
    foreign = [r.foreign_mib for r in readings]
    latest, history = CardReading._meta.db_table, CardSample._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {latest} (card_id, at, memory_used_mib, memory_total_mib, utilization_percent,
                                  temperature_c, processes, foreign_mib)
            SELECT card, %s, used, total, utilization, temperature, processes::jsonb, foreign_mib
            FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::int[], %s::int[], %s::text[],
                        %s::bigint[]) AS r(card, used, total, utilization, temperature, processes, foreign_mib)
            ON CONFLICT (card_id) DO UPDATE SET at = EXCLUDED.at,
                memory_used_mib = EXCLUDED.memory_used_mib, memory_total_mib = EXCLUDED.memory_total_mib,
                utilization_percent = EXCLUDED.utilization_percent, temperature_c = EXCLUDED.temperature_c,
                processes = EXCLUDED.processes, foreign_mib = EXCLUDED.foreign_mib
            """,  # noqa: S608 (our table's name)
            [
                now,
                cards,
                used,
                [r.memory_total_mib for r in readings],
                utilization,
                temperature,
                [json.dumps(r.processes) for r in readings],
                foreign,
            ],
        )
        cursor.execute(
            f"""
            INSERT INTO {history} (card_id, at, memory_used_mib, utilization_percent, temperature_c,
                                   foreign_mib)
            SELECT card, %s, used, utilization, temperature, foreign_mib
            FROM unnest(%s::bigint[], %s::bigint[], %s::int[], %s::int[], %s::bigint[])
                AS r(card, used, utilization, temperature, foreign_mib)
            """,  # noqa: S608 (our table's name)
            [now, cards, used, utilization, temperature, foreign],
        )


def telemetry_record(*, node: Node, body: dict[str, Any]) -> list[CardReading]:
    """Keep what ``node``'s agent answered (``readings_write`` for a batch of one)."""
    return readings_write([(node, body)])


def readings_prune(now: datetime | None = None) -> int:
    """Drop the samples older than LLMGW_TELEMETRY_HISTORY_SECONDS, and those older than the
    newest LLMGW_TELEMETRY_HISTORY_SAMPLES sampling times (a sampler run faster than the history
    assumes): one ``DELETE`` for the whole fleet, after finding that time. A round gives all its samples its own time, so
    no card keeps more than that many. How many were dropped."""
    now = now or timezone.now()
    cut = now - timedelta(seconds=settings.LLMGW_TELEMETRY_HISTORY_SECONDS)
    table = CardSample._meta.db_table
    # The sampling times newest first, one probe of the ``at`` index each (a loose index scan, not
    # a read of every sample): the time LLMGW_TELEMETRY_HISTORY_SAMPLES + 1 back, if there is one.
    keep = settings.LLMGW_TELEMETRY_HISTORY_SAMPLES
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE times(at, n) AS (
                SELECT max(at), 1 FROM {table}
                UNION ALL
                SELECT (SELECT max(at) FROM {table} WHERE at < times.at), n + 1
                FROM times WHERE times.at IS NOT NULL AND n <= %s
            )
            SELECT at FROM times WHERE n = %s + 1
            """,  # noqa: S608 (our table's name)
            [keep, keep],
        )
        found = cursor.fetchone()
        cursor.execute(
            f"DELETE FROM {table} WHERE at < %s OR at <= %s",  # noqa: S608
            [cut, found[0] if found else None],
        )
        return cursor.rowcount


def sampling_parallel(nodes: int) -> int:
    """How many agents a round asks at once: one thread per LLMGW_TELEMETRY_NODES_PER_THREAD nodes,
    at least 4, at most LLMGW_TELEMETRY_MAX_PARALLEL."""
    per = settings.LLMGW_TELEMETRY_NODES_PER_THREAD
    return max(1, min(settings.LLMGW_TELEMETRY_MAX_PARALLEL, max(4, math.ceil(nodes / per))))


def next_interval(took: float) -> float:
    """When the next round is due after one that took ``took`` seconds: LLMGW_TELEMETRY_SECONDS,
    or three times the round where that is longer (a round stays under a third of its interval)."""
    return max(settings.LLMGW_TELEMETRY_SECONDS, 3.0 * took)


def _ask(node: Node) -> Outcome:
    """``node``'s agent's telemetry, or why it gave none (no database here: a sampling thread)."""
    try:
        body = AgentClient.for_node(node).telemetry()
    except AgentCallFailed as exc:
        return exc.message
    return body if isinstance(body, dict) else {}


def _cordon_failing(node: Node, index: int, errors: int) -> None:
    """A card whose agent reports uncorrected ECC errors takes no new replica: cordoned (audited, as
    whoever samples: the worker or the command), what runs on it left running."""
    try:
        card_cordon(
            node_name=node.name,
            index=index,
            reason=f"{errors} uncorrected ECC error{'s' if errors != 1 else ''} since its driver loaded "
            "(nvidia-smi), seen by the telemetry",
        )
    except DomainError as err:  # cordoned meanwhile by another sampler or an operator
        log.info("card %s of %s not cordoned by the telemetry: %s", index, node.name, err.message)
    else:
        log.warning("card %s of %s cordoned: %s uncorrected ECC errors", index, node.name, errors)


def node_sample(node: Node) -> bool:
    """Ask ``node``'s agent for its telemetry and keep it; False (its error kept) when it did not answer."""
    outcome = _ask(node)
    readings_write([(node, outcome)])
    return isinstance(outcome, dict)


def fleet_sample(nodes: Iterable[Node] | None = None, *, parallel: int | None = None) -> dict[str, bool]:
    """One round: ask every node (or those given), ``parallel`` at a time (``sampling_parallel``
    by default), keep their answers in batches as they come, then prune the history. Whether
    each answered."""
    chosen = list(nodes if nodes is not None else Node.objects.order_by("name"))
    parallel = sampling_parallel(len(chosen)) if parallel is None else parallel
    size = settings.LLMGW_TELEMETRY_BATCH
    began = timezone.now()  # every reading of the round is of its time (``readings_prune`` counts rounds)
    answered: dict[str, bool] = {}
    pending: list[tuple[Node, Outcome]] = []

    def keep(node: Node, outcome: Outcome) -> None:
        answered[node.name] = isinstance(outcome, dict)
        pending.append((node, outcome))
        if len(pending) >= size:
            readings_write(pending, at=began)
            pending.clear()

    if parallel <= 1:
        for node in chosen:
            keep(node, _ask(node))
    else:
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="telemetry") as pool:
            futures = {pool.submit(_ask, node): node for node in chosen}
            for done in as_completed(futures):
                keep(futures[done], done.result())
    readings_write(pending, at=began)
    readings_prune()
    return {n.name: answered[n.name] for n in chosen}
