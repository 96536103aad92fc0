"""The fleet's figures for Prometheus, read from the catalog at each scrape.

Nothing is counted in the process (a web server runs several, and restarts lose counts): every
figure is a query over the database, so any web process answers the same and the figures match
the catalog. Counters are the operations' and steps' rows, which are never deleted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Count, F, Q, QuerySet
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from catalog.models import Card, Node, Replica
from operations.models import ReleaseCheck, RestartOperation, RestartStep
from planning.measured import drift
from telemetry.models import CardReading, NodeReading

MIB = 2**20
# Seconds a restart step takes, from its start to its end: a replacement's load is minutes.
STEP_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


def _by_state(qs: QuerySet[Any]) -> dict[str, int]:
    """How many rows of ``qs`` are in each state: one query."""
    return dict(qs.values_list("state").annotate(n=Count("id")).values_list("state", "n"))


class FleetCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from self._cards()
        yield from self._replicas()
        yield from self._nodes()
        yield from self._card_telemetry()
        yield from self._restarts()
        yield from self._memory_drift()
        yield from self._releases()

    def _memory_drift(self) -> Iterator[Metric]:
        """Per engine and release, how far the planned need is from what the engines said they
        took (planned / measured - 1, averaged over the replicas that reported)."""
        labels = ["engine", "release"]
        ratio = GaugeMetricFamily(
            "llmgw_memory_drift_ratio",
            "Planned over measured memory need a card, less 1, averaged over the replicas that reported it.",
            labels=labels,
        )
        count = GaugeMetricFamily(
            "llmgw_memory_drift_replicas", "Replicas the memory drift is averaged over.", labels=labels
        )
        rows = (
            Replica.objects.exclude(measured_memory={})
            .exclude(planned_memory={})
            .values_list("profile__engine", "planned_memory", "measured_memory")
        )
        found = drift(
            ((engine, str(planned.get("release") or "default")), planned, measured)
            for engine, planned, measured in rows
        )
        for (engine, release), (mean, n) in found.items():
            ratio.add_metric([engine, release], mean)
            count.add_metric([engine, release], n)
        yield ratio
        yield count

    def _releases(self) -> Iterator[Metric]:
        """The release watch's last answer (operations/services/release_watch.py): per engine the
        index answered for, 1 when its newest release is newer than the fleet's default."""
        check = ReleaseCheck.objects.order_by("-checked_at", "-pk").first()
        if check is None:
            return
        newer = GaugeMetricFamily(
            "llmgw_engine_release_newer",
            "1 when the package index's newest release of the engine is newer than the fleet's default.",
            labels=["engine", "newest", "default"],
        )
        for entry in check.results:
            if entry.get("newest"):
                newer.add_metric(
                    [entry["engine"], entry["newest"], entry.get("default", "")],
                    1 if entry.get("newer") else 0,
                )
        yield newer
        yield GaugeMetricFamily(
            "llmgw_engine_release_check_timestamp_seconds",
            "When the release watch last asked the package index.",
            value=check.checked_at.timestamp(),
        )

    def _cards(self) -> Iterator[Metric]:
        cards = GaugeMetricFamily(
            "llmgw_cards",
            "Cards in the catalog, by GPU class, whether a replica holds them, and their node's state.",
            labels=["gpu_class", "state", "node_state"],
        )
        rows = (
            Card.objects.values("gpu_class__name", "node__state")
            .annotate(free=Count("id", filter=Q(shard__isnull=True)), all=Count("id"))
            .order_by("gpu_class__name", "node__state")
        )
        for row in rows:
            cls, node_state = row["gpu_class__name"], row["node__state"]
            cards.add_metric([cls, "free", node_state], row["free"])
            cards.add_metric([cls, "held", node_state], row["all"] - row["free"])
        yield cards

    def _replicas(self) -> Iterator[Metric]:
        replicas = GaugeMetricFamily("llmgw_replicas", "Replicas in the catalog, by state.", labels=["state"])
        counts = _by_state(Replica.objects.all())
        for state in Replica.State.values:
            replicas.add_metric([state], counts.get(state, 0))
        yield replicas

    def _nodes(self) -> Iterator[Metric]:
        reachable = GaugeMetricFamily(
            "llmgw_node_reachable",
            "1 when the node's agent answered the reconciler the last time it was asked; 0 otherwise.",
            labels=["node", "state"],
        )
        seen = GaugeMetricFamily(
            "llmgw_node_last_seen_timestamp_seconds",
            "When the node's agent last answered (the reconciler or a telemetry request; Unix time).",
            labels=["node"],
        )
        telemetry = {r.node_id: r.seen_at for r in NodeReading.objects.exclude(seen_at=None)}
        for node in (
            Node.objects.select_related("agent_contact")
            .order_by("name")
            .only("id", "name", "state", "reachable", "agent_contact__last_seen_at")
        ):
            reachable.add_metric([node.name, node.state], 1 if node.reachable else 0)
            times = [t for t in (node.last_seen_at, telemetry.get(node.pk)) if t is not None]
            if times:
                seen.add_metric([node.name], max(times).timestamp())
        yield reachable
        yield seen

    def _card_telemetry(self) -> Iterator[Metric]:
        labels = ["node", "card", "gpu_class"]
        used = GaugeMetricFamily(
            "llmgw_card_memory_used_bytes", "Card memory in use, as its agent last read it.", labels=labels
        )
        total = GaugeMetricFamily(
            "llmgw_card_memory_total_bytes", "Card memory in all, as its agent last read it.", labels=labels
        )
        foreign = GaugeMetricFamily(
            "llmgw_card_foreign_memory_bytes",
            "Card memory held by processes the catalog does not know.",
            labels=labels,
        )
        util = GaugeMetricFamily(
            "llmgw_card_utilization_ratio", "The card's utilisation, 0 to 1.", labels=labels
        )
        temp = GaugeMetricFamily("llmgw_card_temperature_celsius", "The card's temperature.", labels=labels)
        rows = CardReading.objects.values_list(
            "card__node__name",
            "card__index",
            "card__gpu_class__name",
            "memory_used_mib",
            "memory_total_mib",
            "foreign_mib",
            "utilization_percent",
            "temperature_c",
        ).order_by("card__node__name", "card__index")
        for node, index, cls, used_mib, total_mib, foreign_mib, percent, celsius in rows:
            key = [node, str(index), cls]
            if used_mib is not None:
                used.add_metric(key, used_mib * MIB)
            if total_mib is not None:
                total.add_metric(key, total_mib * MIB)
            foreign.add_metric(key, foreign_mib * MIB)
            if percent is not None:
                util.add_metric(key, percent / 100)
            if celsius is not None:
                temp.add_metric(key, celsius)
        yield from (used, total, foreign, util, temp)

    def _restarts(self) -> Iterator[Metric]:
        restarts = CounterMetricFamily(
            "llmgw_restarts", "Restart operations that ended, by outcome.", labels=["outcome"]
        )
        by_state = _by_state(RestartOperation.objects.all())
        for state in RestartOperation.State.values:
            if state not in RestartOperation.ACTIVE_STATES:
                restarts.add_metric([state], by_state.get(state, 0))
        yield restarts
        active = GaugeMetricFamily(
            "llmgw_restarts_active", "Restart operations queued or running.", labels=["state"]
        )

        for state in RestartOperation.ACTIVE_STATES:
            active.add_metric([state], by_state.get(state, 0))
        yield active
        yield self._step_durations()

    def _step_durations(self) -> Metric:
        steps = RestartStep.objects.filter(
            started_at__isnull=False, finished_at__isnull=False, state__in=RestartStep.FINISHED_STATES
        ).annotate(took=F("finished_at") - F("started_at"))
        durations = HistogramMetricFamily(
            "llmgw_restart_step_duration_seconds",
            "How long finished restart steps took, from start to end, by outcome.",
            labels=["outcome"],
        )
        by_outcome: dict[str, list[float]] = {}
        for state, took in steps.values_list("state", "took"):
            by_outcome.setdefault(state, []).append(took.total_seconds())
        for state in RestartStep.FINISHED_STATES:
            seconds = by_outcome.get(state, [])
            buckets = [(f"{edge:g}", sum(s <= edge for s in seconds)) for edge in STEP_BUCKETS]
            buckets.append(("+Inf", len(seconds)))
            durations.add_metric([state], buckets, sum(seconds))
        return durations
