"""Answers kept under the fleet's versions (versions/cache.py) are never stale: for each kept page
and endpoint, a second request is answered from what was kept (fewer queries), and a write
through a service, or by raw SQL behind the application's back, changes the next answer. Readers
of different roles share the kept parts and never see each other's page around them.

Transactional tests: nothing is kept, nor given, inside a transaction (as pytest-django's ``db``
runs each test), since there a reader may see its own uncommitted writes."""

from __future__ import annotations

import json
import re
import time

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEntry
from base.actor import Actor, acting_as
from catalog.models import Card, Node, Profile, Shard
from catalog.services import catalog as services
from tests.support import builders as b
from web.node_grid import SEEN_WITHIN_SECONDS

LOG = AuditEntry._meta.db_table

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("audit_flushable")]


def sql(statement: str, params: list | None = None) -> None:
    """A write behind the application's back, committed."""
    with transaction.atomic(), connection.cursor() as c:
        c.execute(statement, params or [])


@pytest.fixture
def fleet() -> dict:
    cls = b.gpu_class()
    nodes = [b.node(f"gpu-{i}", cls=cls, cards=4) for i in range(3)]
    model = b.llama_8b("llama")
    profile = b.profile(model, "one")
    replica = b.replica(profile, nodes[0], [0], name="llama-1")
    return {"nodes": nodes, "model": model, "profile": profile, "replica": replica}


def client(role: str = "viewer", *perms: str) -> Client:
    c = Client()
    c.force_login(b.user(role, *perms, roles=(role,)))
    return c


def get(c: Client, url: str, **headers) -> tuple[str, int]:
    """The page or answer, and the queries it took."""
    with CaptureQueriesContext(connection) as ctx:
        response = c.get(url, **headers)
    assert response.status_code == 200, response.content[:300]
    return response.content.decode(), len(ctx.captured_queries)


def kept(c: Client, url: str, **headers) -> str:
    """Asked twice: the second from what was kept (fewer queries, the same answer). The pair is
    asked within one of the nodes pages' 10 s clock ticks (web/node_grid.py, SEEN_WITHIN_SECONDS),
    which are part of their keys: too close to the next, it waits for it to begin."""
    left = SEEN_WITHIN_SECONDS - time.time() % SEEN_WITHIN_SECONDS
    if left < 2:
        time.sleep(left + 0.05)
    first, cold = get(c, url, **headers)
    second, warm = get(c, url, **headers)
    assert warm < cold and unmasked(second) == unmasked(first)
    return first


def unmasked(page: str) -> str:
    """The page without its CSRF tokens, which are masked anew at every request."""
    return re.sub(r'("X-CSRFToken": "|name="csrfmiddlewaretoken" value=")[^"]+', r"\1", page)


# -- the nodes page -----------------------------------------------------------------------------------------


def test_the_nodes_page_is_kept_until_a_card_is_taken_through_a_service(fleet):
    viewer = client()
    page = kept(viewer, "/nodes/")
    assert "12 cards, 11 free" in page and page.count('class="card free') == 11
    with acting_as(Actor(via="cli", name="pytest")):
        services.replica_delete(instance=fleet["replica"])
    page = kept(viewer, "/nodes/")
    assert "12 cards, 12 free" in page and page.count('class="card free') == 12


def test_the_nodes_page_changes_with_a_write_by_raw_sql(fleet):
    viewer = client()
    assert "gpu-9" not in kept(viewer, "/nodes/")
    sql("UPDATE catalog_node SET name = 'gpu-9' WHERE name = 'gpu-2'")
    page = kept(viewer, "/nodes/")
    assert "gpu-9" in page and 'href="/nodes/gpu-2/"' not in page


def test_the_nodes_grid_changes_with_the_cards_telemetry(fleet):
    viewer = client()
    assert "foreign process" not in kept(viewer, "/nodes/?name=gpu-1")
    card = Card.objects.get(node__name="gpu-1", index=2)
    sql(
        "INSERT INTO telemetry_cardreading (card_id, at, memory_used_mib, memory_total_mib, foreign_mib, "
        "processes) VALUES (%s, CURRENT_TIMESTAMP, 4096, 81559, 4096, '[]')",
        [card.pk],
    )
    assert "foreign process: 4.0 GiB" in kept(viewer, "/nodes/?name=gpu-1")


def queries_of(c: Client, url: str) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        assert c.get(url).status_code == 200
    return [q["sql"] for q in ctx.captured_queries]


