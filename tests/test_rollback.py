"""A profile's revisions from the audit log, their diff, and rollback as an operation (service, API, command, page)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from rest_framework.test import APIClient

from audit.actor import Actor, acting_as
from audit.models import AuditEntry
from catalog.errors import DomainError
from catalog.models import Profile
from catalog.services.rollback import profile_rollback, revisions
from operations.models import RestartOperation
from tests import builders as b
from tests.restart_support import MODEL, fleet_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # On PostgreSQL the whole suite logs in as the application's role (tests/db_roles.py); app_role checks
    # that here the log is append-only for that login.
    pytest.mark.usefixtures("fast_restarts", "audit_flushable", "app_role"),
]


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def moved(tmp_path):
    """A replica at revision 1, its profile moved on to revision 2 (more sequences): the replica is stale."""
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "8"])
        yield fleet


def test_the_revisions_come_from_the_audit_log_newest_first(moved):
    profile = Profile.objects.get()
    found = revisions(profile)
    assert [r.number for r in found] == [2, 1]
    assert found[0].settings["args"] == ["--max-num-seqs", "8"] and found[1].settings["args"] == []


def test_a_rollback_saves_the_old_settings_as_a_new_revision_audits_it_and_restarts_the_stale_replicas(moved):
    with acting_as(Actor(via="cli", name="pytest")):
        done = profile_rollback(model=MODEL, profile="h100", revision=1)
    profile = Profile.objects.get()
    assert (profile.revision, profile.args) == (3, [])
    assert (done.from_revision, done.to_revision, done.new_revision) == (2, 1, 3)
    entry = AuditEntry.objects.get(action="rollback")
    assert (entry.before["args"], entry.after["args"], entry.after["revision"]) == (
        ["--max-num-seqs", "8"],
        [],
        3,
    )
    assert "rolled back to revision 1" in entry.message
    op = RestartOperation.objects.get(pk=done.operation)
    assert op.steps.get().old_replica.name == "llama-1"
    assert AuditEntry.objects.filter(action="restart_start", object_key=str(op.pk)).exists()


def test_a_dry_run_and_every_refusal_change_nothing_and_write_nothing(moved):
    before = AuditEntry.objects.count()
    with acting_as(Actor(via="cli", name="pytest")):
        assert profile_rollback(model=MODEL, profile="h100", revision=1, dry_run=True).new_revision == 3
        for kwargs, code in (
            ({"revision": 7}, "not_found"),
            ({"revision": 2}, "unchanged"),
            ({"revision": 1, "profile": "nope"}, "not_found"),
        ):
            with pytest.raises(DomainError) as err:
                profile_rollback(model=MODEL, **{"profile": "h100", **kwargs})
            assert err.value.code == code, err.value.message
        profile_rollback(model=MODEL, profile="h100", revision=1)
        after_first = AuditEntry.objects.count()
        with pytest.raises(DomainError) as err:  # its restart is queued: the busy check, as for a resize
            profile_rollback(model=MODEL, profile="h100", revision=2)
        assert err.value.code == "busy"
    assert Profile.objects.get().revision == 3
    assert after_first > before and AuditEntry.objects.count() == after_first


def test_the_api_rolls_back_for_an_operator_and_refuses_a_viewer(moved):
    api = APIClient()
    api.force_authenticate(b.user("viewer"))
    assert (
        api.post(
            f"/api/models/{MODEL}/rollback/", {"profile": "h100", "revision": 1}, format="json"
        ).status_code
        == 403
    )
    listed = api.get(f"/api/models/{MODEL}/profiles/h100/revisions/").json()
    assert [r["revision"] for r in listed] == [2, 1]
    api.force_authenticate(b.user("operator", "catalog.resize_model"))
    response = api.post(f"/api/models/{MODEL}/rollback/", {"profile": "h100", "revision": 1}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["new_revision"] == 3 and response.json()["operation"]
    assert AuditEntry.objects.get(action="rollback").via == "api"
    response = api.post(
        f"/api/models/{MODEL}/rollback/", {"profile": "h100", "revision": "one"}, format="json"
    )
    assert response.status_code == 400


def test_the_command_rolls_back_and_exits_1_when_refused(moved):
    b.user("deployer")
    out = io.StringIO()
    call_command("rollback", MODEL, "1", "--profile", "h100", "--no-wait", "--as", "deployer", stdout=out)
    assert "rolled" in out.getvalue() and "revision 2 -> 3" in out.getvalue()
    assert AuditEntry.objects.get(action="rollback").via == "cli"
    with pytest.raises(CommandError) as err:
        call_command("rollback", MODEL, "9", "--profile", "h100", "--as", "deployer", stdout=io.StringIO())
    assert err.value.returncode == 1 and "no revision 9" in str(err.value)


def test_the_revisions_page_shows_a_diff_and_offers_rollback_to_operators_only(moved):
    viewer = signed_in(b.user("viewer")).get(f"/models/{MODEL}/profiles/h100/revisions/").content.decode()
    assert (
        "Roll back to revision 1" not in viewer and 'class="changed"' in viewer and "--max-num-seqs" in viewer
    )
    operator = signed_in(b.user("operator", "catalog.resize_model", "catalog.restart_model"))
    page = operator.get(f"/models/{MODEL}/profiles/h100/revisions/").content.decode()
    assert "Roll back to revision 1" in page and "History" not in page  # the log is the leads'
    lead = signed_in(b.user("lead", "audit.view_auditentry"))
    panel = lead.get(f"/models/{MODEL}/profiles/h100/revisions/").content.decode()
    assert "History" in panel and f"{MODEL}/h100: arguments none → --max-num-seqs 8" in panel
    response = operator.post(f"/models/{MODEL}/profiles/h100/rollback/", {"revision": "1"})
    op = RestartOperation.objects.get()
    assert response.status_code == 303 and response["Location"] == f"/operations/{op.pk}/"
    assert AuditEntry.objects.get(action="rollback").via == "ui"
    refused = operator.post(f"/models/{MODEL}/profiles/h100/rollback/", {"revision": "2"})
    assert refused["Location"] == f"/models/{MODEL}/profiles/h100/revisions/"
    said = operator.get(refused["Location"]).content.decode()
    assert f"Restart #{op.pk} of {MODEL} is queued" in said and Profile.objects.get().revision == 3
    assert (
        signed_in(b.user("viewer2"))
        .post(f"/models/{MODEL}/profiles/h100/rollback/", {"revision": "1"})
        .status_code
        == 403
    )


def test_a_failed_restart_says_on_its_page_how_to_roll_back_with_the_button(moved):
    with acting_as(Actor(via="cli", name="pytest")):
        from operations.services.start import restart_start

        op = restart_start(model_name=MODEL)
    RestartOperation.objects.filter(pk=op.pk).update(state=RestartOperation.State.FAILED)
    operator = signed_in(b.user("operator", "catalog.resize_model", "catalog.restart_model"))
    page = operator.get(f"/operations/{op.pk}/").content.decode()
    assert "How to roll back" in page and "its replicas still run revision 1" in page
    assert "Roll back h100 to revision 1" in page
    viewer = signed_in(b.user("viewer")).get(f"/operations/{op.pk}/").content.decode()
    assert "How to roll back" in viewer and "manage.py rollback" in viewer and "Roll back h100" not in viewer
