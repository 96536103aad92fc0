"""A profile's revisions from the audit log, their diff, and rollback as an operation (service, API, command, page)."""

from __future__ import annotations

import html
import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from audit.summary import summarize
from base.actor import Actor, acting_as
from base.errors import DomainError
from catalog.models import Profile, Replica, ServedModel
from catalog.services import catalog as services
from operations.models import RestartOperation, RestartStep
from operations.services.rollback import profile_rollback, revisions
from operations.services.runner import run_operation
from operations.services.start import restart_start
from tests.support import builders as b
from tests.support.restart import MODEL, fleet_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # On PostgreSQL the whole suite logs in as the application's role (tests/support/db_roles.py); app_role checks
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


@pytest.fixture
def split(moved):
    """llama-1 still at revision 1, llama-2 started at revision 2: a rollback to 1 adopts one and
    restarts the other."""
    moved.start("llama-2", "gpu-a", [1])
    return moved


def on_agent(fleet, name: str) -> tuple[int, str]:
    """The pid and start time the agent reports for replica ``name``: the same pair means not restarted."""
    with fleet.agents["gpu-a"].client() as http:
        state = http.get(f"/v1/replicas/{name}").json()
    return state["pid"], state["started_at"]


def test_the_revisions_come_from_the_audit_log_newest_first(moved):
    profile = Profile.objects.get()
    found = revisions(profile)
    assert [r.number for r in found] == [2, 1]
    assert found[0].settings["args"] == ["--max-num-seqs", "8"] and found[1].settings["args"] == []


def test_a_rollback_saves_the_old_settings_as_a_new_revision_and_adopts_the_replica_that_runs_them(moved):
    was = on_agent(moved, "llama-1")
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
    # llama-1 runs revision 1's settings: it is current without a restart, and the log says why.
    assert done.operation is None and not RestartOperation.objects.exists()
    assert [(a.replica, a.runs) for a in done.adopted] == [("llama-1", 1)] and done.restarted == ()
    assert Replica.objects.get(name="llama-1").revision == 3
    adopt = AuditEntry.objects.get(action="adopt", object_key="llama-1")
    assert adopt.message == (
        f"{MODEL}/h100: replica llama-1 adopted revision 3 without a restart: it runs revision 1's settings, "
        "the same"
    )
    assert (adopt.before["revision"], adopt.after["revision"], adopt.txid) == (1, 3, entry.txid)
    assert summarize(adopt) == adopt.message
    assert on_agent(moved, "llama-1") == was


def test_a_rollback_restarts_only_the_replicas_that_run_other_settings(split):
    with acting_as(Actor(via="cli", name="pytest")):
        done = profile_rollback(model=MODEL, profile="h100", revision=1)
    assert [a.replica for a in done.adopted] == ["llama-1"]
    (restarted,) = done.restarted
    assert (restarted.replica, restarted.runs) == ("llama-2", 2)
    assert "revision 2's settings, which differ in arguments" in restarted.why
    op = RestartOperation.objects.get(pk=done.operation)
    assert [s.old_replica.name for s in op.steps.all()] == ["llama-2"]
    assert op.cause == f"rollback of {MODEL}/h100 to revision 1's settings (revision 2 → 3)"
    step = op.steps.get()
    assert (restarted.node, list(restarted.cards), restarted.in_place) == (
        step.planned_node,
        step.planned_cards,
        step.planned_in_place,
    ) and restarted.node == "gpu-a"
    assert AuditEntry.objects.filter(action="restart_start", object_key=str(op.pk)).exists()
    assert list(Replica.objects.order_by("name").values_list("name", "revision")) == [
        ("llama-1", 3),
        ("llama-2", 2),
    ]