def reading(card: Card, used: int) -> None:
    sql(
        "INSERT INTO telemetry_cardreading (card_id, at, memory_used_mib, memory_total_mib, foreign_mib, "
        "processes) VALUES (%s, CURRENT_TIMESTAMP, %s, 81559, 0, '[]') "
        "ON CONFLICT (card_id) DO UPDATE SET memory_used_mib = EXCLUDED.memory_used_mib",
        [card.pk, used],
    )


@pytest.mark.parametrize("url", ["/nodes/", "/nodes/?view=compact", "/nodes/gpu-0/"])
def test_a_reading_recomputes_only_the_readings_and_a_replica_only_the_grid(fleet, url):
    """The grid (the structure and the replicas) and its readings are kept apart: a reading
    written reads the readings again (three queries, the compact view's two) and not the grid; a replica's state changed
    reads the grid again and not the readings."""
    viewer = client()
    card = Card.objects.get(node__name="gpu-0", index=1)
    reading(card, 1024)
    queries_of(viewer, url)
    warm = queries_of(viewer, url)
    reading(card, 2048)
    after_reading = queries_of(viewer, url)
    # The readings: each card's, each node's and which nodes' agents are not answering; compact,
    # only the cards a foreign process holds and the nodes not answering. The nodes page's summary
    # reads its own: the cards foreign processes hold, and the nodes not answering.
    grid_readings = 2 if "compact" in url else 3
    summary_readings = 2 if url.startswith("/nodes/?") or url == "/nodes/" else 0
    assert len(after_reading) == len(warm) + grid_readings + summary_readings, after_reading
    assert not [q for q in after_reading if "catalog_card" in q and "telemetry" not in q]
    if "compact" not in url:
        assert "used 2.0 of 79.6 GiB" in viewer.get(url).content.decode()
    sql("UPDATE catalog_replica SET state = 'loading'")
    after_replica = queries_of(viewer, url)
    # The compact view, which shows no state, is kept under no version of the replicas' states.
    assert len(after_replica) == len(warm) if "compact" in url else len(after_replica) > len(warm)
    # (a node's page reads its node, with its agent's last answer for the head's badge, at every
    # request, kept or not)
    per_request = 'WHERE "catalog_node"."name"'
    assert not [q for q in after_replica if "telemetry_" in q and per_request not in q], after_replica
    if "compact" not in url:  # the compact view says which model holds a card, not its replica's state
        assert "loading" in viewer.get(url).content.decode()
    assert len(queries_of(viewer, url)) == len(warm)


def test_the_readings_say_how_long_ago_without_the_grid_drawn_again(fleet, settings):
    """ "seen ... ago" is drawn at each request from the kept reading: the clock never throws the
    grid away."""
    from datetime import timedelta

    from django.utils import timezone

    viewer = client()
    sql(
        "INSERT INTO telemetry_nodereading (node_id, asked_at, seen_at, error, source) "
        "VALUES (%s, %s, %s, '', '')",
        [fleet["nodes"][0].pk, timezone.now(), timezone.now() - timedelta(minutes=3)],
    )
    page = kept(viewer, "/nodes/")
    assert "agent seen 3\xa0minutes ago" in page


def test_the_nodes_results_are_kept_per_query_in_any_order(fleet):
    viewer = client()
    one = kept(viewer, "/nodes/?state=ready&name=gpu", HTTP_HX_REQUEST="true")
    other, queries = get(viewer, "/nodes/?name=gpu&state=ready", HTTP_HX_REQUEST="true")
    # The session, the user, the versions: the viewer's permissions are kept too (base/rules.py).
    assert other == one and queries == 3
    assert "3 nodes match" in one
    assert "1 node match" in kept(viewer, "/nodes/?name=gpu-1", HTTP_HX_REQUEST="true")


def test_readers_of_two_roles_share_the_kept_grid_but_not_the_page_around_it(fleet):
    viewer, admin = client("viewer"), client("admin")
    seen_by_viewer = kept(viewer, "/nodes/")
    seen_by_admin, queries = get(admin, "/nodes/")
    grid = seen_by_viewer.split('<div id="node-results"')[1]
    assert seen_by_admin.split('<div id="node-results"')[1] == grid  # kept once, given to both
    assert "Signed in as <strong>viewer</strong>" in seen_by_viewer and "admin</strong>" not in seen_by_viewer
    assert "Signed in as <strong>admin</strong>" in seen_by_admin and "viewer</strong>" not in seen_by_admin
    assert 'href="/admin/"' in seen_by_admin and 'href="/admin/"' not in seen_by_viewer
    token = seen_by_viewer.split('"X-CSRFToken": "')[1].split('"')[0]
    assert token not in seen_by_admin


