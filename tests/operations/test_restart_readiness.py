"""Readiness by generation and stops that drain, through a restart against real agents (processes)
and stand-in engines on 127.0.0.1: a replacement that answers /health and /v1/models but cannot
generate is never counted ready, and the restart fails saying why, the old replica serving on; a
rolling restart of an engine with a request in flight lets that request finish before it stops it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from agent_testing import wait_until

from audit.models import AuditEntry
from catalog.models import Replica
from operations.models import RestartOperation
from operations.services.runner import run_operation
from operations.services.runner.conversation import stop_note
from operations.services.start import restart_start
from tests.support.restart import MODEL, answers, assert_nothing_half_done, fleet_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts", "audit_flushable"),
]


def running_on(port: int) -> float | None:
    """The engine's own count of requests in flight (vLLM's gauge, which the stand-in serves)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2, trust_env=False).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_replacement_that_answers_health_but_cannot_generate_is_never_ready_and_the_restart_fails(
    tmp_path, actor
):
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2, processes=True) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(env={**fleet.profile.env, "STANDIN_GENERATION_FAILS": "1"})
        op = restart_start(model_name=MODEL, max_parallel=1, ready_timeout=4)
        assert run_operation(op.pk) == "failed"

        op.refresh_from_db()
        (step,) = op.steps.select_related("new_replica")
        new = step.new_replica
        assert step.state == "failed"
        assert "one-token completion answered 500" in step.reason, step.reason
        assert "STANDIN_GENERATION_FAILS" in step.reason
        assert "one-token completion answered 500" in op.reason or "1 failed" in op.reason, op.reason
        # Never counted ready: no "ready" in the catalog's history of it, nor on its agent.
        assert new.state == "failed" and not new.shards.exists()
        assert not AuditEntry.objects.filter(action="ready", object_key=new.name).exists()
        assert fleet.agents["gpu-a"].replica(new.name)["ready_at"] is None
        # The old replica was not touched and serves on.
        old.refresh_from_db()
        assert old.state == "ready" and answers(old.port)
        assert_nothing_half_done()


def test_in_place_a_replacement_that_cannot_generate_is_rolled_back_to_the_old_spec(tmp_path, actor):
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=1, processes=True) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(env={**fleet.profile.env, "STANDIN_GENERATION_FAILS": "1"})
        op = restart_start(model_name=MODEL, in_place=True, max_parallel=1, ready_timeout=4)
        assert run_operation(op.pk) == "failed"

        (step,) = op.steps.select_related("new_replica")
        assert "one-token completion answered 500" in step.reason, step.reason
        assert "llama-1 was started again with its previous spec and is ready" in step.reason, step.reason
        assert not AuditEntry.objects.filter(action="ready", object_key=step.new_replica.name).exists()
        old.refresh_from_db()
        assert old.state == "ready" and answers(old.port)
        # Back on its previous spec, which generates: its agent's probe said so.
        assert fleet.agents["gpu-a"].replica("llama-1")["state"] == "ready"
        assert_nothing_half_done()


@pytest.mark.parametrize("in_place", [False, True], ids=["rolling", "in place"])
def test_a_restart_lets_the_request_in_flight_on_the_old_engine_finish(tmp_path, actor, settings, in_place):
    """Rolling (the old one stops once its replacement is ready) or in place (it stops first): either
    way it is recorded stopping before its agent is asked, the agent drains it, and the catalog keeps
    what the agent said of the drain in its reason."""
    settings.LLMGW_STOP_DRAIN_SECONDS = 15.0
    settings.LLMGW_OPERATION_STALE_SECONDS = 40  # above the stop's wait, drain included
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2, processes=True) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        answer: dict[str, Any] = {}

        def ask() -> None:  # a client of the old engine, as through a gateway
            answer["response"] = httpx.post(
                f"http://127.0.0.1:{old.port}/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "a long answer, please"}],
                    "standin_seconds": 4,
                },
                timeout=60,
                trust_env=False,
            )
            answer["at"] = time.monotonic()

        client = threading.Thread(target=ask)
        client.start()
        wait_until(lambda: running_on(old.port) == 1, what="the request to be in flight")
        op = restart_start(model_name=MODEL, max_parallel=1, ready_timeout=30, in_place=in_place)
        assert run_operation(op.pk) == "succeeded"
        finished = time.monotonic()
        client.join(timeout=30)

        response = answer["response"]
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "echo: a long answer, please"
        assert answer["at"] <= finished  # answered before the restart ended, not cut off by it
        old.refresh_from_db()
        assert old.state == "stopped" and not old.shards.exists()
        # The catalog stopped counting it before it was stopped, and said why.
        actions = list(
            AuditEntry.objects.filter(object_key=old.name, via="worker")
            .order_by("id")
            .values_list("action", flat=True)
        )
        assert actions[-2:] == ["drain", "stop"], actions
        # Its agent waited for the request, and said so.
        agent_said = fleet.agents["gpu-a"].replica(old.name)
        assert agent_said["state"] == "stopped" and agent_said["exit_code"] == 0
        assert "drained: 1 request(s) in flight finished in" in agent_said["reason"], agent_said["reason"]
        # ...and the catalog says it too, where an operator reads why the replica stopped.
        assert "drained: 1 request(s) in flight finished in" in old.reason, old.reason
        stop = AuditEntry.objects.filter(object_key=old.name, action="stop").latest("id")
        assert "drained: 1 request(s) in flight finished in" in stop.message, stop.message
        op.refresh_from_db()
        assert op.state == RestartOperation.State.SUCCEEDED
        (step,) = op.steps.select_related("new_replica")
        assert step.new_replica.state == Replica.State.READY and answers(step.new_replica.port)
        assert step.in_place is in_place
        assert_nothing_half_done()


@pytest.mark.parametrize(
    ("agent_said", "kept"),
    [
        (
            "stopped through the API (drained: 2 request(s) in flight finished in 1.4s)",
            "drained: 2 request(s) in flight finished in 1.4s",
        ),
        (
            "stopped through the API (the engine does not report its requests in flight (no /metrics), so none "
            "were waited for); killed with SIGKILL after 10s without exiting on SIGTERM",
            "the engine does not report its requests in flight (no /metrics), so none were waited for; "
            "killed with SIGKILL after 10s without exiting on SIGTERM",
        ),
        ("stopped through the API", ""),
        ("exited with code 1", ""),  # it had ended already: not this stop's words
    ],
)
def test_what_an_agent_said_of_a_stop_is_kept_without_its_generic_start(agent_said, kept):
    assert stop_note(agent_said) == kept