def test_a_replica_whose_revision_the_log_does_not_hold_is_restarted_not_guessed(moved):
    # Revision numbers moved behind the application's back: the log holds no revision 4 of the profile.
    Profile.objects.update(revision=5)
    Replica.objects.filter(name="llama-1").update(revision=4)
    with acting_as(Actor(via="cli", name="pytest")):
        done = profile_rollback(model=MODEL, profile="h100", revision=1)
    assert done.adopted == () and [r.replica for r in done.restarted] == ["llama-1"]
    assert "the audit log holds no entry for revision 4" in done.restarted[0].why
    assert "not guessed" in done.restarted[0].why


def test_a_replica_is_restarted_when_the_models_source_changed_since_its_revision(moved):
    model = ServedModel.objects.get(name=MODEL)
    was = model.source
    model.source = "meta-llama/Llama-3.1-8B"
    with acting_as(Actor(via="cli", name="pytest")):
        services.model_save(instance=model)
        done = profile_rollback(model=MODEL, profile="h100", revision=1)
    assert done.adopted == ()
    assert f"the model's source was {was} when revision 1 was saved and is meta-llama/Llama-3.1-8B" in (
        done.restarted[0].why
    )


def test_a_replica_a_restart_started_is_adopted_only_when_its_spec_is_the_restored_ones(moved):
    """Started by a restart, the replica's spec is on record: it must equal what the restored
    settings launch now, which covers what the serving fields do not (source, launch policy)."""
    with acting_as(Actor(via="cli", name="pytest")):
        first = restart_start(model_name=MODEL)
    assert run_operation(first.pk) == "succeeded"
    (new,) = Replica.objects.filter(state__in=Replica.LIVE_STATES, revision=2)
    moved.change_profile(args=["--max-num-seqs", "4"])  # revision 3
    with acting_as(Actor(via="cli", name="pytest")):
        assert [
            a.replica for a in profile_rollback(model=MODEL, profile="h100", revision=2, dry_run=True).adopted
        ] == [new.name]
    step = RestartStep.objects.get(new_replica=new)
    # As if the launch policy had written other arguments when it was started.
    RestartStep.objects.filter(pk=step.pk).update(
        spec={**step.spec, "args": [*step.spec["args"], "--seed", "1"]}
    )
    with acting_as(Actor(via="cli", name="pytest")):
        done = profile_rollback(model=MODEL, profile="h100", revision=2, dry_run=True)
    assert done.adopted == () and [r.replica for r in done.restarted] == [new.name]
    assert "the command it was started with differs" in done.restarted[0].why
    assert "arguments" in done.restarted[0].why


def test_a_rollback_whose_restart_has_no_place_is_refused_in_its_dry_run_and_saves_nothing(tmp_path):
    """Revision 2 ran two cards, and llama-1 still does on cards 0 and 1 (it would be adopted); llama-2
    runs revision 3 on card 2, the last: restarted onto two cards it has no place, and the dry run says
    so as the rollback itself does, placing every replica through the restart's own plan."""
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=3) as fleet:
        fleet.change_profile(gpus_per_node=2, tp=2)
        fleet.start("llama-1", "gpu-a", [0, 1])
        fleet.change_profile(gpus_per_node=1, tp=1)
        fleet.start("llama-2", "gpu-a", [2])
        before = AuditEntry.objects.count()
        with acting_as(Actor(via="cli", name="pytest")):
            for dry_run in (True, False):
                with pytest.raises(DomainError) as err:
                    profile_rollback(model=MODEL, profile="h100", revision=2, dry_run=dry_run)
                assert err.value.code in ("no_room", "no_room_beside"), err.value.message
                assert "llama-2" in err.value.message
        assert AuditEntry.objects.count() == before and not RestartOperation.objects.exists()
        assert Profile.objects.get().revision == 3
        assert list(Replica.objects.order_by("name").values_list("revision", flat=True)) == [2, 3]