def test_a_kept_page_is_still_refused_to_who_may_not_read_it(fleet):
    kept(client(), "/nodes/")
    nobody = Client()
    nobody.force_login(b.user("nobody", roles=()))
    assert nobody.get("/nodes/").status_code == 403
    assert Client().get("/nodes/").status_code == 302  # to the sign-in page
    assert Client().get("/api/nodes/").status_code == 401


# -- the models list ----------------------------------------------------------------------------------------


def test_the_models_list_changes_with_a_service_write_and_a_raw_one(fleet):
    viewer = client()
    page = kept(viewer, "/")
    assert "1 model" in page and "llama-2" not in page
    with acting_as(Actor(via="cli", name="pytest")):
        services.model_save(instance=_model("llama-2"))
    assert "llama-2" in kept(viewer, "/")
    sql("UPDATE catalog_profile SET engine = 'sglang'")
    assert "one · sglang ·" in kept(viewer, "/?engine=sglang")


def _model(name: str):
    from catalog.models import ServedModel

    template = ServedModel.objects.get(name="llama")
    template.pk, template.name = None, name
    return template


# -- the catalog's list endpoints ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "statement", "seen"),
    [
        ("/api/models/", "UPDATE catalog_model SET source = 'org/changed'", "org/changed"),
        ("/api/profiles/", "UPDATE catalog_profile SET engine = 'sglang'", '"engine":"sglang"'),
        ("/api/replicas/", "UPDATE catalog_replica SET state = 'failed'", '"state":"failed"'),
        ("/api/nodes/", "UPDATE catalog_node SET state = 'cordoned' WHERE name = 'gpu-1'", '"cordoned"'),
        (
            "/api/nodes/",
            "INSERT INTO operations_agentcontact (node_id, last_seen_at) "
            "SELECT id, '2026-01-02 03:04:05+00' FROM catalog_node",
            "2026-01-02T03:04:05",
        ),
    ],
)
def test_a_catalog_list_changes_with_a_write_by_raw_sql(fleet, url, statement, seen):
    viewer = client()
    assert seen not in kept(viewer, url).replace(" ", "")
    sql(statement)
    assert seen in kept(viewer, url).replace(" ", "")


def test_a_catalog_list_changes_with_a_write_through_the_api(fleet):
    editor = client("editor")
    before = json.loads(kept(editor, "/api/profiles/"))
    response = editor.patch(
        f"/api/profiles/{fleet['profile'].pk}/",
        {"args": ["--max-num-seqs", "64"]},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    after = json.loads(kept(editor, "/api/profiles/"))
    assert before["results"][0]["args"] == [] and after["results"][0]["args"] == ["--max-num-seqs", "64"]


def test_a_kept_list_is_kept_per_query_and_host(fleet, settings):
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "other.example"]
    viewer = client()
    both = json.loads(kept(viewer, "/api/nodes/?limit=2"))
    assert len(both["results"]) == 2 and both["next"].startswith("http://testserver/")
    other = json.loads(get(viewer, "/api/nodes/?limit=2", HTTP_HOST="other.example")[0])
    assert other["next"].startswith("http://other.example/")
    assert viewer.get("/api/nodes/?nope=1").status_code == 400  # a refusal is not kept: asked again, again
    assert viewer.get("/api/nodes/?nope=1").status_code == 400


# -- the dry runs and the preview ---------------------------------------------------------------------------


def dry_run(c: Client, gpus: int = 4) -> dict:
    response = c.post(
        "/api/models/llama/gpus/",
        {"gpus": gpus, "profile": "one", "dry_run": True},
        content_type="application/json",
    )
    return {"status": response.status_code, **response.json()}


def test_a_kept_dry_run_after_a_card_is_taken_says_what_the_fleet_now_says(fleet):
    operator = client("operator")
    first = dry_run(operator)
    with CaptureQueriesContext(connection) as warm:
        assert dry_run(operator) == first
    # The session, the user, the versions (for its kept permissions, then again for the kept dry run,
    # which the service asks without the request), the cards a foreign process holds; and the user's
    # API rate count in the shared "throttle" cache (six, tests/web/test_fleet_scale.py).
    assert len(warm.captured_queries) == 5 + 6
    assert first["status"] == 200 and first["room"]["beside_count"] == 2  # gpu-1 and gpu-2 have 4 free
    other = Profile.objects.get(name="one")
    b.replica(other, Node.objects.get(name="gpu-1"), [0], name="other-1")  # a card taken (the ORM)
    assert dry_run(operator)["room"]["beside"] == ["gpu-2"]
    sql(  # and one by raw SQL: gpu-2's last card
        "INSERT INTO catalog_shard (replica_id, card_id) SELECT r.id, c.id FROM catalog_replica r, catalog_card c "
        "JOIN catalog_node n ON n.id = c.node_id WHERE r.name = 'other-1' AND n.name = 'gpu-2' "
        'AND c."index" = 3'
    )
    answer = dry_run(operator)
    assert answer["status"] == 409 and answer["code"] == "no_room_beside", answer


