"""A restart refuses a node whose agent enforces another launch policy than
the control plane's, naming both, and sends it nothing."""

from __future__ import annotations

import pytest
from llmgw_policy import default_policy, load_policy

from operations.services.runner import run_operation
from operations.services.start import restart_start
from tests.support.restart import MODEL, fleet_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts", "audit_flushable"),
]


def test_a_node_whose_agent_enforces_another_policy_is_refused_naming_both(tmp_path, actor):
    other = tmp_path / "policy.toml"
    other.write_text(default_policy().path.read_text() + "\n# an operator's local edit\n")
    theirs = load_policy(other).digest
    with fleet_of(tmp_path, nodes=("gpu-a",), policy_file=other) as fleet:
        old = fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        op = restart_start(model_name=MODEL, ready_timeout=20)

        assert run_operation(op.pk) == "failed"

        (step,) = op.steps.all()
        assert step.state == "failed"
        assert f"enforces launch policy {theirs}" in step.reason
        assert f"the control plane's is {default_policy().digest}" in step.reason
        # Nothing was sent: the agent runs only the old replica.
        with fleet.agents["gpu-a"].client() as http:
            assert [r["id"] for r in http.get("/v1/replicas").json()] == [old.name]