def test_a_dry_run_and_every_refusal_change_nothing_and_write_nothing(split):
    before = AuditEntry.objects.count()
    with acting_as(Actor(via="cli", name="pytest")):
        planned = profile_rollback(model=MODEL, profile="h100", revision=1, dry_run=True)
        assert planned.new_revision == 3
        assert [a.replica for a in planned.adopted] == ["llama-1"]
        assert [r.replica for r in planned.restarted] == ["llama-2"] and planned.restarted[0].node == "gpu-a"
        assert AuditEntry.objects.count() == before and not RestartOperation.objects.exists()
        assert Replica.objects.get(name="llama-1").revision == 1
        for kwargs, code in (
            ({"revision": 7}, "not_found"),
            ({"revision": 2}, "unchanged"),
            ({"revision": 1, "profile": "nope"}, "not_found"),
        ):
            with pytest.raises(DomainError) as err:
                profile_rollback(model=MODEL, **{"profile": "h100", **kwargs})
            assert err.value.code == code, err.value.message
        done = profile_rollback(model=MODEL, profile="h100", revision=1)
        assert [
            (s.old_replica.name, s.planned_node, s.planned_cards)
            for s in RestartOperation.objects.get(pk=done.operation).steps.all()
        ] == [(r.replica, r.node, list(r.cards)) for r in planned.restarted]
        after_first = AuditEntry.objects.count()
        with pytest.raises(DomainError) as err:  # its restart is queued: the busy check, as for a resize
            profile_rollback(model=MODEL, profile="h100", revision=2)
        assert err.value.code == "busy"
    assert Profile.objects.get().revision == 3
    assert after_first > before and AuditEntry.objects.count() == after_first


