"""While a restart of a model runs, every write that would change what it runs is refused ``busy``.

The paths: the profile saved through the admin, the API and the cluster settings file; the resize and
context operations (their dry runs too); a second restart. Each refusal names the operation and its
page, changes nothing and writes no audit entry; once the restart has ended, the same write goes through.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from base.actor import Actor, acting_as
from base.errors import DomainError
from catalog.models import Profile
from catalog.services import catalog as services
from operations.models import RestartOperation
from operations.services.busy import refuse_while_restarting
from operations.services.lease import claim
from operations.services.start import restart_start
from tests.support import builders as b

pytestmark = pytest.mark.django_db

MODEL = "llama-3.1-8b"

CLUSTER = """
[[models]]
name = "llama-3.1-8b"
source = "meta-llama/Llama-3.1-8B-Instruct"
context_length = 131072
layers = 32
attention_heads = 32
kv_heads = 8
head_dim = 128
weight_bytes = 16060522496
kv_bytes_per_token = 131072

[[models.profiles]]
name = "h100"
engine = "vllm"
gpu_class = "h100-80g"
args = [{args}]
"""


@pytest.fixture
def restarting():
    """A model with two replicas, one a stale one, and a restart of it that a worker holds."""
    node = b.node("gpu-1", cards=8)
    profile = b.profile(b.llama_8b(MODEL), "h100")
    b.replica(profile, node, [0], name="llama-1", port=8001)
    b.replica(profile, node, [1], name="llama-2", port=8002)
    with acting_as(Actor(via="cli", name="pytest")):
        op = restart_start(model_name=MODEL, replicas=["llama-1"])
    assert claim(op.pk, "worker:busy-1") is not None
    return op


def refused(detail: str, op: RestartOperation) -> None:
    assert f"Restart #{op.pk} of {MODEL} is running (/operations/{op.pk}/)" in detail, detail
    assert "Wait until it ends, or cancel it" in detail


def unchanged(before: Profile, entries: int) -> None:
    after = Profile.objects.get(pk=before.pk)
    assert (after.args, after.revision, after.tp) == (before.args, before.revision, before.tp)
    assert AuditEntry.objects.count() == entries


def end(op: RestartOperation) -> None:
    RestartOperation.objects.filter(pk=op.pk).update(state=RestartOperation.State.SUCCEEDED)


def test_the_service_refuses_and_names_the_operation(restarting):
    with pytest.raises(DomainError) as err:
        refuse_while_restarting(restarting.model_id, doing="rolling it back")
    assert (err.value.code, err.value.status) == ("busy", 409)
    refused(err.value.message, restarting)
    assert "rolling it back now" in err.value.message


def test_a_profile_saved_through_the_api_during_a_restart_is_refused_busy(restarting):
    profile = Profile.objects.get(name="h100")
    entries = AuditEntry.objects.count()
    api = APIClient()
    api.force_authenticate(b.user("alice", "catalog.change_profile"))
    body = {"args": ["--max-num-seqs", "8"]}
    response = api.patch(f"/api/profiles/{profile.pk}/", body, format="json")
    assert (response.status_code, response.json()["code"]) == (409, "busy"), response.content
    refused(response.json()["detail"], restarting)
    unchanged(profile, entries)

    end(restarting)
    response = api.patch(f"/api/profiles/{profile.pk}/", body, format="json")
    assert response.status_code == 200, response.content
    assert Profile.objects.get(pk=profile.pk).revision == profile.revision + 1


def test_a_profile_saved_in_the_admin_during_a_restart_is_refused_busy(restarting):
    profile = Profile.objects.get(name="h100")
    entries = AuditEntry.objects.count()
    root = get_user_model().objects.create_superuser("root", "root@example.org", "pw-for-tests-only-123")
    admin = Client()
    admin.force_login(root)
    form = {
        "model": profile.model_id,
        "name": "h100",
        "engine": "vllm",
        "gpu_class": profile.gpu_class_id,
        "gpus_per_node": 1,
        "tp": 1,
        "nodes": 1,
        "pp": 0,
        "args": '["--max-num-seqs", "8"]',
        "env": "{}",
    }
    response = admin.post(f"/admin/catalog/profile/{profile.pk}/change/", form, follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert any(f"Restart #{restarting.pk}" in m for m in said), said
    refused(next(m for m in said if f"Restart #{restarting.pk}" in m), restarting)
    unchanged(profile, entries)

    end(restarting)
    response = admin.post(f"/admin/catalog/profile/{profile.pk}/change/", form)
    assert response.status_code == 302, response.content
    assert Profile.objects.get(pk=profile.pk).args == ["--max-num-seqs", "8"]


def test_a_profile_changed_in_the_settings_file_during_a_restart_is_refused_whole(
    restarting, tmp_path, settings
):
    path = tmp_path / "cluster.toml"
    path.write_text(CLUSTER.format(args=""))
    settings.LLMGW_CLUSTER_SETTINGS = str(path)
    end(restarting)
    call_command("sync_cluster_settings", stdout=StringIO())  # the model becomes declared, as the file says
    with acting_as(Actor(via="cli", name="pytest")):
        op = restart_start(model_name=MODEL, replicas=["llama-1"])
    claim(op.pk, "worker:busy-2")
    profile = Profile.objects.get(name="h100")
    entries = AuditEntry.objects.count()

    path.write_text(CLUSTER.format(args='"--max-num-seqs", "8"'))
    with pytest.raises(CommandError) as err:
        call_command("sync_cluster_settings", stdout=StringIO())
    assert f"{path}: model {MODEL} profile h100: " in str(err.value)
    refused(str(err.value), op)
    unchanged(profile, entries)


@pytest.mark.parametrize(
    ("url", "body"), [("gpus", {"gpus": 2}), ("context", {"tokens": 8192})], ids=["resize", "context"]
)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "apply"])
def test_a_resize_or_context_change_during_a_restart_is_refused_busy(restarting, url, body, dry_run):
    profile = Profile.objects.get(name="h100")
    entries = AuditEntry.objects.count()
    api = APIClient()
    api.force_authenticate(b.user("olga", "catalog.resize_model"))
    response = api.post(f"/api/models/{MODEL}/{url}/", {**body, "dry_run": dry_run}, format="json")
    assert (response.status_code, response.json()["code"]) == (409, "busy"), response.content
    refused(response.json()["detail"], restarting)
    unchanged(profile, entries)


def test_a_second_restart_during_a_restart_is_refused_busy(restarting, actor):
    entries = AuditEntry.objects.count()
    with pytest.raises(DomainError) as err:
        restart_start(model_name=MODEL, replicas=["llama-2"])
    assert err.value.code == "busy"
    refused(err.value.message, restarting)
    assert AuditEntry.objects.count() == entries


def test_a_save_that_does_not_change_what_runs_is_not_refused(restarting):
    profile = Profile.objects.get(name="h100")
    with acting_as(Actor(via="cli", name="pytest")):
        services.profile_save(instance=profile)  # unchanged: nothing to refuse, nothing recorded
    assert Profile.objects.get(pk=profile.pk).revision == profile.revision
