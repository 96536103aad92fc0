"""The leads' audit pages, the API's ``/api/audit/`` and the exports: one filter, the same entries everywhere."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEntry
from audit.selectors import changed_outside
from audit.services import audit_record
from audit.summary import summarize
from base.actor import Actor, acting_as
from catalog.models import Profile
from catalog.services import catalog as services
from operations.models import RestartOperation
from operations.services.runner import run_operation
from tests.support import builders as b
from tests.support.restart import MODEL, fleet_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_restarts")]

PW = "pw-for-tests-only-123"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def listed(client: Client, **filters: str) -> list[int]:
    """The ids the audit page lists for ``filters`` (its first page), from the links to each entry."""
    response = client.get("/audit/", filters)
    assert response.status_code == 200, response.content
    return [entry.pk for entry, _ in response.context["rows"]]


def api_ids(client: APIClient, **filters: str) -> list[int]:
    ids, url, params = [], "/api/audit/", dict(filters)
    while url:
        response = client.get(url, params)
        assert response.status_code == 200, response.content
        ids += [row["id"] for row in response.json()["results"]]
        url, params = response.json()["next"], {}
    return ids


def streamed(response: Any) -> str:
    return b"".join(response.streaming_content).decode()


def csv_ids(client: Client, url: str = "/audit/export.csv", **filters: str) -> list[int]:
    response = client.get(url, filters)
    assert response.status_code == 200 and response.streaming
    rows = list(csv.DictReader(io.StringIO(streamed(response))))
    return [int(r["id"]) for r in rows]


def jsonl_ids(client: Client, url: str = "/audit/export.jsonl", **filters: str) -> list[int]:
    response = client.get(url, filters)
    assert response.status_code == 200 and response.streaming
    lines = streamed(response).splitlines()
    return [json.loads(line)["id"] for line in lines]


def lead_user():
    return b.user("lead", "audit.view_auditentry", "audit.export_auditentry")


def change_through_every_path(tmp_path: Path) -> RestartOperation:
    """One change by each path that writes to the catalog: a resize from the model's page (which starts a
    restart), the worker's run of that restart, an admin edit, an API edit and a command. Answers the restart,
    having checked that every catalog row the paths changed has its audit entry in its transaction."""
    root = b.user("root")
    root.is_superuser = root.is_staff = True
    root.save()
    operator = b.user("operator", "catalog.resize_model", "catalog.restart_model")
    with fleet_of(tmp_path) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        cls = b.gpu_class("l4-24g", memory_mib=23034, usable_mib=20000, capability="8.9")
        # What the builders wrote went straight to the database; from here on, everything is a path's.
        unaudited_before = set(changed_outside().values_list("id", flat=True))

        # page: a resize from the model's page, which starts a restart
        response = signed_in(operator).post(f"/models/{MODEL}/resize/", {"gpus": 2, "profile": "h100"})
        assert response.status_code in (204, 303), response.content
        operation = RestartOperation.objects.get()
        # worker: the restart run, as the worker runs it
        assert run_operation(operation.pk) == "succeeded"
        # admin
        response = signed_in(root).post(
            f"/admin/catalog/gpuclass/{cls.pk}/change/",
            {"name": "l4-24g", "memory_mib": 23034, "usable_mib": 21000, "compute_capability": "8.9"},
        )
        assert response.status_code == 302, response.content
        # API
        api = APIClient()
        api.force_authenticate(root)
        assert api.patch("/api/gpu-classes/l4-24g/", {"usable_mib": 21500}, format="json").status_code == 200
        # command
        call_command("gpus", MODEL, "1", "--in-place", "--no-wait", "--as", "root", stdout=io.StringIO())

    # Every catalog row the paths changed (PostgreSQL records them) has its audit entry in its transaction.
    assert set(changed_outside().values_list("id", flat=True)) == unaudited_before
    return operation


def filters_for_each_path(
    operation: RestartOperation, resize_ui: AuditEntry, by_via: dict[str, list[int]]
) -> dict[str, tuple[dict[str, str], list[int]]]:
    """For each path of ``change_through_every_path``, a filter that finds its entries, and their ids."""
    return {
        "page": ({"via": "ui", "action": "resize"}, [resize_ui.pk]),
        "worker": ({"via": "worker", "operation": str(operation.pk)}, sorted(by_via["worker"], reverse=True)),
        "admin": (
            {"who": "root", "via": "admin", "object_type": "gpuclass", "object": "l4-24g"},
            by_via["admin"],
        ),
        "api": ({"via": "api", "object_type": "gpuclass"}, by_via["api"]),
        "command": (
            {
                "via": "cli",
                "who": "root",
                "action": "resize",
                "object_type": "profile",
                "object": f"{MODEL}/h100",
            },
            list(
                AuditEntry.objects.filter(via="cli", action="resize", actor="root").values_list(
                    "id", flat=True
                )
            ),
        ),
        "request": (
            {"request_id": resize_ui.request_id},
            sorted(
                AuditEntry.objects.filter(request_id=resize_ui.request_id).values_list("id", flat=True),
                reverse=True,
            ),
        ),
        "today": (
            {"since": str(timezone.localdate()), "until": str(timezone.localdate()), "via": "admin"},
            by_via["admin"],
        ),
    }


@pytest.mark.django_db(
    transaction=True
)  # the worker's heartbeat thread reads the operation from its own connection
@pytest.mark.usefixtures("audit_flushable", "app_role")
def test_entries_from_every_path_are_found_by_their_filters_in_the_list_the_api_and_both_exports(tmp_path):
    # On PostgreSQL every path (and the worker) logs in as the application's role, which owns nothing
    # and may not change the log: app_role checks that.
    lead = lead_user()
    operation = change_through_every_path(tmp_path)
    by_via = {
        via: list(AuditEntry.objects.filter(via=via).values_list("id", flat=True))
        for via in ("ui", "worker", "admin", "api", "cli")
    }
    assert all(by_via.values()), by_via

    page = signed_in(lead)
    api = APIClient()
    api.force_authenticate(lead)
    resize_ui = AuditEntry.objects.get(via="ui", action="resize")
    for path, (filters, expected) in filters_for_each_path(operation, resize_ui, by_via).items():
        expected = sorted(expected, reverse=True)
        assert expected, path
        assert listed(page, **filters) == expected, path
        assert api_ids(api, **filters) == expected, path
        assert csv_ids(page, **filters) == sorted(expected), path
        assert jsonl_ids(page, **filters) == sorted(expected), path
        assert csv_ids(api, "/api/audit/export.csv", **filters) == sorted(expected), path
        assert jsonl_ids(api, "/api/audit/export.jsonl", **filters) == sorted(expected), path

    # the operation's entries: the resize that asked for it, the restart and every step the worker wrote
    grouped = set(listed(page, operation=str(operation.pk)))
    assert resize_ui.pk in grouped and set(by_via["worker"]) <= grouped
    yesterday = str(timezone.localdate() - timedelta(days=1))
    tomorrow = str(timezone.localdate() + timedelta(days=1))
    assert listed(page, until=yesterday) == [] and listed(page, since=tomorrow) == []
    assert api_ids(api, since=tomorrow) == [] and csv_ids(page, since=tomorrow) == []
    # the entry page: the resize with every other entry of its request (the restart it started), and
    # the restart's entry with the way to every entry of its operation
    started = AuditEntry.objects.get(action="restart_start", object_key=str(operation.pk))
    assert started.request_id == resize_ui.request_id
    entry_page = page.get(f"/audit/{resize_ui.pk}/")
    assert [e.pk for e, _ in entry_page.context["together"]] == sorted(
        AuditEntry.objects.filter(request_id=resize_ui.request_id).values_list("id", flat=True)
    )
    assert "The same request" in entry_page.content.decode() and started.pk in [
        e.pk for e, _ in entry_page.context["together"]
    ]
    assert f"?operation={operation.pk}" in page.get(f"/audit/{started.pk}/").content.decode()


def test_the_summary_says_a_resize_as_cards_in_the_operators_words(actor):
    profile = b.profile(b.llama_8b(), "h100")
    before = {"gpus_per_node": 1, "tp": 1, "nodes": 1, "pp": 0, "revision": 1, "args": []}
    after = {**before, "gpus_per_node": 2, "tp": 2, "revision": 2}
    with acting_as(Actor(via="cli", name="pytest")), transaction.atomic():
        entry = audit_record(
            action="resize", object_type="profile", object_key=str(profile), before=before, after=after
        )
        args = audit_record(
            action="update",
            object_type="profile",
            object_key=str(profile),
            before=before,
            after={**before, "args": ["--max-num-seqs", "8"], "revision": 2},
        )
    assert summarize(entry) == "llama-3.1-8b/h100: 1 → 2 cards"
    assert summarize(args) == "llama-3.1-8b/h100: arguments none → --max-num-seqs 8"


def test_the_entry_page_shows_the_changed_fields_and_folds_away_the_rest(actor):
    cls = b.gpu_class("l4-24g", memory_mib=23034, usable_mib=20000, capability="8.9")
    cls.usable_mib = 21000
    services.gpu_class_save(instance=cls)
    entry = AuditEntry.objects.get()
    response = signed_in(lead_user()).get(f"/audit/{entry.pk}/")
    assert response.status_code == 200
    rows = {row.field: row for row in response.context["rows"]}
    assert list(rows) == ["usable_mib"]
    assert rows["usable_mib"].changed and (rows["usable_mib"].before, rows["usable_mib"].after) == (
        "20000",
        "21000",
    )
    assert "memory_mib" in {row.field for row in response.context["unchanged"]}
    html = response.content.decode()
    assert 'class="changed"' in html and "l4-24g: usable memory (MiB) 20000 → 21000" in html
    assert "that did not change</summary>" in html
    assert "<dt>Action</dt><dd>changed</dd>" in html and "GPU class <strong>" in html


def test_the_filters_are_choices_in_the_operators_words_and_the_list_says_them_too(actor):
    cls = b.gpu_class("l4-24g", memory_mib=23034, usable_mib=20000, capability="8.9")
    cls.usable_mib = 21000
    services.gpu_class_save(instance=cls)
    client = signed_in(lead_user())
    page = client.get("/audit/").content.decode()
    assert '<option value="restart_start">restart asked</option>' in page
    assert '<option value="gpuclass">GPU class</option>' in page
    assert '<option value="cli">command</option>' in page
    listed = client.get("/audit/?action=update&object_type=gpuclass").content.decode()
    assert "<td>changed</td>" in listed and "<td>GPU class <strong>l4-24g</strong></td>" in listed
    assert "restart_start" not in listed.split("<table", 1)[1]
    wrong = client.get("/audit/?action=no_such_thing!").content.decode()
    assert "The filters are wrong, nothing is listed: Action: Select a valid choice" in wrong
    exported = list(csv.DictReader(io.StringIO(streamed(client.get("/audit/export.csv")))))
    assert exported and {r["via"] for r in exported} <= {"pages", "API", "admin", "command", "worker"}
    changed = [r for r in exported if r["object_key"] == "l4-24g"]
    assert [(r["action"], r["object_type"]) for r in changed] == [("changed", "GPU class")]
    # JSON Lines, read by programs, keeps the codes the API has.
    lines = [json.loads(x) for x in streamed(client.get("/audit/export.jsonl")).splitlines()]
    assert [(x["action"], x["object_type"]) for x in lines if x["object_key"] == "l4-24g"] == [
        ("update", "gpuclass")
    ]


def test_reading_needs_the_view_permission_and_exporting_the_export_permission(actor):
    with transaction.atomic():
        entry = audit_record(action="x", object_type="node", object_key="gpu-a")
    anonymous = Client()
    assert anonymous.get("/audit/").status_code == 302
    assert APIClient().get("/api/audit/").status_code in (401, 403)
    nobody = signed_in(b.user("operator2"))
    assert nobody.get("/audit/").status_code == 403
    assert nobody.get(f"/audit/{entry.pk}/").status_code == 403
    assert "Audit</a>" not in nobody.get("/").content.decode()
    reader = signed_in(b.user("reader", "audit.view_auditentry"))
    assert reader.get("/audit/").status_code == 200
    assert "Audit</a>" in reader.get("/").content.decode()
    assert reader.get("/audit/export.csv").status_code == 403
    api = APIClient()
    api.force_authenticate(b.user("reader2", "audit.view_auditentry"))
    assert api.get("/api/audit/").status_code == 200
    assert api.get("/api/audit/export.jsonl").status_code == 403


def test_a_bad_filter_is_an_error_naming_it_and_lists_nothing(actor):
    lead = signed_in(lead_user())
    response = lead.get("/audit/", {"since": "yesterday"})
    assert response.status_code == 400 and "since" in response.content.decode()
    response = lead.get("/audit/", {"since": "2026-02-02", "until": "2026-02-01"})
    assert response.status_code == 400 and "swap the dates" in response.content.decode()
    assert lead.get("/audit/export.csv", {"operation": "x"}).status_code == 400
    api = APIClient()
    api.force_authenticate(b.user("lead2", "audit.view_auditentry"))
    response = api.get("/api/audit/", {"via": "telepathy"})
    assert response.status_code == 400 and "Via: " in json.dumps(response.json())


def test_keyset_pages_walk_the_whole_filtered_log_both_ways(actor):
    with transaction.atomic():
        for i in range(130):
            audit_record(action="update" if i % 2 else "create", object_type="node", object_key=f"n{i}")
    lead = signed_in(lead_user())
    wanted = sorted(AuditEntry.objects.filter(action="update").values_list("id", flat=True), reverse=True)
    seen, response = [], lead.get("/audit/", {"action": "update"})
    while True:
        page = response.context["page"]
        seen += [e.pk for e in page.entries]
        if page.older is None:
            break
        response = lead.get("/audit/", {"action": "update", "before": page.older})
    assert seen == wanted
    oldest = lead.get("/audit/", {"action": "update", "after": 0}).context["page"]
    assert (
        [e.pk for e in oldest.entries] == wanted[-50:] and oldest.older is None and oldest.newer is not None
    )


def test_the_api_pages_by_cursor_so_entries_written_meanwhile_neither_repeat_nor_skip_one(actor):
    with transaction.atomic():
        for i in range(130):
            audit_record(action="update", object_type="node", object_key=f"n{i}")
    wanted = sorted(AuditEntry.objects.values_list("id", flat=True), reverse=True)
    api = APIClient()
    api.force_authenticate(b.user("lead2", "audit.view_auditentry"))
    first = api.get("/api/audit/", {"page_size": 50}).json()
    assert "cursor=" in first["next"] and first["previous"] is None
    seen = [row["id"] for row in first["results"]]
    with transaction.atomic():  # newer entries arrive between two pages: an offset would shift by them
        for i in range(7):
            audit_record(action="update", object_type="node", object_key=f"late{i}")
    url = first["next"]
    while url:
        body = api.get(url).json()
        seen += [row["id"] for row in body["results"]]
        url = body["next"]
    assert seen == wanted


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_history_panels_on_the_model_node_and_operation_pages(tmp_path):
    lead = b.user("lead", "audit.view_auditentry", "catalog.resize_model")
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2) as fleet:
        fleet.change_profile(args=["--max-num-seqs", "8"])
        client = signed_in(lead)
        model_page = client.get(f"/models/{MODEL}/").content.decode()
        assert "History" in model_page and f"{MODEL}/h100: arguments none → --max-num-seqs 8" in model_page
        profile = Profile.objects.get()
        with acting_as(Actor(via="cli", name="pytest")):
            from operations.services.start import restart_start

            fleet.start("llama-1", "gpu-a", [0])
            fleet.change_profile(args=["--max-num-seqs", "16"])
            op = restart_start(model_name=MODEL)
        operation_page = client.get(f"/operations/{op.pk}/").content.decode()
        assert "History" in operation_page and f"restart #{op.pk}" in operation_page
        assert profile.pk
        with acting_as(Actor(via="cli", name="pytest")):
            # A node's state changes by cordon, uncordon and drain only.
            from operations.services.drain import node_cordon

            node_cordon(node_name="gpu-a")
        node_page = client.get("/nodes/gpu-a/").content.decode()
        assert "History" in node_page and "gpu-a: state ready → cordoned" in node_page
    # no panel for who may not read the log
    other = signed_in(b.user("viewer"))
    assert "History" not in other.get(f"/models/{MODEL}/").content.decode()


@pytest.mark.postgres
def test_the_filtered_newest_and_oldest_pages_are_index_range_scans(actor):
    """What the bench (bench/audit_log.py) shows at a million entries, asserted where a small table allows:
    with sequential scans and sorts priced out, each page's query is a range scan of an index that gives the
    id order, and never sorts the log."""
    from audit.selectors import entries_matching

    with transaction.atomic():
        for i in range(200):
            audit_record(action="update", object_type="profile" if i % 2 else "node", object_key=f"k{i}")
    qs = entries_matching({"object_type": "profile", "action": "update"}).order_by()
    with connection.cursor() as cursor:
        # No ANALYZE: only the table's owner may, and the application's role the suite logs in as does not
        # own it; with scans and sorts priced out, the plan needs no statistics to show the index.
        # Priced out, not forbidden: were there no index giving the id order, the plan would still sort.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        for query in (qs.order_by("-id")[:50], qs.filter(id__gt=0).order_by("id")[:50]):
            sql, params = query.query.sql_with_params()
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Index" in plan and "Sort" not in plan and "Seq Scan" not in plan, plan