def test_the_api_rolls_back_for_an_operator_and_refuses_a_viewer(split):
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
    planned = api.post(
        f"/api/models/{MODEL}/rollback/", {"profile": "h100", "revision": 1, "dry_run": True}, format="json"
    ).json()
    assert planned["operation"] is None and planned["adopted"] == [{"replica": "llama-1", "runs": 1}]
    (restarted,) = planned["restarted"]
    assert (restarted["replica"], restarted["runs"], restarted["node"]) == ("llama-2", 2, "gpu-a")
    assert restarted["ranks"] == []  # on one node: node and cards say where
    assert "differ in arguments" in restarted["why"] and not RestartOperation.objects.exists()
    response = api.post(f"/api/models/{MODEL}/rollback/", {"profile": "h100", "revision": 1}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["new_revision"] == 3 and response.json()["operation"]
    assert (
        response.json()["adopted"] == planned["adopted"]
        and response.json()["restarted"] == planned["restarted"]
    )
    assert AuditEntry.objects.get(action="rollback").via == "api"
    assert AuditEntry.objects.get(action="adopt").via == "api"
    response = api.post(
        f"/api/models/{MODEL}/rollback/", {"profile": "h100", "revision": "one"}, format="json"
    )
    assert response.status_code == 400


def test_the_command_rolls_back_says_which_replicas_adopt_and_exits_1_when_refused(split):
    b.user("deployer")
    out = io.StringIO()
    call_command("rollback", MODEL, "1", "--profile", "h100", "--dry-run", "--as", "deployer", stdout=out)
    said = out.getvalue()
    assert "would roll" in said and "revision 2 → 3" in said and not RestartOperation.objects.exists()
    assert "llama-1: adopts revision 3 without a restart (it runs revision 1's settings, the same)" in said
    assert "llama-2: restarted on gpu-a card(s) 0" in said or "llama-2: restarted on gpu-a" in said
    out = io.StringIO()
    call_command("rollback", MODEL, "1", "--profile", "h100", "--no-wait", "--as", "deployer", stdout=out)
    assert "rolled" in out.getvalue() and "revision 2 → 3" in out.getvalue()
    assert "restarting: operation #" in out.getvalue()
    assert AuditEntry.objects.get(action="rollback").via == "cli"
    with pytest.raises(CommandError) as err:
        call_command("rollback", MODEL, "9", "--profile", "h100", "--as", "deployer", stdout=io.StringIO())
    assert err.value.returncode == 1 and "no revision 9" in str(err.value)


def test_the_revisions_page_shows_a_diff_and_offers_rollback_to_operators_only(split):
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
    # The button shows the dry run first: who adopts, who is restarted and where, nothing saved.
    preview = operator.get(f"/models/{MODEL}/profiles/h100/rollback/?revision=1").content.decode()
    assert 'class="adopted"><td>llama-1</td><td>1</td>' in preview and "no restart" in preview
    assert (
        'class="restarted"><td>llama-2</td><td>2</td>' in preview and "restarted</span> on gpu-a" in preview
    )
    assert "Roll back to revision 1 now" in preview and not RestartOperation.objects.exists()
    assert "Revision 2 (now)" in preview and 'class="changed"' in preview  # what goes back, side by side
    assert Profile.objects.get().revision == 2
    assert (
        signed_in(b.user("viewer3")).get(f"/models/{MODEL}/profiles/h100/rollback/?revision=1").status_code
        == 403
    )
    response = operator.post(f"/models/{MODEL}/profiles/h100/rollback/", {"revision": "1"})
    op = RestartOperation.objects.get()
    assert response.status_code == 303 and response["Location"] == f"/operations/{op.pk}/"
    assert AuditEntry.objects.get(action="rollback").via == "ui"
    # A diff between any two: revision 3 runs revision 1's settings again, and revision 2's differ.
    same = operator.get(f"/models/{MODEL}/profiles/h100/revisions/", {"a": 1, "b": 3}).context["diff"]
    assert same and not any(row.changed for row in same)
    other = operator.get(f"/models/{MODEL}/profiles/h100/revisions/", {"a": 2, "b": 3}).context["diff"]
    assert [row.field for row in other if row.changed] == ["args"]
    refused = operator.post(f"/models/{MODEL}/profiles/h100/rollback/", {"revision": "2"})
    assert refused["Location"] == f"/models/{MODEL}/profiles/h100/revisions/"
    said = operator.get(refused["Location"]).content.decode()
    assert f"Restart #{op.pk} of {MODEL} is queued" in said and Profile.objects.get().revision == 3
    busy = operator.get(f"/models/{MODEL}/profiles/h100/rollback/?revision=2").content.decode()
    assert f"Restart #{op.pk} of {MODEL} is queued" in busy and "now</button>" not in busy
    assert (
        signed_in(b.user("viewer2"))
        .post(f"/models/{MODEL}/profiles/h100/rollback/", {"revision": "1"})
        .status_code
        == 403
    )


def test_a_failed_restart_says_on_its_page_how_to_roll_back_with_the_button(moved):
    with acting_as(Actor(via="cli", name="pytest")):
        op = restart_start(model_name=MODEL)
    RestartOperation.objects.filter(pk=op.pk).update(state=RestartOperation.State.FAILED)
    operator = signed_in(b.user("operator", "catalog.resize_model", "catalog.restart_model"))
    page = operator.get(f"/operations/{op.pk}/").content.decode()
    assert "How to roll back" in page and "its replicas still run revision 1" in page
    assert "take it without a restart" in page
    assert "Roll back h100 to revision 1" in page
    assert f'action="/models/{MODEL}/profiles/h100/rollback/"' in page
    viewer = signed_in(b.user("viewer")).get(f"/operations/{op.pk}/").content.decode()
    assert "How to roll back" in viewer and "manage.py rollback" in viewer and "Roll back h100" not in viewer
    # Rolled back (llama-1 adopts revision 3 as it runs), the page no longer offers it.
    operator.post(f"/models/{MODEL}/profiles/h100/rollback/", {"revision": "1"})
    assert Replica.objects.get(name="llama-1").revision == Profile.objects.get().revision == 3
    assert "How to roll back" not in operator.get(f"/operations/{op.pk}/").content.decode()


SECRET_NOW = "hf_" + "n" * 32
SECRET_THEN = "hf_" + "o" * 32


@pytest.fixture
def secret_changed(tmp_path):
    """Revision 1 ran one Hub token, revision 2 runs another (and more sequences): the log holds only the
    first token's fingerprint."""
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2, env={"HF_TOKEN": SECRET_THEN}) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(env={**fleet.profile.env, "HF_TOKEN": SECRET_NOW}, args=["--max-num-seqs", "8"])
        yield fleet