def test_a_dry_run_after_a_replicas_state_or_a_models_edit_reads_no_card_again(fleet):
    """The fleet's cards every change plans on (operations/selectors.py, ``fleet_cards``) are kept under
    the fleet's and the placement's versions alone: a replica's state or a model's edit plans the
    change anew on them, reading neither the nodes nor the cards; a card cordoned behind the
    application's back is read again, and planned on."""
    operator = client("operator")
    first = dry_run(operator)
    assert first["room"]["beside"] == ["gpu-1", "gpu-2"]

    def tables_read() -> set[str]:
        with CaptureQueriesContext(connection) as ctx:
            answer = dry_run(operator)
        assert answer["room"] == first["room"]
        return {
            t for q in ctx.captured_queries for t in ("catalog_card", "catalog_node") if f'"{t}"' in q["sql"]
        }

    sql("UPDATE catalog_replica SET state = 'loading' WHERE name = 'llama-1'")
    assert tables_read() == set()  # planned again (the replicas' version moved), on the kept cards
    sql("UPDATE catalog_model SET source = source || '~' WHERE name = 'llama'")
    assert tables_read() == set()
    sql(
        'UPDATE catalog_card SET cordoned = true WHERE "index" = 1 '
        "AND node_id = (SELECT id FROM catalog_node WHERE name = 'gpu-2')"
    )
    assert dry_run(operator)["room"]["beside"] == ["gpu-1"]


def test_a_kept_dry_run_sees_a_foreign_process_and_its_reading_grow_old(fleet, settings):
    operator = client("operator")
    assert dry_run(operator)["room"]["beside_count"] == 2
    card = Card.objects.get(node__name="gpu-2", index=1)
    sql(
        "INSERT INTO telemetry_cardreading (card_id, at, memory_used_mib, memory_total_mib, foreign_mib, "
        "processes) VALUES (%s, CURRENT_TIMESTAMP, 4096, 81559, 4096, '[]')",
        [card.pk],
    )
    assert dry_run(operator)["room"]["beside"] == ["gpu-1"]
    settings.LLMGW_TELEMETRY_STALE_SECONDS = 0  # the reading no longer counts: no write, only the clock
    assert dry_run(operator)["room"]["beside_count"] == 2


def test_a_kept_dry_run_says_busy_once_a_restart_is_under_way(fleet):
    operator = client("operator")
    assert dry_run(operator, gpus=2)["status"] == 200
    from operations.models import RestartOperation

    with acting_as(Actor(via="cli", name="pytest")), transaction.atomic():
        RestartOperation.objects.create(model=fleet["model"], profile=fleet["profile"], state="queued")
    answer = dry_run(operator, gpus=2)
    assert answer["status"] == 409 and answer["code"] == "busy"


def test_the_resize_preview_is_answered_from_the_kept_dry_run(fleet):
    operator = client("operator")

    def preview() -> str:
        response = operator.post(
            "/models/llama/resize/preview/", {"gpus": "4", "profile": "one"}, HTTP_HX_REQUEST="true"
        )
        assert response.status_code == 200
        return response.content.decode()

    assert "gpu-1" in preview()
    Shard.objects.filter(card__node__name__in=["gpu-1", "gpu-2"]).delete()
    sql("UPDATE catalog_node SET state = 'down' WHERE name IN ('gpu-1', 'gpu-2')")
    assert "gpu-1" not in preview()


# -- the operations -----------------------------------------------------------------------------------------


def test_the_operations_list_and_api_change_with_a_write(fleet):
    from operations.models import RestartOperation

    RestartOperation.objects.create(
        model=fleet["model"], profile=fleet["profile"], state="succeeded", reason="first"
    )
    viewer = client()
    assert "first" in kept(viewer, "/operations/") and '"first"' in kept(viewer, "/api/operations/")
    sql(f"UPDATE {RestartOperation._meta.db_table} SET reason = 'second'")
    assert "second" in kept(viewer, "/operations/") and '"second"' in kept(viewer, "/api/operations/")


