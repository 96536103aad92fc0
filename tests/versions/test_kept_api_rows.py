"""The list endpoints' rows kept by what they are serialized from (issue 25; ``base/api/cached.py``,
``kept_rows``): after a write that raises a version a kept list is read again, but only the rows
whose loaded values changed are serialized again, and a row whose values changed, by raw SQL too,
is never given as it was. What counts the serializing is a spy: the real method runs, counted."""

from __future__ import annotations

import json

import pytest

from catalog.api import serializers as catalog_serializers
from operations.api import views as operation_api
from tests.versions.conftest import spy
from tests.versions.test_kept_answers import client, get, kept, sql

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("audit_flushable")]


@pytest.mark.parametrize(
    ("url", "serializer", "statement", "seen"),
    [
        (
            "/api/models/",
            catalog_serializers.ServedModelSerializer,
            "UPDATE catalog_model SET name = 'renamed' WHERE name = 'other'",
            '"name":"renamed"',
        ),
        (
            "/api/profiles/",
            catalog_serializers.ProfileSerializer,
            "UPDATE catalog_profile SET engine = 'sglang' "
            "WHERE model_id = (SELECT id FROM catalog_model WHERE name = 'other')",
            '"engine":"sglang"',
        ),
    ],
)
def test_an_api_list_serializes_again_only_the_row_that_changed(
    two, monkeypatch, url, serializer, statement, seen
):
    viewer = client()
    before = json.loads(kept(viewer, url))
    assert before["count"] == 2
    serialized = spy(monkeypatch, serializer, "to_representation")
    sql(statement)
    assert seen in kept(viewer, url).replace(" ", "")
    assert serialized["all"] == 1  # the row that changed; the other was kept


def test_a_replicas_list_row_follows_its_cards_node_and_its_profiles_revision(two):
    viewer = client()
    kept(viewer, "/api/replicas/")
    sql("UPDATE catalog_node SET name = 'gpu-renamed' WHERE name = 'gpu-1'")
    sql("UPDATE catalog_profile SET revision = revision + 1")
    rows = {r["name"]: r for r in json.loads(kept(viewer, "/api/replicas/"))["results"]}
    assert rows["other-1"]["shards"] == [{"node": "gpu-renamed", "cards": [0, 1]}]
    assert rows["other-1"]["stale"] and rows["llama-1"]["stale"]


def test_the_operations_api_follows_a_steps_replica_renamed_and_is_kept_through_a_state(ended, monkeypatch):
    """It shows its steps' replicas' names and nothing else of them: kept under the placement's version,
    which a replica's name raises (versions/triggers.py, ``HOLDER``); a state changed finds the answer
    kept (no query more), a name changed by raw SQL is shown at once."""
    viewer = client()
    kept(viewer, "/api/operations/")
    _, warm = get(viewer, "/api/operations/")
    serialized = spy(monkeypatch, operation_api.RestartOperationSerializer, "to_representation")
    sql("UPDATE catalog_replica SET state = 'loading'")
    _, queries = get(viewer, "/api/operations/")
    assert queries == warm and serialized["all"] == 0
    sql("UPDATE catalog_replica SET name = 'llama-renamed' WHERE name = 'llama-1'")
    answer = json.loads(kept(viewer, "/api/operations/"))
    steps = [s for op in answer["results"] for s in op["steps"]]
    assert [s["old_replica"] for s in steps] == ["llama-renamed"] and serialized["all"] == 1


def test_a_rows_inputs_follow_the_rows_set_as_its_attributes(two):
    """A prefetch ``to_attr`` puts the rows in a list attribute: their values are the row's inputs,
    not their ``repr`` (which names them only)."""
    from django.db.models import Prefetch

    from base.api.cached import row_inputs
    from catalog.models import ServedModel

    model = ServedModel.objects.prefetch_related(Prefetch("profiles", to_attr="profile_list")).get(
        name="llama"
    )
    before = repr(row_inputs(model))
    model.profile_list[0].args = ["--max-num-seqs", "8"]
    assert repr(row_inputs(model)) != before