def refused_for_the_secret(sentence: str) -> None:
    assert "HF_TOKEN is a secret, which the audit log keeps only as its fingerprint" in sentence
    assert "Set HF_TOKEN again to revision 1's value" in sentence and "then roll back" in sentence
    assert "PATCH /api/profiles/" in sentence and "admin" in sentence
    assert SECRET_NOW not in sentence and "hf_ooo" not in sentence


def test_a_secret_changed_since_the_revision_is_refused_saying_how_to_proceed_on_every_path(secret_changed):
    before = AuditEntry.objects.count()
    api = APIClient()
    api.force_authenticate(b.user("operator", "catalog.resize_model", "catalog.restart_model"))
    response = api.post(f"/api/models/{MODEL}/rollback/", {"profile": "h100", "revision": 1}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "secret_unknown"
    refused_for_the_secret(response.json()["detail"])
    with pytest.raises(CommandError) as err:
        call_command("rollback", MODEL, "1", "--profile", "h100", "--as", "operator", stdout=io.StringIO())
    assert err.value.returncode == 1
    refused_for_the_secret(str(err.value))
    operator = signed_in(get_user_model().objects.get(username="operator"))
    preview = operator.get(f"/models/{MODEL}/profiles/h100/rollback/?revision=1").content.decode()
    refused_for_the_secret(html.unescape(preview))
    response = operator.post(f"/models/{MODEL}/profiles/h100/rollback/", {"revision": "1"})
    refused_for_the_secret(html.unescape(operator.get(response["Location"]).content.decode()))
    assert AuditEntry.objects.count() == before and Profile.objects.get().revision == 2
    assert Profile.objects.get().env["HF_TOKEN"] == SECRET_NOW
    # The way on the sentence gives: set the secret again through the API, then roll back.
    profile = Profile.objects.get()
    editor = APIClient()
    editor.force_authenticate(b.user("editor", "catalog.change_profile", "catalog.view_profile"))
    set_again = editor.patch(
        f"/api/profiles/{profile.pk}/", {"env": {**profile.env, "HF_TOKEN": SECRET_THEN}}, format="json"
    )
    assert set_again.status_code == 200, set_again.content
    assert Profile.objects.get().revision == 3
    response = api.post(f"/api/models/{MODEL}/rollback/", {"profile": "h100", "revision": 1}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["new_revision"] == 4 and response.json()["adopted"] == [
        {"replica": "llama-1", "runs": 1}
    ]
    assert (Profile.objects.get().env["HF_TOKEN"], Profile.objects.get().args) == (SECRET_THEN, [])


def test_a_secret_the_log_holds_by_either_fingerprint_is_restored_as_the_value_it_stands_for():
    """Entries written before fingerprints were keyed hold the plain form (``sha256:``); a rollback to such
    a revision still knows the value behind it, as it does behind a keyed one."""
    from types import SimpleNamespace

    from base.secrets import fingerprint, plain_fingerprint
    from operations.services.rollback import _restore_env

    profile = SimpleNamespace(env={"HF_TOKEN": SECRET_NOW}, pk=1)
    for logged in (fingerprint(SECRET_NOW), plain_fingerprint(SECRET_NOW)):
        assert _restore_env(profile, {"HF_TOKEN": logged, "HF_HUB_OFFLINE": "1"}, 1) == {
            "HF_TOKEN": SECRET_NOW,
            "HF_HUB_OFFLINE": "1",
        }
