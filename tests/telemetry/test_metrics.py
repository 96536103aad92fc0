"""/metrics scraped over HTTP as Prometheus would, its figures against the catalog's."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.core.management import call_command
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from base.actor import Actor, acting_as
from catalog.models import Card, Node, Replica
from catalog.selectors import fleet_summary
from operations.models import RestartOperation, RestartStep
from telemetry.services import telemetry_record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("audit_flushable")]

TOKEN = "metrics-token-for-tests-only-0123456789"


def scrape(url: str, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{url}/metrics", headers=headers, timeout=10, trust_env=False)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_figures_match_the_catalog(live_server, settings):
    settings.LLMGW_METRICS_TOKEN = TOKEN
    call_command("seed_demo")
    with acting_as(Actor(via="cli", name="pytest")):
        Node.objects.filter(name="gpu-l1").update(state="cordoned")
        Node.objects.filter(name="gpu-a1").update(reachable=False, unreachable_reason="connection refused")
        h1 = Node.objects.get(name="gpu-h1")
        telemetry_record(
            node=h1,
            body={
                "source": "nvidia-smi",
                "cards": [
                    {
                        "index": 0,
                        "memory_used_mib": 73403,
                        "memory_total_mib": 81559,
                        "utilization_percent": 74,
                        "temperature_c": 69,
                        "processes": [{"pid": 7, "used_mib": 4096, "replica": None}],
                    },
                ],
            },
        )
        replica = Replica.objects.order_by("name").first()
        op = RestartOperation.objects.create(
            model=replica.profile.model,
            profile=replica.profile,
            state="succeeded",
            requested_by_name="t",
            via="cli",
        )
        now = timezone.now()
        RestartStep.objects.create(
            operation=op,
            old_replica=replica,
            state="succeeded",
            started_at=now - timedelta(seconds=42),
            finished_at=now,
        )
        RestartStep.objects.create(
            operation=op,
            old_replica=replica,
            state="failed",
            started_at=now - timedelta(seconds=700),
            finished_at=now,
        )

    assert scrape(live_server.url, None).status_code == 401
    assert scrape(live_server.url, "wrong-" + TOKEN).status_code == 401
    response = scrape(live_server.url)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    got = samples(response.text)

    # Cards by class and state, against the nodes page's own summary.
    summary = {c["name"]: c for c in fleet_summary()["classes"]}
    for cls, c in summary.items():
        held = sum(
            v
            for (name, labels), v in got.items()
            if name == "llmgw_cards" and ("gpu_class", cls) in labels and ("state", "held") in labels
        )
        free = sum(
            v
            for (name, labels), v in got.items()
            if name == "llmgw_cards" and ("gpu_class", cls) in labels and ("state", "free") in labels
        )
        assert (held + free, free) == (c["cards"], c["free"]), cls
    l40s = Card.objects.filter(node__name="gpu-l1").count()
    cordoned = sum(
        v
        for (name, labels), v in got.items()
        if name == "llmgw_cards" and ("node_state", "cordoned") in labels
    )
    assert cordoned == l40s
    for state in Replica.State.values:
        assert got[("llmgw_replicas", (("state", state),))] == Replica.objects.filter(state=state).count()
    # Reachability as the reconciler last found it; gpu-h1's agent answered a telemetry request.
    for node in Node.objects.all():
        assert got[("llmgw_node_reachable", (("node", node.name), ("state", node.state)))] == int(
            node.reachable
        )
    assert got[("llmgw_node_reachable", (("node", "gpu-a1"), ("state", "ready")))] == 0
    assert ("llmgw_node_last_seen_timestamp_seconds", (("node", "gpu-h1"),)) in got
    card = (("card", "0"), ("gpu_class", "h100-80g"), ("node", "gpu-h1"))
    assert got[("llmgw_card_memory_used_bytes", card)] == 73403 * 2**20
    assert got[("llmgw_card_foreign_memory_bytes", card)] == 4096 * 2**20
    assert got[("llmgw_card_utilization_ratio", card)] == 0.74
    # Restarts by outcome, and how long their steps took.
    assert got[("llmgw_restarts_total", (("outcome", "succeeded"),))] == 1
    assert got[("llmgw_restarts_total", (("outcome", "failed"),))] == 0
    assert got[("llmgw_restart_step_duration_seconds_count", (("outcome", "succeeded"),))] == 1
    assert got[("llmgw_restart_step_duration_seconds_bucket", (("le", "60"), ("outcome", "succeeded")))] == 1
    assert got[("llmgw_restart_step_duration_seconds_bucket", (("le", "30"), ("outcome", "succeeded")))] == 0
    assert got[("llmgw_restart_step_duration_seconds_bucket", (("le", "600"), ("outcome", "failed")))] == 0
    assert 699 < got[("llmgw_restart_step_duration_seconds_sum", (("outcome", "failed"),))] < 701


def test_the_endpoint_is_off_until_a_token_is_set(live_server, settings):
    settings.LLMGW_METRICS_TOKEN = ""
    response = scrape(live_server.url)
    assert response.status_code == 404 and "set LLMGW_METRICS_TOKEN" in response.text


def test_the_grafana_dashboard_asks_only_for_figures_the_endpoint_serves():
    import json
    import re
    from pathlib import Path

    from web.metrics import FleetCollector

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs/grafana-dashboard.json").read_text())
    served = set()
    for family in FleetCollector().collect():
        served |= {s.name for s in family.samples} | {
            family.name,
            f"{family.name}_total",
            f"{family.name}_bucket",
        }
    asked = {
        name
        for p in dashboard["panels"]
        for t in p["targets"]
        for name in re.findall(r"\bllmgw_[a-z_]+", t["expr"])
    }
    assert asked and asked <= served, asked - served


def test_the_memory_drift_is_given_per_engine_and_release(live_server, settings):
    settings.LLMGW_METRICS_TOKEN = TOKEN
    call_command("seed_demo")
    gib = 2**30
    planned = {"weights": 15 * gib, "activation": 2 * gib, "non_torch": gib // 2}
    # need planned 17.5 GiB; measured 15 + 1 + 0.5 = 16.5 GiB, then 17.5: +6.06% and 0
    first = {"weights": 15 * gib, "activation": gib, "non_torch": gib // 2}
    second = {"weights": 15 * gib, "activation": 2 * gib, "non_torch": gib // 2}
    rows = [
        ("llama-3.1-8b-1", {**planned, "release": "0.19.0"}, first),
        ("llama-3.1-8b-2", {**planned, "release": "0.19.0"}, second),
        ("qwen3-30b-a3b-1", {**planned, "release": ""}, second),
    ]
    for name, plan, measured in rows:
        Replica.objects.filter(name=name).update(planned_memory=plan, measured_memory=measured)
    got = samples(scrape(live_server.url).text)
    key = (("engine", "vllm"), ("release", "0.19.0"))
    assert got[("llmgw_memory_drift_ratio", key)] == pytest.approx((17.5 / 16.5 - 1 + 0) / 2)
    assert got[("llmgw_memory_drift_replicas", key)] == 2
    default = (("engine", "sglang"), ("release", "default"))
    assert got[("llmgw_memory_drift_ratio", default)] == pytest.approx(0)
    assert got[("llmgw_memory_drift_replicas", default)] == 1
