"""An engine upgrade's dry run and its application: the fleet's default of an engine, or one profile's
release, re-planned under the new release's floors and memory terms, then applied as an audited change
whose replicas restart."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from audit.models import AuditEntry
from base.errors import DomainError
from catalog.models import EngineDefault, Node, Profile
from operations.models import RestartOperation
from operations.services.upgrade import upgrade_apply, upgrade_what_if
from planning import engines
from tests.support import builders as b

pytestmark = pytest.mark.django_db

ENGINES = Path(engines.__file__).with_name("engines.toml")
# vLLM as the registry has it, with a floor for releases from 0.20 on put ahead of the registry's own
# (the first range holding a release decides): Hopper cards only, a made-up figure for the test.
FLOOR = """
[[vllm.floors]]
releases = ">=0.20"
capability = "9.0"
source = "a test's own figure"
"""


@pytest.fixture
def floored_registry(tmp_path, monkeypatch):
    text = ENGINES.read_text().replace("[[vllm.floors]]\n", FLOOR.lstrip() + "\n[[vllm.floors]]\n", 1)
    path = tmp_path / "engines.toml"
    path.write_text(text)
    loaded = engines.load_registry(path)
    monkeypatch.setattr(engines, "registry", lambda: loaded)
    return loaded


def report(node: Node, vllm: str) -> Node:
    node.driver_version, node.cuda_version, node.arch = "580.65.06", "13.0", "x86_64"
    node.engines = {"vllm": vllm}
    node.facts_at = timezone.now()
    node.save()
    return node


@pytest.fixture
def fleet(floored_registry):
    """Two vLLM profiles on the fleet's default (0.19.1): one on A100s (8.0), one on H100s (9.0), each
    with a live replica; the H100 node has 0.20.0 installed, the A100 node 0.19.1 only."""
    EngineDefault.objects.create(engine="vllm", version="0.19.1")
    a100 = b.gpu_class("a100-80g", capability="8.0")
    h100 = b.gpu_class("h100-80g", capability="9.0")
    node_a = report(b.node("gpu-a100", cls=a100, cards=4), "0.19.1")
    node_h = report(b.node("gpu-h100", cls=h100, cards=4), "0.20.0")
    on_a = b.profile(b.llama_8b("llama-a"), cls=a100)
    on_h = b.profile(b.llama_8b("llama-h"), cls=h100)
    b.replica(on_a, node_a, [0], port=8001)
    b.replica(on_h, node_h, [0], port=8002)
    return on_a, on_h


def test_the_fleet_default_changes_dry_run_lists_the_profiles_that_would_stop_fitting(fleet):
    entries = AuditEntry.objects.count()
    plan = upgrade_what_if(engine_name="vllm", release="0.20.0").as_dict()
    assert (plan["scope"], plan["before"], plan["release"]) == ("default", "0.19.1", "0.20.0")
    rows = {p["model"]: p for p in plan["profiles"]}
    assert set(rows) == {"llama-a", "llama-h"}
    assert plan["stop_fitting"] == ["llama-a/default"]
    assert "compute capability 9.0" in rows["llama-a"]["refusal"] and "8.0" in rows["llama-a"]["refusal"]
    assert plan["nodes_lacking"] == ["gpu-a100"]  # its cards and its installed release both refuse it
    assert rows["llama-h"]["stops_fitting"] is False and rows["llama-h"]["nodes_lacking"] == []
    # KV tokens a card, before and after: the registry keeps one memory model for vLLM, and says so.
    assert rows["llama-h"]["kv_tokens_before"] == rows["llama-h"]["kv_tokens_after"] > 0
    assert "one memory model" in plan["note"]
    # A dry run: nothing saved.
    assert EngineDefault.objects.get(engine="vllm").version == "0.19.1"
    assert AuditEntry.objects.count() == entries


def test_applying_it_is_refused_while_a_profile_would_stop_fitting_and_nothing_changes(fleet):
    entries = AuditEntry.objects.count()
    with pytest.raises(DomainError) as caught:
        upgrade_apply(engine_name="vllm", release="0.20.0")
    assert caught.value.code == "upgrade_does_not_fit" and "llama-a/default" in caught.value.message
    assert EngineDefault.objects.get(engine="vllm").version == "0.19.1"
    assert AuditEntry.objects.count() == entries and not RestartOperation.objects.exists()


def test_applying_the_default_change_is_audited_and_restarts_the_profiles_that_run_it(fleet, actor):
    on_a, on_h = fleet
    on_a.engine_version = "0.19.1"  # pinned: the default no longer touches it
    on_a.save()
    plan = upgrade_apply(engine_name="vllm", release="0.20.0", actor=actor)
    assert plan.applied and [p.model for p in plan.profiles] == ["llama-h"]
    assert EngineDefault.objects.get(engine="vllm").version == "0.20.0"
    on_h.refresh_from_db()
    assert on_h.revision == 2
    (op,) = RestartOperation.objects.all()
    assert op.model.name == "llama-h" and "0.19.1 → 0.20.0" in op.cause
    assert AuditEntry.objects.filter(object_type="enginedefault", action="update").exists()
    assert AuditEntry.objects.filter(action="upgrade", object_key="llama-h/default").exists()


def test_a_profiles_own_release_dry_run_and_apply(fleet, actor):
    _, on_h = fleet
    plan = upgrade_what_if(engine_name="vllm", release="0.20.0", profile="llama-h/default")
    assert plan.scope == "profile" and [p.model for p in plan.profiles] == ["llama-h"]
    upgrade_apply(engine_name="vllm", release="0.20.0", profile="llama-h/default", actor=actor)
    on_h.refresh_from_db()
    assert (on_h.engine_version, on_h.revision) == ("0.20.0", 2)
    assert RestartOperation.objects.get().model.name == "llama-h"


def test_the_command_prints_the_dry_run_and_exits_1_when_a_profile_would_stop_fitting(fleet):
    out = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("engine_upgrade", "vllm", "0.20.0", "--dry-run", stdout=out)
    assert caught.value.returncode == 1
    text = out.getvalue()
    assert "llama-a/default" in text and "would not run" in text and "gpu-a100" in text
    assert EngineDefault.objects.get(engine="vllm").version == "0.19.1"


def test_bad_input_is_refused_saying_what_is_wrong(fleet):
    with pytest.raises(DomainError, match="not a release number"):
        upgrade_what_if(engine_name="vllm", release="newest")
    with pytest.raises(DomainError, match="already"):
        upgrade_what_if(engine_name="vllm", release="0.19.1")
    with pytest.raises(DomainError) as caught:
        upgrade_what_if(engine_name="vllm", release="0.20.0", profile="nope/default")
    assert caught.value.code == "not_found"
    with pytest.raises(DomainError) as caught:
        upgrade_what_if(engine_name="nosuch", release="1.0")
    assert caught.value.code == "unknown_engine"
    assert Profile.objects.filter(engine_version="").count() == 2  # nothing changed
