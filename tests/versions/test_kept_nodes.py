"""The nodes pages and the nodes API kept under the narrowest versions that say what they show
(issue 25): a write to what they show (a card cordoned, a model or a replica renamed, by raw SQL
behind the application's back) is shown at the next request; one to what they do not show (a
model's source, a replica's state in the compact view or on another page) reads only what it
could have changed, and fills no grid again."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import Card
from tests.support import builders as b
from tests.versions.test_kept_answers import client, fleet, get, kept, sql

__all__ = ["fleet"]  # the fixture, shared with test_kept_answers.py

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("audit_flushable")]


@pytest.fixture
def fills(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many times a grid had its readings put in (web/node_grid.py, ``with_readings``): a spy
    that calls the real one."""
    from web import node_grid

    calls: list[int] = []
    real = node_grid.with_readings

    def counted(html, readings):
        calls.append(1)
        return real(html, readings)

    monkeypatch.setattr(node_grid, "with_readings", counted)
    yield calls


def queries(c, url: str) -> tuple[str, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        response = c.get(url)
    assert response.status_code == 200, response.content[:300]
    return response.content.decode(), [q["sql"] for q in ctx.captured_queries]


def test_a_card_cordoned_by_sql_shows_on_the_nodes_pages(fleet):
    viewer = client()
    assert "12 cards, 11 free" in kept(viewer, "/nodes/")
    assert "cordoned" not in kept(viewer, "/nodes/?view=compact").split('id="node-results"')[1]
    assert "cordoned" not in kept(viewer, "/nodes/gpu-1/").split('<ol class="cards">')[1].split("</ol>")[0]
    sql(
        "UPDATE catalog_card SET cordoned = true, cordon_reason = 'fan' WHERE \"index\" = 2 AND node_id = "
        "(SELECT id FROM catalog_node WHERE name = 'gpu-1')"
    )
    page = kept(viewer, "/nodes/")
    assert "12 cards, 10 free" in page and "cordoned: fan" in page
    assert 'title="card 2: cordoned"' in kept(viewer, "/nodes/?view=compact")
    assert "cordoned: fan" in kept(viewer, "/nodes/gpu-1/")


def test_a_model_renamed_by_sql_shows_in_the_compact_view(fleet):
    viewer = client()
    assert 'title="card 0: llama"' in kept(viewer, "/nodes/?view=compact")
    sql("UPDATE catalog_model SET name = 'llama-renamed' WHERE name = 'llama'")
    page = kept(viewer, "/nodes/?view=compact")
    assert 'title="card 0: llama-renamed"' in page and 'href="/models/llama-renamed/"' in page


def test_a_profile_moved_to_another_model_by_sql_shows_in_the_summary(fleet):
    other = b.llama_8b("mistral")
    viewer = client()
    summary = kept(viewer, "/nodes/").split('id="node-results"')[0]
    assert "llama" in summary and "mistral" not in summary
    sql("UPDATE catalog_profile SET model_id = %s WHERE id = %s", [other.pk, fleet["profile"].pk])
    summary = kept(viewer, "/nodes/").split('id="node-results"')[0]
    assert "mistral" in summary and ">llama<" not in summary


def test_a_replica_moved_to_another_models_profile_by_sql_shows_in_the_summary_and_compact_view(fleet):
    """A replica's profile is a holder column (versions/triggers.py, ``HOLDER``): written behind the
    application's back, it raises the placement's version, under which the summary's counts and the
    compact view are kept."""
    other = b.profile(b.llama_8b("mistral"), "one")
    viewer = client()
    assert "mistral" not in kept(viewer, "/nodes/").split('id="node-results"')[0]
    assert 'title="card 0: llama"' in kept(viewer, "/nodes/?view=compact")
    sql("UPDATE catalog_replica SET profile_id = %s WHERE name = 'llama-1'", [other.pk])
    assert "mistral" in kept(viewer, "/nodes/").split('id="node-results"')[0]
    assert 'title="card 0: mistral"' in kept(viewer, "/nodes/?view=compact")


def test_a_replicas_state_flipped_reads_no_compact_view_again(fleet):
    viewer = client()
    kept(viewer, "/nodes/?view=compact")
    sql("UPDATE catalog_replica SET state = 'loading' WHERE name = 'llama-1'")
    _, read = queries(viewer, "/nodes/?view=compact")
    assert not [q for q in read if '"catalog_card"' in q], read  # kept: nothing it shows was written


def test_a_models_source_edited_reads_no_compact_view_and_no_operations_again(fleet):
    """The compact view and the operations API show of the models only their names (the names'
    version, versions/triggers.py ``NAMED``): a model's source edited reads neither again; its name
    changed does."""
    viewer = client()
    kept(viewer, "/nodes/?view=compact")
    kept(viewer, "/api/operations/")
    _, warm = get(viewer, "/api/operations/")
    sql("UPDATE catalog_model SET source = 'org/elsewhere' WHERE name = 'llama'")
    _, read = queries(viewer, "/nodes/?view=compact")
    assert not [q for q in read if '"catalog_card"' in q], read
    assert get(viewer, "/api/operations/")[1] == warm
    sql("UPDATE catalog_model SET name = 'llama-renamed' WHERE name = 'llama'")
    assert 'title="card 0: llama-renamed"' in kept(viewer, "/nodes/?view=compact")


def test_a_models_source_edited_reads_neither_readings_nor_counts_and_fills_no_grid(fleet, fills):
    """A model's edit (its source: nothing the nodes pages show) reads the drawn inputs again and
    each profile's model for the summary, and finds the grid drawn and filled, the readings and the
    summary's counts kept; the nodes API, which shows nothing of the models, is kept whole."""
    viewer = client()
    for url in ("/nodes/", "/nodes/?view=compact", "/nodes/gpu-0/"):
        kept(viewer, url)
    api = kept(viewer, "/api/nodes/")
    _, warm_api = get(viewer, "/api/nodes/")
    sql("UPDATE catalog_model SET source = 'org/elsewhere' WHERE name = 'llama'")
    fills.clear()
    for url in ("/nodes/", "/nodes/?view=compact", "/nodes/gpu-0/"):
        _, read = queries(viewer, url)
        assert not [q for q in read if "telemetry_" in q and 'WHERE "catalog_node"."name"' not in q], read
        assert not [q for q in read if "GROUP BY" in q and "gpu_class_id" in q], read  # the summary's counts
    assert fills == []
    again, n = get(viewer, "/api/nodes/")
    assert again == api and n == warm_api


def test_a_replicas_state_flipped_fills_only_the_grids_that_show_it(fleet, fills):
    """The cards view of the page that holds the replica is drawn and filled anew (it shows the
    state); the compact view (which does not) and a page of other nodes find theirs drawn and
    filled; none reads the readings again."""
    viewer = client()
    for url in ("/nodes/", "/nodes/?view=compact", "/nodes/?name=gpu-2"):
        kept(viewer, url)
    sql("UPDATE catalog_replica SET state = 'loading' WHERE name = 'llama-1'")
    fills.clear()
    for url in ("/nodes/?view=compact", "/nodes/?name=gpu-2"):
        _, read = queries(viewer, url)
        assert not [q for q in read if "telemetry_" in q], read
    assert fills == []
    page, read = queries(viewer, "/nodes/")
    assert "llama-1 · loading" in page and len(fills) == 1
    assert not [q for q in read if "telemetry_" in q], read


def test_the_nodes_api_names_each_cards_replica_as_it_is_now(fleet):
    """Each card's holder is kept by its replica's id and named per request: a replica renamed by
    SQL is named so at the next request; a state flipped reads nothing again (a name is a holder
    column, under the placement's version). The one node's answer names its holders as the list does."""
    viewer = client()

    def holders(text: str) -> list[str]:
        return [c["replica"] for n in json.loads(text)["results"] for c in n["cards"] if c["replica"]]

    assert holders(kept(viewer, "/api/nodes/")) == ["llama-1"]
    _, warm = get(viewer, "/api/nodes/")
    sql("UPDATE catalog_replica SET state = 'loading' WHERE name = 'llama-1'")
    again, n = get(viewer, "/api/nodes/")
    assert holders(again) == ["llama-1"] and n == warm
    sql("UPDATE catalog_replica SET name = 'llama-9' WHERE name = 'llama-1'")
    assert holders(kept(viewer, "/api/nodes/")) == ["llama-9"]
    assert json.loads(get(viewer, "/api/nodes/gpu-0/")[0])["cards"][0]["replica"] == "llama-9"
    card = Card.objects.get(node__name="gpu-0", index=0)
    sql("DELETE FROM catalog_shard WHERE card_id = %s", [card.pk])  # a card let go: the placement's
    assert holders(kept(viewer, "/api/nodes/")) == []
