"""A restart whose replacement lands on an agent that is down, fails, is too slow, or refuses the token.

Each fails its step with a plain reason, and leaves nothing half-done: the
replacement is recorded failed with its cards released, and the old replica
keeps serving. The misbehaving agents are real processes on 127.0.0.1.
"""

from __future__ import annotations

import contextlib

import pytest
from agent_fakes import running_fake_agent
from agent_testing import free_port

from agentclient.client import AgentCallFailed, AgentClient
from audit.models import AuditEntry
from catalog.models import Node, Replica
from operations.services.runner import run_operation
from operations.services.start import restart_start
from tests.support.restart import (
    MODEL,
    answers,
    assert_nothing_half_done,
    fleet_of,
    record_node,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts", "audit_flushable"),
]

REASONS = {
    "down": "refused the connection",
    "500": "failed while starting replica",
    "slow": "did not answer within 1 s",
    "token": "refused the token",
}


@pytest.mark.parametrize("trouble", ["down", "500", "slow", "token"])
def test_an_agent_in_trouble_fails_the_step_with_a_reason_and_nothing_is_left_half_done(
    tmp_path, actor, settings, trouble
):
    settings.LLMGW_AGENT_TIMEOUT_SECONDS = 1.0
    nodes = ("gpu-a", "gpu-x") if trouble == "token" else ("gpu-a",)
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(fleet_of(tmp_path, nodes=nodes, cards=1))
        old = fleet.start("llama-1", "gpu-a", [0])  # gpu-a is full: the replacement must go to gpu-x
        if trouble == "token":
            Node.objects.filter(name="gpu-x").update(agent_token="not-the-token")
        elif trouble == "down":
            record_node("gpu-x", f"http://127.0.0.1:{free_port()}", "t0ken")
        else:
            fake = stack.enter_context(
                running_fake_agent(
                    tmp_path / "fake",
                    status=500 if trouble == "500" else 200,
                    delay=3.0 if trouble == "slow" else 0.0,
                )
            )
            record_node("gpu-x", fake.base_url, "t0ken")
        fleet.change_profile(args=["--max-num-seqs", "8"])

        op = restart_start(model_name=MODEL, ready_timeout=20)
        assert run_operation(op.pk) == "failed"

        (step,) = op.steps.select_related("new_replica")
        assert (step.state, step.node) == ("failed", "gpu-x")
        assert "The agent of node gpu-x" in step.reason and REASONS[trouble] in step.reason, step.reason
        assert "llama-1 keeps serving" in step.reason
        old.refresh_from_db()
        assert old.state == "ready" and old.shards.count() == 1 and answers(old.port)
        op.refresh_from_db()
        assert op.state == "failed" and REASONS[trouble] in op.reason
        if trouble == "500":
            assert any(line.startswith("PUT /v1/replicas/") for line in fake.requests())
            # It answered 500 to the stop too: said so, and the replacement, which may run, keeps its
            # card as stopping until the agent confirms a stop (never silently freed).
            assert "could not be stopped either" in step.reason and "recorded as stopping" in step.reason
            assert step.new_replica.state == "stopping" and step.new_replica.shards.count() == 1
            return
        if trouble == "slow":
            # Not answered for the absence window: the node is marked unreachable and the run gives it
            # up; the stop of the replacement, which may run, is not sent: it keeps its card as stopping.
            assert "this restart gives it up" in step.reason and "recorded as stopping" in step.reason
            assert not Node.objects.get(name="gpu-x").reachable
            assert step.new_replica.state == "stopping" and step.new_replica.shards.count() == 1
            return
        assert step.new_replica.state == "failed" and not step.new_replica.shards.exists()
        assert_nothing_half_done()


def test_the_agent_client_says_what_went_wrong_in_a_sentence(tmp_path, settings):
    node = Node(name="gpu-z", agent_url=f"http://127.0.0.1:{free_port()}", agent_token="x")
    with pytest.raises(AgentCallFailed) as down:
        AgentClient.for_node(node, timeout=1).get("r1")
    assert down.value.code == "agent_down"
    assert str(down.value).startswith("The agent of node gpu-z (http://127.0.0.1:")
    assert "refused the connection while reading the state of replica r1: is the agent running?" in str(
        down.value
    )

    with running_fake_agent(tmp_path, status=200, delay=2) as slow:
        with pytest.raises(AgentCallFailed) as late:
            AgentClient(node="gpu-z", url=slow.base_url, token="x", timeout=0.5).start("r1", {})
        assert late.value.code == "agent_slow"
        assert "did not answer within 0.5 s while starting replica r1" in str(late.value)


def test_a_stop_of_a_replica_the_agent_does_not_know_counts_as_stopped(tmp_path, actor):
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=1) as fleet:
        client = AgentClient.for_node(fleet.nodes["gpu-a"])
        assert client.stop("never-started")["state"] == "stopped"
        with pytest.raises(AgentCallFailed) as err:
            client.get("never-started")
        assert err.value.code == "not_found"
        assert not Replica.objects.exists()


def test_an_in_place_stop_the_agent_refused_leaves_the_replica_ready_again(tmp_path, actor):
    """In place, the old replica is recorded stopping (drained) before its agent is asked; its agent
    refuses the token, so the stop certainly never reached the engine: the replica is recorded ready
    again, audited, and the step fails saying nothing else changed."""
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=1) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        Node.objects.filter(name="gpu-a").update(agent_token="not-the-token")
        op = restart_start(model_name=MODEL, replicas=["llama-1"], in_place=True, ready_timeout=20)
        assert run_operation(op.pk) == "failed"

        (step,) = op.steps.all()
        assert "Nothing was changed: llama-1 is still recorded as ready" in step.reason, step.reason
        old.refresh_from_db()
        assert old.state == "ready" and old.shards.count() == 1 and answers(old.port)
        actions = list(
            AuditEntry.objects.filter(object_key="llama-1").order_by("id").values_list("action", flat=True)
        )
        assert actions[-2:] == ["drain", "ready"], actions
        said = AuditEntry.objects.filter(object_key="llama-1", action="ready").latest("id").message
        assert "llama-1 takes work again: its stop never reached its agent" in said, said
