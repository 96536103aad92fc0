"""The lists' rows kept by what they show (issue 25): after a write that raises a version, a kept list
page is read again but only the rows whose values changed are drawn again, and a row whose values
changed, by a service or by raw SQL, is never given as it was: the models list's rows
(``web/model_rows.py``), the operations list's ended rows (``operations/views.py``,
``operation_rows``) and the list pages' filter forms (``base/views.py``, ``kept_filters``). The
list endpoints' rows: test_kept_api_rows.py. What counts the drawings is a spy: the real function
runs, counted."""

from __future__ import annotations

import re

import pytest

from operations.models import RestartOperation
from tests.versions.conftest import spy
from tests.versions.test_kept_answers import client, get, kept, sql

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("audit_flushable")]


def row_of(page: str, model: str) -> str:
    found = re.search(
        rf'<tr>\s*<td>\s*<span class="chip[^"]*" aria-hidden="true"></span>\s*<a href="/models/{model}/">.*?</tr>',
        page,
        re.S,
    )
    assert found, page[-2000:]
    return found.group(0)


def test_the_models_list_draws_again_only_the_row_whose_replicas_or_model_changed(two, monkeypatch):
    from web import model_rows

    viewer = client()
    page = kept(viewer, "/")
    assert re.search(r'<td class="num">1</td>\s*<td class="num">1</td>', row_of(page, "llama"))
    drawn = spy(monkeypatch, model_rows, "draw_row")
    sql("UPDATE catalog_replica SET state = 'failed' WHERE name = 'llama-1'")
    page = kept(viewer, "/")
    assert re.search(r'<td class="num">0</td>\s*<td class="num">0</td>', row_of(page, "llama"))
    assert re.search(r'<td class="num">2</td>\s*<td class="num">1</td>', row_of(page, "other"))
    assert drawn["all"] == 1  # llama's row; other's was kept
    sql("UPDATE catalog_model SET name = 'renamed', source = 'org/renamed' WHERE name = 'other'")
    page = kept(viewer, "/")
    assert "<strong>renamed</strong>" in row_of(page, "renamed") and "org/renamed" in page
    assert "/models/other/" not in page and drawn["all"] == 2


def test_a_models_row_follows_its_profiles_class_renamed(two):
    """What a row shows of other tables (its profiles' class's name, by raw SQL) is part of its inputs."""
    viewer = client()
    kept(viewer, "/")
    cls = two["profile"].gpu_class
    sql("UPDATE catalog_gpuclass SET name = 'renamed-class' WHERE id = %s", [cls.pk])
    page = kept(viewer, "/")
    assert "× renamed-class" in row_of(page, "llama") and "× renamed-class" in row_of(page, "other")


def test_the_filter_form_is_drawn_again_only_when_its_choices_change(two, monkeypatch):
    import base.views

    viewer = client()
    kept(viewer, "/?engine=vllm")
    drawn = spy(monkeypatch, base.views, "render_to_string")
    sql("UPDATE catalog_model SET source = 'org/elsewhere' WHERE name = 'other'")
    page = kept(viewer, "/?engine=vllm")
    assert drawn["all"] == 0 and 'value="vllm" selected' in page
    sql(
        "UPDATE catalog_profile SET engine = 'sglang' WHERE model_id = (SELECT id FROM catalog_model WHERE name = 'other')"
    )
    page = kept(viewer, "/?engine=vllm")
    assert drawn["all"] == 1 and '<option value="sglang">' in page


def test_the_operations_page_draws_again_only_the_row_that_changed(ended, monkeypatch):
    from operations import views

    viewer = client()
    kept(viewer, "/operations/")
    _, warm = get(viewer, "/operations/")
    drawn = spy(monkeypatch, views, "_operation_row")
    sql("UPDATE catalog_model SET source = 'org/elsewhere'")  # not the names' version: kept whole
    page, queries = get(viewer, "/operations/")
    assert "first" in page and queries == warm and drawn["all"] == 0
    sql(f"UPDATE {RestartOperation._meta.db_table} SET reason = 'changed' WHERE reason = 'second'")
    page = kept(viewer, "/operations/")
    assert "changed" in page and "first" in page and drawn["all"] == 1
    sql("UPDATE catalog_model SET name = 'llama-renamed' WHERE name = 'llama'")
    page = kept(viewer, "/operations/")
    assert page.count('href="/models/llama-renamed/"') == 2 and drawn["all"] == 3


def test_the_model_pages_replicas_and_profiles_are_drawn_again_only_when_its_own_change(two, monkeypatch):
    """Kept under the versions and by every value loaded with them (``base/api/cached.py``,
    ``kept_by_loaded``): another model's replica or edit reads them again and draws nothing; the
    model's own replica's state, or its profile's class renamed, by raw SQL, is drawn at once."""
    from web.views import models as model_views

    viewer = client()
    kept(viewer, "/models/llama/")
    replicas = spy(monkeypatch, model_views, "_draw_replicas")
    columns = spy(monkeypatch, model_views, "shape_facts")
    sql("UPDATE catalog_replica SET state = 'loading' WHERE name = 'other-1'")
    sql("UPDATE catalog_model SET source = 'org/elsewhere' WHERE name = 'other'")
    kept(viewer, "/models/llama/")
    assert replicas["all"] == 0 and columns["all"] == 0
    sql("UPDATE catalog_replica SET state = 'failed' WHERE name = 'llama-1'")
    assert '<tr class="replica state-failed">' in kept(viewer, "/models/llama/")
    assert replicas["all"] == 1 and columns["all"] == 0
    sql("UPDATE catalog_gpuclass SET name = 'renamed-class'")
    assert "renamed-class" in kept(viewer, "/models/llama/") and columns["all"] == 1
