"""A restart with a node whose agent hangs (a real socket that accepts and never answers): the
node is given up once, for every step at once, within the absence window, and the restart is over
within the bound docs/restarts.md gives (``hung_agent_delay``), each step that met it saying why."""

from __future__ import annotations

import time

import pytest

from audit.models import AuditEntry
from catalog.models import Replica
from operations.models import RestartOperation
from operations.services.runner import run_operation
from operations.services.runner.conversation import hung_agent_delay
from operations.services.start import restart_start
from tests.support import builders as b
from tests.support.hung import hung_agent
from tests.support.restart import MODEL, fleet_of, record_node

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_restarts", "audit_flushable"),
]

# What the steps that do not meet the hung node take at most here (a stand-in loads in 0.5 s, settles
# 0.2 s, stops within its 2 s grace): the bound is this plus the hung agent's delay.
THE_REST = 10.0


def test_a_restart_meeting_a_hung_agent_is_over_within_the_documented_bound_with_a_reason(tmp_path, actor):
    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), cards=2) as fleet, hung_agent() as hung:
        node = record_node("gpu-h", hung.url, fleet.agents["gpu-a"].token, cards=4)
        # The catalog believes gpu-h answers: its replica is ready, and its free cards take replacements.
        b.replica(fleet.profile, node, [0], name="llama-1", port=fleet.profile.pk + 8700)
        fleet.start("llama-2", "gpu-a", [0])
        fleet.start("llama-3", "gpu-b", [0])
        op = restart_start(
            model_name=MODEL, replicas=["llama-1", "llama-2", "llama-3"], in_place=False, max_parallel=3
        )

        began = time.monotonic()
        run_operation(op.pk)
        took = time.monotonic() - began

        bound = hung_agent_delay() + THE_REST
        assert took <= bound, f"the restart took {took:.1f} s, over the documented {bound:.1f} s"
        op = RestartOperation.objects.get(pk=op.pk)
        assert not op.is_active and all(s.finished_at for s in op.steps.all())

        # The node was marked unreachable, once, saying why; nothing was sent to it after that.
        node.refresh_from_db()
        assert not node.reachable and "did not answer within" in node.unreachable_reason
        (marked,) = AuditEntry.objects.filter(action="unreachable", object_key="gpu-h")
        late = [t for t in hung.accepted if t > marked.at.timestamp() + 0.5]
        assert not late, f"{len(late)} call(s) sent to gpu-h after it was given up"

        # Each step that met it says so; llama-1 was never confirmed stopped: its card stays held.
        met = [s for s in op.steps.all() if "gpu-h" in s.reason]
        assert met and all("answer" in s.reason for s in met), [s.reason for s in op.steps.all()]
        old = Replica.objects.get(name="llama-1")
        assert old.state in Replica.HOLDING_STATES and old.shards.exists()
        assert Replica.objects.filter(profile__model__name=MODEL, state="ready").count() >= 2
