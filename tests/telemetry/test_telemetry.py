"""Card telemetry from real agents reading the stand-in nvidia-smi: kept per card with a short
history, drawn on the nodes grid beside the plan, and a card a foreign process holds is marked and
never chosen for a replacement."""

from __future__ import annotations

from datetime import timedelta

import pytest
from agent_fakes import foreign_process
from django.test import Client
from django.utils import timezone

from base.actor import Actor, acting_as
from catalog.models import Card, Node
from operations.services.runner import run_operation
from operations.services.start import restart_start
from telemetry.models import CardReading, CardSample, NodeReading
from telemetry.services import fleet_sample, readings_prune, readings_write, telemetry_record
from tests.support import builders as b
from tests.support.restart import MODEL, fleet_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts", "audit_flushable"),
]

H100 = 81559


def reading(node: str, index: int) -> CardReading:
    return CardReading.objects.get(card__node__name=node, card__index=index)


def test_a_foreign_process_is_shown_as_such_and_its_card_is_not_chosen_for_a_replacement(tmp_path):
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=3, gpus=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        with foreign_process(fleet.gpu_dirs["gpu-a"], [1], used_mib=30000) as pid:
            assert fleet_sample() == {"gpu-a": True}
            own, held, free = reading("gpu-a", 0), reading("gpu-a", 1), reading("gpu-a", 2)
            assert (own.memory_used_mib, own.memory_total_mib) == (round(0.9 * H100), H100)
            assert [(p["replica"], p["foreign"]) for p in own.processes] == [("llama-1", False)]
            assert own.foreign_mib == 0
            assert held.foreign_mib == 30000
            assert [(p["pid"], p["replica"], p["foreign"]) for p in held.processes] == [(pid, None, True)]
            assert (free.memory_used_mib, free.processes) == (0, [])
            assert NodeReading.objects.get(node__name="gpu-a").source == "nvidia-smi"

            viewer = b.user("viewer")
            client = Client()
            client.force_login(viewer)
            page = client.get("/nodes/").content.decode()
            # Card 1: free in the catalog, held by the foreign process: said so, with its name and PID,
            # and not counted free (3 cards, llama-1 on one, the foreign process on another).
            assert page.count('class="card foreign-held foreign"') == 1
            assert f"held by python3 foreign.py (PID {pid})" in page
            assert "1 free, 1 held by foreign processes" in page
            assert "foreign process: 29.3 GiB" in page
            assert "used 71.7 of 79.6 GiB · planned " in page  # card 0: the agent's figure, the plan's
            assert "agent seen " in page

            # Card 1 is the first free card; best fit would take it. The replacement goes to card 2.
            fleet.change_profile(args=["--max-num-seqs", "64"])
            with acting_as(Actor(via="cli", name="pytest")):
                op = restart_start(model_name=MODEL, ready_timeout=30)
            step = op.steps.get()
            assert (step.planned_node, step.planned_cards) == ("gpu-a", [2])
            assert run_operation(op.pk) == "succeeded"
            new = op.steps.get().new_replica
            assert list(new.shards.values_list("card__index", flat=True)) == [2]


def test_the_history_keeps_what_is_recent_and_a_silent_agent_is_said(tmp_path, settings):
    node = b.node("gpu-1", cards=2, agent_url="http://127.0.0.1:9")  # nothing listens on port 9
    body = {
        "source": "nvidia-smi",
        "cards": [
            {"index": 0, "memory_used_mib": 1000, "memory_total_mib": H100, "processes": []},
            {
                "index": 7,
                "memory_used_mib": 5,
                "memory_total_mib": H100,
                "processes": [],
            },  # not in the catalog
        ],
    }
    telemetry_record(node=node, body=body)
    CardSample.objects.update(
        at=timezone.now() - timedelta(seconds=settings.LLMGW_TELEMETRY_HISTORY_SECONDS + 5)
    )
    telemetry_record(node=node, body=body)
    assert CardSample.objects.count() == 2
    assert readings_prune() == 1  # the round's prune: the old sample goes, the new stays
    assert CardSample.objects.count() == 1 and CardReading.objects.count() == 1
    assert reading("gpu-1", 0).memory_used_mib == 1000
    assert fleet_sample(Node.objects.filter(pk=node.pk)) == {"gpu-1": False}
    silent = NodeReading.objects.get(node=node)
    assert "gpu-1" in silent.error and silent.seen_at is not None  # the last answer is still known
    assert Card.objects.count() == 2


