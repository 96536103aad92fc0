"""Pages and answers that scale with what they show, not with the fleet: the generated fleet
(demo/scale.py) at two sizes, the same number of queries at both, the nodes page's
summary, filters, pages and compact view, the models list's pages, the dry run's bounded list of
nodes with room, and the floor endpoint the benchmark measures against."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from audit.services import verify_chain
from catalog.models import Card, Node, ServedModel
from demo.scale import BENCH_USER, Sizes, audit_model, generate
from telemetry.models import CardReading
from tests.support import builders as b

pytestmark = pytest.mark.django_db

SMALL = Sizes(nodes=12, models=4, operations=6, audit=40)
LARGE = Sizes(nodes=60, models=20, operations=30, audit=200)


def quiet(_: str) -> None:
    pass


@pytest.fixture
def bench() -> Client:
    generate(SMALL, say=quiet)
    c = Client()
    c.force_login(get_user_model().objects.get(username=BENCH_USER))
    return c


def audit_list_url() -> str:
    meta = audit_model()._meta
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")


def measured(client: Client, method: str, url: str, body: dict | None = None, **headers) -> tuple[int, int]:
    """Queries and response bytes of one request, which must succeed."""
    with CaptureQueriesContext(connection) as ctx:
        if method == "GET":
            response = client.get(url, **headers)
        elif url.startswith("/api/"):
            response = client.post(url, json.dumps(body), content_type="application/json", **headers)
        else:
            response = client.post(url, body, **headers)
    assert response.status_code == 200, (url, response.content[:500])
    return len(ctx.captured_queries), len(response.content)


REQUESTS = [
    ("GET", "/api/whoami/", None),
    ("POST", "/api/models/gen-model-001/gpus/", {"gpus": 2, "profile": "one", "dry_run": True}),
    ("POST", "/api/models/gen-model-001/context/", {"tokens": 16384, "profile": "one", "dry_run": True}),
    # gen-model-002: its latest restart succeeded at both sizes (gen-model-001's failed at the larger,
    # and a failed restart's page asks two more queries for what a rollback would go back to).
    ("GET", "/models/gen-model-002/", None),
    ("POST", "/models/gen-model-001/resize/preview/", {"gpus": 2, "profile": "one"}),
    ("GET", "/nodes/", None),
    ("GET", "/nodes/?gpu_class=gen-h100-80g&state=ready&free=1", None),
    ("GET", "/nodes/?model=gen-model-001&name=node", None),
    ("GET", "/nodes/?view=compact", None),
    ("GET", "/nodes/gen-node-0003/", None),
    ("GET", "/", None),
    ("GET", "/?engine=vllm&gpu_class=gen-h100-80g", None),
    ("GET", "/api/models/", None),
    ("GET", "/api/nodes/", None),
    ("GET", "/api/profiles/", None),
    ("GET", "/api/replicas/", None),
    ("GET", "/operations/", None),
    ("GET", "/api/operations/", None),
    ("GET", "AUDIT", None),
    ("GET", "AUDIT?p=2", None),
    # The leads' audit pages: the newest page, the oldest, filtered and not, an entry, the API.
    ("GET", "/audit/", None),
    ("GET", "/audit/?after=0", None),
    ("GET", "/audit/?action=update&object_type=profile&via=api", None),
    ("GET", "/audit/?action=update&object_type=profile&after=0", None),
    ("GET", "/audit/ENTRY/", None),
    ("GET", "/api/audit/", None),
]


def test_queries_per_request_do_not_grow_with_the_fleet(bench):
    def counts() -> dict[str, int]:
        out = {}
        for method, url, body in REQUESTS:
            url = url.replace("AUDIT", audit_list_url()).replace(
                "ENTRY", str(audit_model().objects.earliest("id").pk)
            )
            headers = {"HTTP_HX_REQUEST": "true"} if "preview" in url else {}
            out[f"{method} {url}"] = measured(bench, method, url, body, **headers)[0]
        return out

    small = counts()
    generate(LARGE, say=quiet)
    assert Node.objects.count() == LARGE.nodes and ServedModel.objects.count() == LARGE.models
    assert counts() == small


# The API's rate count in the shared "throttle" cache (access/throttles.py): read, then in a transaction
# the table counted for culling, the key looked up and the count written (six queries, pages none).
THROTTLE = 6

# What versions/cache.py keeps, and the queries a request asks once it is kept: the session, the
# user (a superuser: no permission is read), the versions; and what is read beside the kept part.
KEPT = {
    "POST /api/models/gen-model-001/gpus/": 4 + THROTTLE,  # and the cards a foreign process holds
    "POST /api/models/gen-model-001/context/": 4 + THROTTLE,
    "POST /models/gen-model-001/resize/preview/": 6,  # and the model and its profiles, for the form
    "GET /models/gen-model-002/": 4,  # and the model
    "GET /nodes/": 3,  # the filter form is kept too
    "GET /nodes/gen-node-0003/": 6,  # and the node, its drains, and its cards for the card cordon form
    "GET /nodes/?gpu_class=gen-h100-80g&state=ready&free=1": 4,  # and the cards a foreign process holds
    "GET /nodes/?view=compact": 3,
    "GET /": 3,
    "GET /?engine=vllm&gpu_class=gen-h100-80g": 3,
    "GET /api/models/": 3 + THROTTLE,
    "GET /api/nodes/": 3 + THROTTLE,
    "GET /api/profiles/": 3 + THROTTLE,
    "GET /api/replicas/": 3 + THROTTLE,
    "GET /operations/": 3,
    "GET /api/operations/": 3 + THROTTLE,
}


def cold_then_warm(client: Client, method: str, url: str, body: dict | None, **headers) -> tuple[int, int]:
    """The queries of a request, then of the same again, both within one of the nodes pages' 10 s
    clock ticks (web/node_grid.py, SEEN_WITHIN_SECONDS), which are part of their keys: a pair that
    straddled two read the summary's readings again (a CI run at load 11 did)."""
    from web.node_grid import SEEN_WITHIN_SECONDS

    left = SEEN_WITHIN_SECONDS - time.time() % SEEN_WITHIN_SECONDS
    if left < 3:
        time.sleep(left + 0.05)
    cold = measured(client, method, url, body, **headers)[0]
    return cold, measured(client, method, url, body, **headers)[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_a_kept_answer_takes_a_fixed_few_queries_at_either_size():
    """The counts above (test_queries_per_request_do_not_grow_with_the_fleet) are each request's
    first, computed: pytest-django's ``db`` runs a test in a transaction, where nothing is kept.
    Outside one, the second request of each is answered from what was kept."""
    generate(SMALL, say=quiet)
    c = Client()
    c.force_login(get_user_model().objects.get(username=BENCH_USER))
    bodies = {f"{m} {u}": body for m, u, body in REQUESTS}

    def counts() -> dict[str, tuple[int, int]]:
        out = {}
        for request in KEPT:
            method, url = request.split(" ", 1)
            headers = {"HTTP_HX_REQUEST": "true"} if "preview" in url else {}
            out[request] = cold_then_warm(c, method, url, bodies[request], **headers)
        return out

    small = counts()
    assert {r: warm for r, (_, warm) in small.items()} == KEPT
    preview = small.pop("POST /models/gen-model-001/resize/preview/")
    assert all(warm < cold for cold, warm in small.values()), small
    assert preview[0] == preview[1]  # its first already found the API's dry run of the same change kept
    generate(LARGE, say=quiet)
    assert {r: warm for r, (_, warm) in counts().items()} == KEPT


def role_for(request: str) -> str:
    """The role a real user needs for a request (base/roles.py): the dry runs and the preview an
    operator's, the audit log's pages a lead's, the rest a viewer's."""
    if "/gpus/" in request or "/context/" in request or "preview" in request:
        return "operator"
    return "lead" if "audit" in request else "viewer"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_a_real_roles_kept_answer_takes_as_few_queries_as_a_superusers():
    """A viewer's, operator's or lead's permissions are kept (base/rules.py): once read, their
    requests ask what a superuser's do, at either size."""
    from demo.scale import ROLE_USERS

    generate(SMALL, say=quiet)
    bodies = {f"{m} {u}": body for m, u, body in REQUESTS}
    clients = {}
    for role, name in ROLE_USERS.items():
        clients[role] = Client()
        clients[role].force_login(get_user_model().objects.get(username=name))

    def counts() -> dict[str, int]:
        out = {}
        for request in KEPT:
            method, url = request.split(" ", 1)
            headers = {"HTTP_HX_REQUEST": "true"} if "preview" in url else {}
            out[request] = cold_then_warm(
                clients[role_for(request)], method, url, bodies[request], **headers
            )[1]
        return out

    # A POST reads the versions for the permissions apart from the view's (base/rules.py): one more.
    expected = {r: n + r.startswith("POST") for r, n in KEPT.items()}
    # A viewer is not offered the card cordon form, so a node's page does not read its cards for it.
    expected["GET /nodes/gen-node-0003/"] -= 1
    assert counts() == expected
    generate(LARGE, say=quiet)
    assert counts() == expected


def test_the_dry_run_names_ten_nodes_with_room_and_counts_them_all(bench):
    generate(LARGE, say=quiet)
    response = bench.post(
        "/api/models/gen-model-001/gpus/",
        {"gpus": 1, "profile": "two", "dry_run": True},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    room = response.json()["room"]
    ready_with_room = sum(
        1
        for n in Node.objects.filter(state="ready", cards__gpu_class__name="gen-h100-80g").distinct()
        if n.cards.filter(shard__isnull=True).exists()
    )
    assert room["beside_count"] == ready_with_room > 10
    assert len(room["beside"]) == 10 and room["beside"] == sorted(room["beside"])
    assert room["in_place_count"] >= room["beside_count"] and len(room["in_place_nodes"]) == 10


def test_the_preview_names_ten_nodes_with_room_and_says_how_many_more(bench):
    generate(LARGE, say=quiet)
    page = bench.post(
        "/models/gen-model-001/resize/preview/", {"gpus": 1, "profile": "two"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    named = page.split("Room beside the running replicas on <strong>")[1].split("</strong>")[0]
    assert len(named.split(", ")) == 10
    assert " other nodes: each replacement starts" in page


# -- the nodes page ---------------------------------------------------------------------------------------


def test_the_nodes_page_sums_up_the_fleet_by_class_and_state(bench):
    page = bench.get("/nodes/").content.decode()
    assert "12 nodes, 96 cards" in page
    h100 = page.split('<a href="?gpu_class=gen-h100-80g">gen-h100-80g</a>')[1].split("</tr>")[0]
    cells = [c.split("</td>")[0] for c in h100.split('<td class="num">')[1:]]
    cards, free, held = (int(c) for c in cells)
    assert cards == 80 and free + held == cards and held > 0
    assert '<a href="?model=gen-model-000">gen-model-000</a>' in h100  # who holds them
    assert '<span class="badge state-ready">ready</span> 12 nodes' in page


def test_the_nodes_page_pages_the_grid_and_keeps_the_first_page_small(bench):
    generate(LARGE, say=quiet)
    first = bench.get("/nodes/")
    text = first.content.decode()
    assert "60 nodes · 1–50 shown" in text
    assert text.count('<section class="node ') == 50
    assert text.count('class="card ') == 50 * 8
    assert 'href="?page=2"' in text
    second = bench.get("/nodes/?page=2").content.decode()
    assert second.count('<section class="node ') == 10 and "gen-node-0059" in second
    assert len(first.content) < 200_000  # the first page is 50 nodes whatever the fleet
    # And once every card has a reading, its longest (memory, utilization and temperature, two digits
    # each): each card's line and bar, 400 a page.
    now = timezone.now()
    CardReading.objects.bulk_create(
        CardReading(
            card=card,
            at=now,
            memory_used_mib=73_728,
            memory_total_mib=81_559,
            utilization_percent=88,
            temperature_c=67,
        )
        for card in Card.objects.all()
    )
    read = bench.get("/nodes/")
    assert "used 72.0 of 79.6 GiB" in read.content.decode() and len(read.content) < 200_000


@pytest.mark.parametrize(
    ("query", "shown", "hidden"),
    [
        ("name=0001", ["gen-node-0001"], ["gen-node-0002"]),
        ("state=ready", ["gen-node-0000"], []),
        ("gpu_class=gen-a100-80g", ["gen-node-0011"], ["gen-node-0000"]),
    ],
)
def test_the_nodes_page_filters(bench, query, shown, hidden):
    page = bench.get(f"/nodes/?{query}").content.decode()
    for name in shown:
        assert f'href="/nodes/{name}/"' in page
    for name in hidden:
        assert f'href="/nodes/{name}/"' not in page


def test_the_nodes_page_filters_by_free_cards_and_model():
    cls = b.gpu_class()
    full, roomy = b.node("full", cls=cls), b.node("roomy", cls=cls)
    p = b.profile(b.llama_8b("holder"), "h100")
    b.replica(p, full, list(range(8)), name="holder-1")
    b.replica(p, roomy, [0], name="holder-2")
    other = b.profile(b.llama_8b("other"), "h100")
    b.replica(other, roomy, [1], name="other-1")
    viewer = Client()
    viewer.force_login(b.user("viewer"))

    def nodes(query: str) -> list[str]:
        page = viewer.get(f"/nodes/?{query}").content.decode()
        return [n for n in ("full", "roomy") if f'href="/nodes/{n}/"' in page]

    assert nodes("free=6") == ["roomy"]
    assert nodes("free=0") == ["full", "roomy"]
    assert nodes("model=holder") == ["full", "roomy"]
    assert nodes("model=other") == ["roomy"]
    assert nodes("model=other&free=7") == []
    assert "No node matches these filters." in viewer.get("/nodes/?name=zzz").content.decode()
    assert "Free cards is a whole number." in viewer.get("/nodes/?free=many").content.decode()

    # Two of roomy's six free cards are held by a process the catalog does not know (a fresh reading
    # says so): not free to the filter, as the grid does not count them free.
    now = timezone.now()
    for index in (6, 7):
        card = Card.objects.get(node=roomy, index=index)
        CardReading.objects.create(
            card=card, at=now, foreign_mib=5000, processes=[{"name": "python3", "pid": 4242}]
        )
    assert nodes("free=6") == []
    assert nodes("free=4") == ["roomy"]
    # A reading too old to heed is not a hold: they count free again.
    CardReading.objects.update(at=now - timedelta(seconds=settings.LLMGW_TELEMETRY_STALE_SECONDS + 1))
    assert nodes("free=6") == ["roomy"]


def test_the_compact_view_draws_a_mark_per_card_for_many_nodes(bench):
    generate(LARGE, say=quiet)
    page = bench.get("/nodes/?view=compact").content.decode()
    assert page.count('<li class="strip ') == 60
    assert page.count('<i class="') == 60 * 8
    assert page.count('<i class="free"') == Node.objects.filter(cards__shard__isnull=True).count()
    assert 'title="card 0: gen-model-' in page


def test_an_htmx_filter_gets_the_results_fragment_only(bench):
    response = bench.get("/nodes/?name=0001", HTTP_HX_REQUEST="true").content.decode()
    assert response.lstrip().startswith('<div id="node-results" hx-get="/nodes/?name=0001"')
    assert "<html" not in response and "The fleet" not in response


def test_names_on_the_nodes_page_are_escaped():
    n = b.node("gpu-1")
    p = b.profile(b.llama_8b("m"), "h100")
    b.replica(p, n, [0], name="m-1", state="loading")
    viewer = Client()
    viewer.force_login(b.user("viewer"))
    page = viewer.get("/nodes/").content.decode()
    assert '<span class="rep" title="m-1, loading">m-1 · loading</span>' in page
    Node.objects.filter(pk=n.pk).update(name="a<b")  # past the validator, as raw SQL could
    assert "a<b" not in viewer.get("/nodes/").content.decode()


# -- the models list --------------------------------------------------------------------------------------


def test_the_models_list_pages(bench):
    generate(LARGE, say=quiet)
    generate(Sizes(nodes=60, models=60, operations=30, audit=200), say=quiet)
    first = bench.get("/").content.decode()
    assert "60 models · 1–50 shown" in first and first.count("<tr>\n        <td>\n") == 50
    second = bench.get("/?page=2").content.decode()
    assert "gen-model-059" in second and "gen-model-000" not in second
    filtered = bench.get("/?q=gen-model-05&page=1").content.decode()
    assert "10 models match" in filtered and 'class="pager"' not in filtered


# -- the floor --------------------------------------------------------------------------------------------


def test_whoami_answers_the_signed_in_user_reading_nothing_of_the_fleet():
    assert Client().get("/api/whoami/").status_code == 401
    c = Client()
    c.force_login(b.user("someone"))
    with CaptureQueriesContext(connection) as ctx:
        response = c.get("/api/whoami/", HTTP_X_REQUEST_ID="abc-1")
    assert response.json() == {"username": "someone", "request_id": "abc-1"}
    # The session and the user, and the user's API rate count (THROTTLE): nothing of the fleet.
    assert len(ctx.captured_queries) == 2 + THROTTLE


# -- the generator ----------------------------------------------------------------------------------------


def test_the_generator_adds_only_what_is_missing_and_keeps_the_audit_chain():
    generate(SMALL, say=quiet)
    again = generate(SMALL, say=quiet)
    assert set(again.values()) == {0}
    assert audit_model().objects.count() == SMALL.audit
    grown = generate(Sizes(nodes=20, models=6, operations=6, audit=60), say=quiet)
    assert (grown["nodes"], grown["models"], grown["audit entries"]) == (8, 2, 20)
    assert verify_chain() == []


def test_the_generator_refuses_a_real_catalog():
    b.node("gpu-1")
    with pytest.raises(CommandError, match="holds 1 nodes, 1 GPU classes that this command did not generate"):
        call_command("generate_fleet", "--nodes", "10", "--models", "2", "--audit", "0")
    assert not Node.objects.filter(name__startswith="gen-").exists()


def test_the_admin_audit_list_counts_once_and_reads_no_distinct_values(bench):
    # At a million entries each DISTINCT (the date navigation's, the action and object filters')
    # and each COUNT read the whole table: one count is left, and no DISTINCT.
    with CaptureQueriesContext(connection) as ctx:
        response = bench.get(audit_list_url())
    assert response.status_code == 200
    sql = [q["sql"] for q in ctx.captured_queries]
    assert sum("COUNT(" in q for q in sql) == 1, sql
    assert not [q for q in sql if "DISTINCT" in q], sql
    assert "via__exact=api" in response.content.decode()  # the via filter stays: its choices are Via's