def test_an_active_restart_is_never_kept_since_its_abandoned_line_reads_the_clock(fleet):
    from operations.models import RestartOperation

    RestartOperation.objects.create(model=fleet["model"], profile=fleet["profile"], state="queued")
    viewer = client()
    for url in ("/operations/", "/api/operations/"):
        get(viewer, url)  # the viewer's permissions kept: what follows differs only in what the page keeps
        _, cold = get(viewer, url)
        _, again = get(viewer, url)
        assert again == cold


# -- the model page -----------------------------------------------------------------------------------------


def test_the_model_page_keeps_its_replicas_and_profiles_until_they_change(fleet):
    viewer = client()
    page = kept(viewer, "/models/llama/")
    assert 'href="/replicas/llama-1/"' in page and "revision 1" in page
    sql("UPDATE catalog_replica SET state = 'failed' WHERE name = 'llama-1'")
    assert '<tr class="replica state-failed">' in kept(viewer, "/models/llama/")
    with acting_as(Actor(via="cli", name="pytest")):
        profile = Profile.objects.get(name="one")
        profile.args = ["--max-num-seqs", "64"]
        services.profile_save(instance=profile)
    page = kept(viewer, "/models/llama/")
    assert "revision 2" in page and "--max-num-seqs 64" in page
    assert "stale: profile is at 2" in page
    fragment, _ = get(viewer, "/models/llama/replicas/")
    assert "stale: profile is at 2" in fragment


def test_two_roles_never_see_each_others_buttons_on_a_kept_model_page(fleet):
    viewer, operator = client("viewer"), client("operator")
    _, cold = get(viewer, "/models/llama/")
    for _ in range(2):  # each asks twice, after the other: the kept parts are shared, the buttons not
        seen_by_viewer = get(viewer, "/models/llama/")[0]
        seen_by_operator = get(operator, "/models/llama/")[0]
        assert 'id="resize-h"' not in seen_by_viewer and "needs the resize permission" in seen_by_viewer
        assert 'id="resize-h"' in seen_by_operator and "needs the resize permission" not in seen_by_operator
    assert get(operator, "/models/llama/")[1] < cold  # the operator's page is drawn around the kept parts


def test_the_kept_filter_forms_show_the_query_and_the_catalogs_choices(fleet):
    viewer = client()
    assert 'value="gpu-1"' in kept(viewer, "/nodes/?name=gpu-1")
    assert 'value="gpu-2"' in get(viewer, "/nodes/?name=gpu-2")[0]
    assert "a100-80g" not in kept(viewer, "/nodes/") and "a100-80g" not in kept(viewer, "/")
    sql(
        "INSERT INTO catalog_gpuclass (name, memory_mib, usable_mib, compute_capability) "
        "VALUES ('a100-80g', 81920, 79000, '8.0')"
    )
    assert '<option value="a100-80g">a100-80g</option>' in kept(viewer, "/nodes/")
    assert '<option value="a100-80g">a100-80g</option>' in kept(viewer, "/")


# -- a node's page ------------------------------------------------------------------------------------------


def test_a_nodes_page_keeps_its_cards_and_replicas_until_they_change(fleet):
    viewer = client()
    page = kept(viewer, "/nodes/gpu-0/")
    assert '<span class="rep" title="llama-1, ready">llama-1</span>' in page
    sql("UPDATE catalog_replica SET state = 'loading' WHERE name = 'llama-1'")
    assert '<span class="rep" title="llama-1, loading">llama-1 · loading</span>' in kept(
        viewer, "/nodes/gpu-0/"
    )
    card = Card.objects.get(node__name="gpu-0", index=3)
    sql(
        "INSERT INTO telemetry_cardreading (card_id, at, memory_used_mib, memory_total_mib, foreign_mib, "
        "processes) VALUES (%s, CURRENT_TIMESTAMP, 2048, 81559, 2048, '[]')",
        [card.pk],
    )
    assert "foreign process: 2.0 GiB" in kept(viewer, "/nodes/gpu-0/")


def test_a_nodes_actions_are_the_readers_own_around_its_kept_cards(fleet):
    viewer, operator = client("viewer"), client("operator")
    seen_by_viewer = kept(viewer, "/nodes/gpu-0/")
    seen_by_operator = get(operator, "/nodes/gpu-0/")[0]
    assert "Cordon gpu-0" in seen_by_operator and "Cordon gpu-0" not in seen_by_viewer
    body = seen_by_viewer.split('<ul class="legend"')[1].split('<section class="panel history"')[0]
    assert body in seen_by_operator


# -- the model page's restart card and history panel --------------------------------------------------------