def test_a_worker_starting_schedules_one_sampling_chain_and_each_sample_the_next(settings):
    from django_tasks import TaskResultStatus
    from django_tasks_db.models import DBTaskResult

    from telemetry.tasks import ensure_sampler, sample_telemetry

    DBTaskResult.objects.all().delete()
    settings.LLMGW_TELEMETRY_SECONDS = 9
    ensure_sampler(due_in=0)
    ensure_sampler(due_in=0)  # a second worker starting: still one chain
    waiting = DBTaskResult.objects.filter(
        task_path=sample_telemetry.module_path, status=TaskResultStatus.READY
    )
    assert waiting.count() == 1
    waiting.update(status=TaskResultStatus.SUCCESSFUL)
    b.node("gpu-1", cards=1, agent_url="http://127.0.0.1:9")
    assert sample_telemetry.call() == {"gpu-1": False}
    (following,) = waiting.all()
    assert timedelta(seconds=8) < following.run_after - timezone.now() <= timedelta(seconds=9)
    following.delete()
    settings.LLMGW_TELEMETRY_SECONDS = 0  # off: the worker does not sample
    ensure_sampler(due_in=0)
    assert not waiting.exists()


def _bodies(nodes: list[Node]) -> list[tuple[Node, dict | str]]:
    """Each node's agent answer with a reading per card (one process foreign), the last node silent."""
    out: list[tuple[Node, dict | str]] = [
        (
            n,
            {
                "source": "nvidia-smi",
                "cards": [
                    {
                        "index": i,
                        "memory_used_mib": 100 * i,
                        "memory_total_mib": H100,
                        "utilization_percent": 5,
                        "temperature_c": 40,
                        "processes": [{"pid": 7, "used_mib": 100, "name": "python", "replica": None}],
                    }
                    for i in range(2)
                ],
            },
        )
        for n in nodes[:-1]
    ]
    return [*out, (nodes[-1], "the agent did not answer")]


def _statements(seen) -> list[str]:
    """What was asked of the database, without the transaction's own (BEGIN, COMMIT, savepoints)."""
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT")
    return [q["sql"] for q in seen.captured_queries if not q["sql"].startswith(control)]


@pytest.mark.parametrize("count", [3, 30])
def test_a_batch_is_written_in_the_same_number_of_statements_whatever_its_size(count, settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    nodes = [b.node(f"gpu-{k:02d}", cards=2) for k in range(count)]
    with CaptureQueriesContext(connection) as seen:
        readings_write(_bodies(nodes))
    # The cards, the live replicas on them, then in one transaction the readings' upsert, the
    # samples' insert, the nodes that answered, those that did not.
    statements = _statements(seen)
    assert len(statements) == 6, "\n".join(s[:90] for s in statements)
    assert [q["sql"] for q in seen.captured_queries].count("BEGIN") <= 1
    assert CardReading.objects.count() == CardSample.objects.count() == 2 * (count - 1)
    assert CardReading.objects.filter(foreign_mib=100).count() == 2 * (count - 1)
    assert NodeReading.objects.filter(seen_at__isnull=False).count() == count - 1
    assert NodeReading.objects.get(node=nodes[-1]).error == "the agent did not answer"
    with CaptureQueriesContext(connection) as seen:
        readings_write(_bodies(nodes))  # again: replaced, not added
    assert len(_statements(seen)) == 6
    assert CardReading.objects.count() == 2 * (count - 1) and CardSample.objects.count() == 4 * (count - 1)


def test_the_history_is_bounded_by_count_as_well_as_age(settings):
    settings.LLMGW_TELEMETRY_HISTORY_SAMPLES = 3
    node = b.node("gpu-1", cards=2)
    for _ in range(5):
        telemetry_record(node=node, body=_bodies([node, node])[0][1])
    assert CardSample.objects.count() == 10
    newest = set(CardSample.objects.order_by("-at", "-id").values_list("pk", flat=True)[:6])
    assert readings_prune() == 4
    assert set(CardSample.objects.values_list("pk", flat=True)) == newest


def test_a_round_is_due_after_its_interval_or_three_times_its_length_and_asks_more_agents_at_once_for_more_nodes(
    settings,
):
    from telemetry.services import next_interval, sampling_parallel

    settings.LLMGW_TELEMETRY_SECONDS = 15
    settings.LLMGW_TELEMETRY_NODES_PER_THREAD = 32
    settings.LLMGW_TELEMETRY_MAX_PARALLEL = 32
    assert next_interval(2.0) == 15 and next_interval(7.5) == 22.5
    assert [sampling_parallel(n) for n in (1, 100, 200, 1000, 5000)] == [4, 4, 7, 32, 32]
