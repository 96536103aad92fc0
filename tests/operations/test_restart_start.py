"""Starting a restart: what is restarted, what is refused, the audit entry, the task enqueued on commit.

No agent is needed: nothing runs until a worker takes the operation.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django_tasks_db.models import DBTaskResult

from audit.models import AuditEntry
from base.errors import DomainError
from catalog.models import Node, Profile, Replica, restartable_replicas_q
from operations.models import RestartOperation
from operations.services.start import restart_start
from tests.support import builders as b

pytestmark = pytest.mark.django_db

MODEL = "llama"


@pytest.fixture
def llama():
    node = b.node("gpu-1", cards=8)
    model = b.llama_8b(MODEL)
    profile = b.profile(model, "h100")
    for i in range(3):
        b.replica(profile, node, [i], name=f"llama-{i + 1}")
    return profile


def make_stale(profile: Profile, *names: str) -> None:
    Profile.objects.filter(pk=profile.pk).update(revision=2)
    profile.replicas.exclude(name__in=names).update(revision=2)


def test_the_stale_replicas_are_restarted_by_default_with_one_step_each(llama, actor):
    make_stale(llama, "llama-1", "llama-3")
    op = restart_start(model_name=MODEL)
    assert (op.state, op.in_place, op.max_parallel, op.ready_timeout) == ("queued", None, 1, 600)
    assert (op.requested_by_name, op.via, op.requested_by) == ("pytest", "cli", None)
    assert [(s.old_replica.name, s.state) for s in op.steps.order_by("id")] == [
        ("llama-1", "pending"),
        ("llama-3", "pending"),
    ]
    entry = AuditEntry.objects.get(action="restart_start")
    assert (entry.actor, entry.via, entry.object_type, entry.object_key) == (
        "pytest",
        "cli",
        "restart",
        str(op.pk),
    )
    assert entry.after["replicas"] == ["llama-1", "llama-3"]
    assert "asked by pytest" in entry.message


def test_named_live_replicas_are_restarted_even_when_current(llama, actor):
    op = restart_start(
        model_name=MODEL, replicas=["llama-2", "llama-2"], in_place=True, max_parallel=2, ready_timeout=30
    )
    assert [s.old_replica.name for s in op.steps.all()] == ["llama-2"]
    assert (op.in_place, op.mode) == (True, "in place")


@pytest.mark.parametrize("state", Replica.State.values)
def test_a_restart_takes_live_and_unknown_replicas_in_a_query_and_on_a_row_alike(llama, state):
    replica = Replica.objects.get(name="llama-1")
    Replica.objects.filter(pk=replica.pk).update(state=state)
    replica.refresh_from_db()
    taken = Replica.objects.filter(restartable_replicas_q(), pk=replica.pk).exists()
    assert taken == replica.is_restartable == (state in {"starting", "loading", "ready", "unknown"})


def test_the_task_is_enqueued_when_the_transaction_commits_not_before(
    llama, actor, django_capture_on_commit_callbacks
):
    make_stale(llama, "llama-1")
    with django_capture_on_commit_callbacks(execute=False) as callbacks, transaction.atomic():
        op = restart_start(model_name=MODEL)
        assert not DBTaskResult.objects.exists()
    assert len(callbacks) == 1
    callbacks[0]()
    op.refresh_from_db()
    assert DBTaskResult.objects.get(id=op.task_id).args_kwargs == {"args": [op.pk], "kwargs": {}}


@pytest.mark.parametrize(
    ("kwargs", "code", "status"),
    [
        ({"model_name": "nope"}, "not_found", 404),
        ({"model_name": MODEL}, "nothing_to_restart", 409),
        ({"model_name": MODEL, "replicas": ["ghost"]}, "not_found", 404),
        ({"model_name": MODEL, "replicas": ["other-1"]}, "other_model", 400),
        ({"model_name": MODEL, "replicas": ["llama-stopped"]}, "not_live", 409),
        ({"model_name": MODEL, "replicas": ["llama-1"], "max_parallel": 0}, "invalid", 400),
        ({"model_name": MODEL, "replicas": ["llama-1"], "ready_timeout": 0}, "invalid", 400),
    ],
)
def test_refusals_say_why_and_save_nothing(llama, actor, kwargs, code, status):
    other = b.profile(b.llama_8b("other"), "h100")
    b.replica(other, b.node("gpu-2", cards=1), [0], name="other-1")
    b.replica(llama, b.node("gpu-3", cards=1), [0], name="llama-stopped", state="stopped")
    with pytest.raises(DomainError) as err:
        restart_start(**kwargs)
    assert (err.value.code, err.value.status) == (code, status), err.value.message
    assert not RestartOperation.objects.exists() and not AuditEntry.objects.exists()


def test_one_restart_of_a_model_at_a_time(llama, actor):
    first = restart_start(model_name=MODEL, replicas=["llama-1"])
    with pytest.raises(DomainError) as err:
        restart_start(model_name=MODEL, replicas=["llama-2"])
    assert (err.value.code, err.value.status) == ("busy", 409)
    assert f"Restart #{first.pk} of {MODEL} is queued" in err.value.message
    RestartOperation.objects.filter(pk=first.pk).update(state="succeeded")
    restart_start(model_name=MODEL, replicas=["llama-2"])


def test_cpu_only_and_multi_node_profiles_are_refused(actor):
    cpu = Profile.objects.create(model=b.llama_8b(MODEL), name="cpu", engine="llamacpp", gpu_class=None)
    b.replica(cpu, b.node("gpu-1", cards=1), [], name="llama-cpu")
    with pytest.raises(DomainError) as err:
        restart_start(model_name=MODEL, replicas=["llama-cpu"])
    assert err.value.code == "cpu_only"
    # Across nodes where the engine cannot span them (TensorRT-LLM: one MPI world mpirun starts),
    # refused naming why; vLLM's spans (tests/operations/test_restart_groups.py).
    wide = b.profile(b.llama_8b("wide"), "h100", engine="trtllm", nodes=2)
    b.replica(wide, b.node("gpu-2", cards=1), [0], name="wide-1")
    with pytest.raises(DomainError) as err:
        restart_start(model_name="wide", replicas=["wide-1"])
    assert err.value.code == "multi_node"
    assert "trtllm cannot: a TensorRT-LLM replica across nodes is one MPI world" in err.value.message
    # Pipeline stages on one node: not a restart's to lay out.
    staged = b.profile(b.llama_8b("staged"), "h100", pp=2)
    b.replica(staged, b.node("gpu-3", cards=2), [0, 1], name="staged-1")
    with pytest.raises(DomainError) as err:
        restart_start(model_name="staged", replicas=["staged-1"])
    assert err.value.code == "multi_node" and "2 pipeline stages on one node" in err.value.message


def test_a_group_whose_pipeline_stages_are_not_its_nodes_is_refused_and_nothing_changes(actor):
    # Across nodes a pipeline stage runs a node (vLLM is told --pipeline-parallel-size = the ranks):
    # pp 4 over 2 nodes would hold 8 cards (2 x 4) for an engine told TP 2 x PP 2, using 4 of them.
    staged = b.profile(b.llama_8b(MODEL), "h100", gpus=2, nodes=2, pp=4)
    for name in ("gpu-1", "gpu-2"):
        b.node(name, cards=4)
    Node.objects.filter(name__in=("gpu-1", "gpu-2")).update(fabric_domain="ib-1")  # room for the group
    b.replica(staged, b.node("gpu-3", cards=8), list(range(8)), name="llama-1")
    audited = AuditEntry.objects.count()
    with pytest.raises(DomainError) as err:
        restart_start(model_name=MODEL, replicas=["llama-1"])
    assert err.value.code == "multi_node", err.value.message
    assert "4 pipeline stages over 2 nodes" in err.value.message
    assert not RestartOperation.objects.exists() and AuditEntry.objects.count() == audited


def test_a_declared_model_may_be_restarted(actor):
    profile = b.profile(b.llama_8b(MODEL, declared=True, declared_in="/etc/llmgw/cluster.toml"), "h100")
    b.replica(profile, b.node("gpu-1", cards=1), [0], name="llama-1")
    assert restart_start(model_name=MODEL, replicas=["llama-1"]).state == "queued"


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_the_command_with_no_wait_starts_the_restart_as_its_user(llama):
    make_stale(llama, "llama-1")
    out = run("restart", MODEL, "--no-wait", "--as", "ops-bot", "--max-parallel", "2", "--rolling")
    op = RestartOperation.objects.get()
    assert f"restart #{op.pk} of {MODEL} queued: llama-1 (rolling)" in out
    assert f"/api/operations/{op.pk}/" in out
    assert (op.requested_by_name, op.via, op.max_parallel, op.in_place) == ("ops-bot", "cli", 2, False)


def test_the_command_exits_1_when_the_restart_is_refused(llama):
    with pytest.raises(CommandError) as err:
        run("restart", MODEL, "--no-wait")
    assert err.value.returncode == 1 and "[nothing_to_restart]" in str(err.value)


def test_the_command_shows_the_end_of_a_restart_and_exits_1_unless_it_succeeded(llama, actor, monkeypatch):
    """The watch loop on a restart a worker already ended (PostgreSQL's test_worker.py waits for a real one)."""
    from operations.management.commands import restart as command

    make_stale(llama, "llama-1")
    real_start = command.restart_start

    def start_and_end(**kwargs):  # the worker's part, done at once
        op = real_start(**kwargs)
        op.steps.update(state="failed", reason="llama-r9 was not ready within 1 s (loading).")
        RestartOperation.objects.filter(pk=op.pk).update(
            state="failed", reason="0 of 1 replica(s) restarted."
        )
        return op

    monkeypatch.setattr(command, "restart_start", start_and_end)
    out = StringIO()
    with pytest.raises(CommandError) as err:
        call_command("restart", MODEL, stdout=out, stderr=StringIO())
    assert err.value.returncode == 1 and "Failed: 0 of 1 replica(s) restarted." in str(err.value)
    assert "llama-1: Failed - llama-r9 was not ready within 1 s" in out.getvalue()


def test_the_live_table_fits_80_columns_with_each_reason_on_lines_of_its_own(llama, actor):
    from rich.console import Console

    from operations.management.follow import table
    from operations.selectors import operations_with_steps

    make_stale(llama, "llama-1")
    op = restart_start(model_name=MODEL)
    reason = (
        "The fleet changed since the restart was planned: llama-1's replacement was to start on gpu-1 "
        "cards [3], and those cards are no longer free on a ready node. llama-1 keeps serving."
    )
    op.steps.update(state="failed", node="gpu-1", cards=[3, 4], reason=reason)
    console = Console(width=80, record=True, file=StringIO(), color_system=None)
    console.print(table(operations_with_steps().get(pk=op.pk)))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any("gpu-1 cards #3, #4" in line for line in lines)  # indexes, said to be indexes
    # The reason wraps over the whole width: 3 lines for its ~200 characters, not one a word.
    first = next(i for i, line in enumerate(lines) if line.startswith("1. The fleet changed"))
    assert "".join(lines[first : first + 3]).replace(" ", "") == f"1. {reason}".replace(" ", "")