def test_the_model_pages_history_is_kept_until_an_entry_is_written(fleet):
    lead = client("lead")
    assert "org/other" not in kept(lead, "/models/llama/")
    with acting_as(Actor(via="cli", name="pytest")):
        model = fleet["model"]
        model.source = "org/other"
        services.model_save(instance=model)
    page = kept(lead, "/models/llama/")
    assert 'id="history-title"' in page and "org/other" in page.split('id="history-title"')[1]
    assert (
        'id="history-title"' not in get(client("viewer"), "/models/llama/")[0]
    )  # by permission, kept or not


def test_the_model_pages_restart_card_follows_its_restart(fleet):
    from operations.models import RestartOperation

    op = RestartOperation.objects.create(model=fleet["model"], profile=fleet["profile"], state="succeeded")
    viewer = client()
    assert '<span class="badge state-succeeded">' in kept(viewer, "/models/llama/")
    sql(f"UPDATE {RestartOperation._meta.db_table} SET state = 'failed' WHERE id = %s", [op.pk])
    assert '<span class="badge state-failed">' in kept(viewer, "/models/llama/")


def test_an_active_restart_on_the_model_page_is_read_anew_as_the_clock_moves(fleet, settings):
    from operations.models import RestartOperation

    RestartOperation.objects.create(model=fleet["model"], profile=fleet["profile"], state="queued")
    viewer = client()
    assert "abandoned: no worker has it" not in get(viewer, "/models/llama/")[0]
    settings.LLMGW_OPERATION_STALE_SECONDS = 0  # no write: only the clock says it is abandoned now
    assert "abandoned: no worker has it" in get(viewer, "/models/llama/")[0]


# -- the leads' audit list and the audit API ----------------------------------------------------------------


def test_the_audit_list_is_kept_until_an_entry_is_appended(fleet):
    lead = client("lead")
    page = kept(lead, "/audit/?object_type=model")
    assert "org/other" not in page
    with acting_as(Actor(via="cli", name="pytest")):
        model = fleet["model"]
        model.source = "org/other"
        services.model_save(instance=model)
    page = kept(lead, "/audit/?object_type=model")
    assert "org/other" in page.split('class="list audit-list"')[1]
    # The export links are the reader's, drawn around the kept results: a viewer with the log's
    # reading but not its export never gets the lead's.
    reader = client("reader", "audit.view_auditentry")
    assert "Export these entries" in page
    assert "Export these entries" not in get(reader, "/audit/?object_type=model")[0]


def logged(fleet: dict, source: str) -> None:
    """An entry in the log, through a service: the builders write none."""
    with acting_as(Actor(via="cli", name="pytest")):
        model = fleet["model"]
        model.source = source
        services.model_save(instance=model)


def test_a_kept_audit_list_is_kept_per_filter(fleet):
    logged(fleet, "org/first")
    lead = client("lead")
    models = kept(lead, "/audit/?object_type=model")
    profiles = kept(lead, "/audit/?object_type=profile")
    assert "<strong>llama</strong>" in models.split('class="list audit-list"')[1]
    assert 'class="list audit-list"' not in profiles and "No entry matches these filters." in profiles


def test_the_audit_api_is_kept_until_an_entry_is_appended(fleet):
    lead = client("lead")
    before = json.loads(kept(lead, "/api/audit/?object_type=model"))["results"]
    with acting_as(Actor(via="cli", name="pytest")):
        model = fleet["model"]
        model.source = "org/other"
        services.model_save(instance=model)
    after = json.loads(kept(lead, "/api/audit/?object_type=model"))["results"]
    assert len(after) == len(before) + 1 and after[0]["after"]["source"] == "org/other"


def test_an_audit_entry_written_by_sql_is_listed_at_the_next_request(fleet):
    """Behind the application's back: the log's version is raised by its own trigger."""
    logged(fleet, "org/first")
    lead = client("lead")
    kept(lead, "/audit/")
    newest = json.loads(get(lead, "/api/audit/")[0])["results"][0]
    sql(
        f"INSERT INTO {LOG} (at, actor, via, action, object_type, object_key, object_repr,"
        " before, after, message, request_id, prev_hash, hash) SELECT at, actor, via, 'forged',"
        " object_type, object_key, object_repr, before, after, 'written by sql', request_id, hash,"
        f" substr(hash, 2) || '0' FROM {LOG} WHERE id = %s",
        [newest["id"]],
    )
    assert "written by sql" in get(lead, "/audit/")[0]
    assert json.loads(get(lead, "/api/audit/")[0])["results"][0]["action"] == "forged"


def test_the_admin_audit_lists_count_is_kept_until_an_entry_is_appended(fleet):
    from audit.models import AuditEntry

    logged(fleet, "org/first")
    editor = Client()
    editor.force_login(b.user("admin-user", "audit.view_auditentry", roles=("editor",)))
    url = "/admin/audit/auditentry/"
    first, cold = get(editor, url)
    second, warm = get(editor, url)
    assert warm < cold

    def counted(page: str) -> int:
        found = re.search(r'<p class="paginator">\s*(\d+) audit entr', page)
        assert found, page[-2000:]
        return int(found.group(1))

    assert counted(first) == counted(second) == AuditEntry.objects.count()
    logged(fleet, "org/second")
    assert counted(get(editor, url)[0]) == AuditEntry.objects.count() == counted(first) + 1


def test_the_admin_audit_lists_rows_are_kept_until_an_entry_is_appended(fleet):
    """The rows drawn are kept under the log's version: a second request shows the same, drawn
    once; an entry appended, by a service or
    by SQL behind the application's back, is listed at the next request; each page and search is
    kept apart; and a reader who may not read the log is refused before anything kept is given."""
    for i in range(3):
        logged(fleet, f"org/v{i}")
    editor = Client()
    editor.force_login(b.user("admin-user", "audit.view_auditentry", roles=("editor",)))
    url = "/admin/audit/auditentry/"

    def rows(page: str) -> list[str]:
        table = page.split('<table id="result_list">')[1].split("</table>")[0]
        return re.findall(r"<tr>.*?</tr>", table.split("<tbody>")[1], re.S)

    first, cold = get(editor, url)
    with CaptureQueriesContext(connection) as ctx:
        second = editor.get(url).content.decode()
    assert len(ctx.captured_queries) < cold and rows(second) == rows(first) and len(rows(first)) == 3
    # The page's entries are still read (the admin counts them for its "0 of N selected"), not drawn.
    assert not [q for q in ctx.captured_queries if "COUNT(" in q["sql"]]
    assert 'name="_selected_action"' not in first  # no checkbox: nothing of a reader's in the rows
    logged(fleet, "org/appended")
    page = get(editor, url)[0]
    latest = AuditEntry.objects.latest("id")
    assert len(rows(page)) == 4 and f"{url}{latest.pk}/change/" in rows(page)[0]
    sql(
        f"INSERT INTO {LOG} (at, actor, via, action, object_type, object_key, object_repr,"
        " before, after, message, request_id, prev_hash, hash) SELECT at, 'forger', via, 'forged',"
        " object_type, object_key, object_repr, before, after, 'written by sql', request_id, hash,"
        f" substr(hash, 2) || '0' FROM {LOG} WHERE id = %s",
        [latest.pk],
    )
    page = get(editor, url)[0]
    assert len(rows(page)) == 5 and "forger" in rows(page)[0]
    searched = get(editor, f"{url}?q=forger")[0]
    assert len(rows(searched)) == 1 and len(rows(get(editor, url)[0])) == 5
    stranger = client("viewer")
    assert stranger.get(url).status_code in (302, 403)


# -- permissions ---------------------------------------------------------------------------------------------


def test_a_roles_permissions_are_read_once_and_read_again_when_its_roles_change(fleet):
    """A viewer's permissions are kept under the access version (base/rules.py): its second request
    reads none, and a role taken away is refused at the next request."""
    from django.contrib.auth.models import Group, User

    viewer = client()
    get(viewer, "/nodes/")
    with CaptureQueriesContext(connection) as ctx:
        viewer.get("/nodes/")
    assert not [q for q in ctx.captured_queries if "auth_permission" in q["sql"]]
    user = User.objects.get(username="viewer")
    user.groups.remove(Group.objects.get(name="viewer"))  # through the ORM: the access version rises
    assert viewer.get("/nodes/").status_code == 403
    user.groups.add(Group.objects.get(name="viewer"))
    assert viewer.get("/nodes/").status_code == 200
    with transaction.atomic(), connection.cursor() as c:  # behind the application's back
        c.execute("DELETE FROM auth_user_groups WHERE user_id = %s", [user.pk])
    assert viewer.get("/nodes/").status_code == 403


@pytest.mark.parametrize("url", ["/api/models/", "/api/profiles/", "/operations/"])
def test_an_answer_that_shows_no_replica_is_kept_through_a_replicas_change(fleet, url):
    """The structure's answers are kept apart from the replicas': a replica's state changed (as a
    restart does every few seconds) leaves them kept. (The operations API shows its steps' replicas'
    names: read again then, but none of its rows serialized again, test_kept_rows.py.)"""
    viewer = client()
    get(viewer, url)
    _, warm = get(viewer, url)
    sql("UPDATE catalog_replica SET state = 'loading'")
    assert get(viewer, url)[1] == warm
    # The operations page shows only the models' names (the names' version): a name read again.
    column = "name = 'llama-renamed'" if url == "/operations/" else "source = 'org/changed'"
    sql(f"UPDATE catalog_model SET {column}")
    assert get(viewer, url)[1] > warm


def test_the_model_pages_shape_and_profiles_are_kept_through_a_replicas_change(fleet):
    viewer = client()
    url = f"/models/{fleet['model'].name}/"
    get(viewer, url)
    _, warm = get(viewer, url)
    sql("UPDATE catalog_replica SET state = 'loading'")
    with CaptureQueriesContext(connection) as ctx:
        page = viewer.get(url).content.decode()
    assert "loading" in page
    # The replicas section and the latest restart read again; the profiles (and their memory) not.
    assert not [
        q["sql"] for q in ctx.captured_queries if 'FROM "catalog_profile"' in q["sql"].split("WHERE")[0]
    ]
    assert len(ctx.captured_queries) > warm


def test_the_nodes_summary_is_kept_through_a_replicas_state_and_not_through_a_card_taken(fleet):
    """The summary counts which cards are held and by which model (the placement), not the
    replicas' states: a state changed leaves it kept, a card taken draws it again."""
    viewer = client()
    get(viewer, "/nodes/")
    get(viewer, "/nodes/")

    def summary_read(url: str) -> bool:
        with CaptureQueriesContext(connection) as ctx:
            page = viewer.get(url).content.decode()
        # The summary's own query: every card grouped by class and holder, no node named.
        grouped = [q for q in ctx.captured_queries if "GROUP BY" in q["sql"] and "gpu_class_id" in q["sql"]]
        return bool(grouped) and "12 cards" in page

    sql("UPDATE catalog_replica SET state = 'loading'")
    assert not summary_read("/nodes/")
    b.replica(fleet["profile"], fleet["nodes"][1], [0], name="llama-2")  # a card taken
    assert summary_read("/nodes/")


def test_a_held_cards_planned_need_follows_its_models_and_profiles_rows(fleet):
    """The nodes grid's planned need per card is reckoned once per profile and remembered with the
    profile's, the model's and the class's rows (catalog/services/fit.py, ``need_of_row``): a model's
    edit that changes no memory term draws the same need; one that does (its weights, by raw SQL too)
    or a profile's change draws the new need at the next request, on the nodes page and a node's."""

    def planned(page: str) -> str:
        found = re.search(r'<span class="use muted">planned ([\d.]+) GiB', page)
        assert found, page[-3000:]
        return found.group(1)

    viewer = client()
    before = planned(kept(viewer, "/nodes/"))
    assert planned(kept(viewer, "/nodes/gpu-0/")) == before
    logged(fleet, "org/elsewhere")  # the model's source: no memory term
    assert planned(kept(viewer, "/nodes/")) == before
    sql("UPDATE catalog_model SET weight_bytes = weight_bytes + 4294967296 WHERE name = 'llama'")
    heavier = planned(kept(viewer, "/nodes/"))
    assert float(heavier) > float(before) and planned(kept(viewer, "/nodes/gpu-0/")) == heavier
    sql("UPDATE catalog_model SET weight_bytes = weight_bytes - 4294967296 WHERE name = 'llama'")
    assert planned(kept(viewer, "/nodes/")) == before


def test_the_nodes_page_drawn_by_what_it_shows_follows_a_models_name_and_a_replicas_state(fleet):
    """The grid and the summary are kept by what they are drawn from
    (versions/cache.py, ``drawn_from``) as well as under the versions: a model's source edited finds
    them drawn, but its name changed, by SQL, or a replica's state is drawn anew at the next request."""
    viewer = client()
    page = kept(viewer, "/nodes/")
    assert 'href="/models/llama/">llama</a>' in page
    logged(fleet, "org/elsewhere")

    def unstamped(page: str) -> str:  # each part's poll carries the stamp of the versions it was read at
        return re.sub(r"&quot;[0-9a-f]{20}&quot;", "", unmasked(page))

    assert unstamped(kept(viewer, "/nodes/")) == unstamped(page)
    sql("UPDATE catalog_model SET name = 'llama-renamed' WHERE name = 'llama'")
    page = kept(viewer, "/nodes/")
    assert (
        'href="/models/llama/"' not in page and page.count(">llama-renamed</a>") >= 3
    )  # tile, legend, summary
    sql("UPDATE catalog_replica SET state = 'loading' WHERE name = 'llama-1'")
    assert "llama-1 · loading" in kept(viewer, "/nodes/")
