"""The pages in a real headless Chromium against a live server and real agents with stand-in
engines: planned against measured memory, restarts, drains, moves and rollbacks seen live, the
engine's log, the nodes grid, and the leads' audit log at a laptop's width."""

from __future__ import annotations

import re

import pytest

from audit.models import AuditEntry
from base.actor import Actor, acting_as
from catalog.models import Card, Profile, Replica
from operations.models import RestartOperation
from tests.browser.browser_support import LAPTOP, MARKER, PASSWORD, operator, sign_in
from tests.support import builders as b

pytestmark = [
    pytest.mark.browser,
    pytest.mark.deployed_hasher,  # an operator signs in through the form
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("audit_flushable"),
]


def test_a_replica_started_on_the_standin_shows_planned_and_measured_memory(
    page, tmp_path, fast_restarts, shots
):
    from operations.services.runner import run_operation
    from operations.services.start import restart_start
    from tests.support.restart import MODEL, fleet_of

    gib = 2**30
    # The stand-in prints vLLM's start-up memory lines with these figures; the
    # agent reads them from its log, the worker keeps them on the replica.
    memory = "weights=14.96,non_torch=0.30,activation=1.26,kv_cache=53.29,cuda_graph=0.64,total=79.65,fraction=0.9,context=8192,sequences=13.3"
    with fleet_of(
        tmp_path, nodes=("gpu-a",), cards=2, env={"STANDIN_MEMORY": memory}, processes=True
    ) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "64"])  # any allowed change makes it stale
        with acting_as(Actor(via="cli", name="pytest")):
            op = restart_start(model_name=MODEL, ready_timeout=30)
        assert run_operation(op.pk) == "succeeded"
        new = op.steps.get().new_replica
        new.refresh_from_db()
        assert new.measured_memory["weights"] == round(14.96 * gib)
        assert new.planned_memory["weights"] == 16_060_522_496

        b.user("viewer", "catalog.view_servedmodel", password=PASSWORD)
        sign_in(page, "viewer")
        page.goto(f"/models/{MODEL}/")
        page.get_by_role("link", name=new.name).click()
        page.wait_for_url(re.compile(rf"/replicas/{new.name}/$"))
        table = page.locator("table.memory-compare")
        table.wait_for()
        weights = table.locator("tr.term-weights")
        assert weights.locator("td.planned").inner_text() == "14.96 GiB"
        assert weights.locator("td.measured").inner_text() == "14.96 GiB"
        kv = table.locator("tr.term-kv")
        # planned: the model's 131072 tokens x 131072 bytes = 16 GiB (a profile may not set the
        # context flag: that is the context operation's); measured: 53.29 GiB over 13.3 sequences
        assert kv.locator("td.planned").inner_text() == "16.00 GiB"
        assert kv.locator("td.measured").inner_text() == f"{53.29 / 13.3:.2f} GiB"
        assert table.locator("tr.term-activation td.measured").inner_text() == "1.26 GiB"
        assert "planned when it started" in page.locator("#memory").inner_text()
        page.screenshot(path=shots / "replica-memory.png", full_page=True)


def test_the_replicas_table_changes_with_the_restart_card(page, tmp_path, fast_restarts, shots):
    """A real restart on the stand-in: the model page's replicas table follows the live card without
    a reload; the replacement is named by the model's own count, the stopped replica is folded away,
    cards read as cards, and the card says what caused the restart and the revision it goes to."""
    from operations.services.runner import run_operation
    from tests.support.restart import MODEL, fleet_of

    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2, processes=True) as fleet:
        fleet.start(f"{MODEL}-1", "gpu-a", [0])
        fleet.change_profile(args=["--max-num-seqs", "64"])  # revision 2: the replica is stale
        operator()
        sign_in(page, "operator")
        page.goto(f"/models/{MODEL}/")
        page.evaluate(f"{MARKER} = 'still here'")
        table = page.locator("#replicas")
        assert table.locator("tr.replica.state-ready td.cards").inner_text() == "1 card (#0)"
        page.get_by_role("button", name=re.compile("^Restart 1 stale replica")).click()
        page.locator(".message.success").wait_for()
        op = RestartOperation.objects.get(model__name=MODEL)
        panel = page.locator(f"#operation-{op.pk}")
        assert "stale replicas (at revision 1): llama-1" in panel.locator(".cause").inner_text()
        assert "revision 2 of h100" in panel.locator(".cause").inner_text()

        assert run_operation(op.pk) == "succeeded"  # the worker's part, while the page polls
        page.locator(f"#operation-{op.pk}:not([hx-trigger])").wait_for()
        # The table follows the card: after its last poll, llama-1 is folded away among the stopped
        # (a poll during the run may show both ready for a moment, before the old one stops).
        page.locator(
            "#replicas details.stopped-replicas tr.replica.state-stopped", has_text=f"{MODEL}-1"
        ).wait_for(state="attached")
        page.locator("#replicas tr.replica.state-ready", has_text=f"{MODEL}-2").wait_for()
        assert page.evaluate(MARKER) == "still here"  # swapped in, not reloaded
        ready = table.locator("tr.replica.state-ready")
        assert ready.count() == 1
        assert ready.locator("td.cards").inner_text() == "1 card (#1)"
        stopped = table.locator("details.stopped-replicas")
        assert stopped.locator("summary").inner_text() == "1 stopped replica"
        assert not stopped.locator("tr.replica.state-stopped", has_text=f"{MODEL}-1").is_visible()
        stopped.locator("summary").click()
        row = stopped.locator("tr.replica.state-stopped")
        assert row.locator("td.cards").inner_text() == "none: stopped"
        assert "no cards" not in table.inner_text()
        page.screenshot(path=shots / "restart-replicas.png", full_page=True)

        page.goto("/operations/")
        line = page.locator("table.list tbody tr").first
        assert "stale replicas (at revision 1): llama-1" in line.locator("td.cause").inner_text()
        assert line.locator("td.num").first.inner_text() == "2"
        page.goto(f"/operations/{op.pk}/")
        assert "1 card (#1)" in page.locator(f"#operation-{op.pk} table").inner_text()


def test_a_resize_names_its_cause_and_the_list_shows_the_served_context(page, demo):
    operator()
    sign_in(page, "operator")
    page.goto("/")
    row = page.locator("#model-results tr", has=page.get_by_role("link", name="llama-3.1-8b", exact=True))
    # The profile serves 32768 tokens (its --max-model-len); the model could take 131072.
    assert row.locator("td.served-context").inner_text().split() == ["32768", "of", "131072"]
    page.goto("/models/llama-3.1-8b/")
    page.get_by_label("Cards per replica").fill("2")
    page.get_by_role("button", name="Apply: 2 cards").click()
    page.locator(".message.success").wait_for()
    op = RestartOperation.objects.get(model__name="llama-3.1-8b")
    cause = page.locator(f"#operation-{op.pk} .cause").inner_text()
    assert "resize of h100: 1 → 2 cards" in cause and "revision 2 of h100" in cause


def test_the_page_says_its_refusals_in_its_own_words(page, demo):
    operator()
    sign_in(page, "operator")
    page.goto("/models/llama-3.1-70b/")
    page.get_by_label("Cards per replica").fill("8")
    refusal = page.locator("#resize-preview .refusal")
    refusal.wait_for()
    text = refusal.inner_text()
    # The API's field name is not the page's: its checkbox says "In place".
    assert "in_place" not in text and "Restarting in place stops each replica" in text


def test_the_nodes_grid_shows_each_cards_memory_used_beside_the_plan_and_marks_a_foreign_process(
    page, tmp_path, fast_restarts, shots
):
    """Real agents read the stand-in nvidia-smi (as they read nvidia-smi on a GPU node); the
    control plane samples them; the grid draws used against planned and marks the foreign card."""
    from agent_fakes import foreign_process

    from telemetry.services import fleet_sample
    from tests.support.restart import fleet_of

    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), cards=4, gpus=True, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-b", [1])
        with foreign_process(fleet.gpu_dirs["gpu-b"], [3], used_mib=20480):
            assert fleet_sample() == {"gpu-a": True, "gpu-b": True}
            b.user("viewer", password=PASSWORD)
            sign_in(page, "viewer")
            page.goto("/nodes/")
            held = page.locator(".card.held")
            assert held.count() == 2
            for i in range(2):
                line = held.nth(i).locator(".use").inner_text()
                assert line.startswith("used 71.7 of 79.6 GiB · planned ") and "%" in line and "°C" in line
                assert held.nth(i).locator(".usebar .used").is_visible()
                assert held.nth(i).locator(".usebar .planned").count() == 1
            foreign = page.locator(".card.foreign")
            assert foreign.count() == 1
            assert "foreign process: 20.0 GiB" in foreign.inner_text()
            assert "card 3" in foreign.inner_text().lower()  # shown in capitals by the style sheet
            assert page.locator(".node-head .seen").first.inner_text().startswith("agent seen ")
            page.screenshot(path=shots / "nodes-telemetry.png", full_page=True)


def test_draining_a_node_moves_its_replicas_and_leaves_it_empty_and_cordoned(
    page, tmp_path, fast_restarts, shots
):
    """Real agents: the operator drains gpu-a from its page; the drain's restart moves both its
    replicas to gpu-b, rolling, and gpu-a is left cordoned with nothing on it; uncordon reopens it."""
    from operations.services.runner import run_operation
    from tests.support.restart import fleet_of

    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), cards=4, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        fleet.start("llama-2", "gpu-a", [1])
        operator()
        sign_in(page, "operator")
        page.goto("/nodes/gpu-a/")
        page.get_by_role("button", name="Drain gpu-a…").click()
        # First where each replica would go, nothing changed yet; then the operator confirms.
        preview = page.locator(".move-preview")
        preview.wait_for()
        assert "llama-1" in preview.inner_text() and "gpu-b" in preview.inner_text()
        assert not RestartOperation.objects.exists()
        page.get_by_role("button", name="Drain gpu-a", exact=True).click()
        page.locator(".message.success").wait_for()
        assert (
            "Cordoned, and moving its replicas to other nodes"
            in page.locator(".message.success").inner_text()
        )
        op = RestartOperation.objects.get()
        assert op.cause == "drain of gpu-a: llama-1, llama-2" and op.in_place is False
        assert page.locator(f"#operation-{op.pk}").is_visible()  # the drain's progress, on the node's page
        assert "Cordoned: no new replica is placed on gpu-a" in page.locator("main").inner_text()

        assert run_operation(op.pk) == "succeeded"
        page.locator(f"#operation-{op.pk}:not([hx-trigger])").wait_for()
        page.reload()
        assert "No replica holds a card on this node." in page.locator("main").inner_text()
        assert page.locator(".page-head .badge.state-cordoned").inner_text() == "Cordoned"
        moved = Replica.objects.filter(state="ready")
        assert sorted(moved.values_list("shards__card__node__name", flat=True)) == ["gpu-b", "gpu-b"]
        assert fleet.ready_on_agents() == {"gpu-a": 0, "gpu-b": 2}
        assert AuditEntry.objects.filter(action="cordon", object_key="gpu-a", via="ui").count() == 1
        page.screenshot(path=shots / "node-drained.png", full_page=True)

        page.get_by_role("button", name="Uncordon gpu-a").click()
        page.locator(".message.success").wait_for()
        assert page.locator(".page-head .badge.state-ready").count() == 1


def test_a_replicas_page_shows_its_engine_log_live_while_it_starts_with_secrets_redacted(
    page, tmp_path, fast_restarts
):
    from operations.services.specs import replica_spec
    from tests.support.restart import fleet_of

    secret = "hf_" + "t" * 32  # the stand-in logs its Hub token, as a careless engine would
    with fleet_of(
        tmp_path, nodes=("gpu-a",), cards=2, env={"HF_TOKEN": secret}, load_seconds=8, processes=True
    ) as fleet:
        replica = b.replica(
            fleet.profile,
            fleet.nodes["gpu-a"],
            [0],
            name="llama-1",
            port=fast_restarts.LLMGW_REPLICA_PORT_BASE,
        )
        Replica.objects.filter(pk=replica.pk).update(state="starting")
        spec = replica_spec(
            Profile.objects.select_related("model").get(pk=fleet.profile.pk), port=replica.port, cards=[0]
        )
        # Signed in before the engine starts: on a loaded machine a sign-in can outlast its loading,
        # and the page would then find it ready, with nothing live to show.
        b.user("viewer", "catalog.view_servedmodel", password=PASSWORD)
        sign_in(page, "viewer")
        with fleet.agents["gpu-a"].client() as http:
            assert http.put("/v1/replicas/llama-1", json=spec).status_code == 201
        page.goto("/replicas/llama-1/")
        live = page.locator("#replica-log[data-polling]")
        live.wait_for()
        assert "live while it loading" in live.inner_text() or "live while it starting" in live.inner_text()
        done = page.locator("#replica-log:not([data-polling]) pre.log")
        done.wait_for(timeout=30_000)  # it stops polling once the agent says it is ready
        text = done.inner_text()
        assert "listening on" in text and "with token ***" in text
        assert secret not in page.content()


def test_a_resize_whose_restart_failed_is_rolled_back_from_its_page(page, tmp_path, fast_restarts, shots):
    """A resize saved at revision 2 whose restart failed: its page says how to roll back, the button
    shows the rollback's plan and then does it: the profile at its old settings as revision 3, the
    replica current without a restart (it never left revision 1's settings), both in the audit log."""
    from audit.services import snapshot
    from catalog.models import Node
    from catalog.services.catalog import SERVING_FIELDS
    from operations.services.rollback import revisions
    from operations.services.runner import run_operation
    from tests.support.restart import MODEL, fleet_of

    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2, processes=True) as fleet:
        fleet.start(f"{MODEL}-1", "gpu-a", [0])
        # The node's record lists two cards more than its agent has: a replica placed on them fails to start.
        node = Node.objects.get(name="gpu-a")
        for index in (2, 3):
            Card.objects.create(node=node, index=index, gpu_class=fleet.profile.gpu_class)
        with fleet.agents["gpu-a"].client() as http:
            running = http.get(f"/v1/replicas/{MODEL}-1").json()
        operator()
        sign_in(page, "operator")
        page.goto(f"/models/{MODEL}/")
        page.get_by_label("Cards per replica").fill("2")
        page.locator("#resize-preview .preview.ok").wait_for()
        page.get_by_role("button", name="Apply: 2 cards").click()
        page.locator(".message.success").wait_for()
        resize = RestartOperation.objects.get(model__name=MODEL)
        assert run_operation(resize.pk) == "failed"  # the worker's part: the agent has no card 2
        assert Profile.objects.get(pk=fleet.profile.pk).revision == 2
        assert Replica.objects.get(name=f"{MODEL}-1", state="ready").revision == 1

        page.goto(f"/operations/{resize.pk}/")
        note = page.locator(".rollback")
        assert "its replicas still run revision 1" in note.inner_text()
        page.screenshot(path=shots / "restart-failed-rollback.png", full_page=True)
        note.get_by_role("button", name="Roll back h100 to revision 1").click()
        # The dry run first: the replica runs revision 1's settings, so it adopts revision 3 as it runs.
        adopted = page.locator(".rollback-plan tr.adopted")
        assert f"{MODEL}-1" in adopted.inner_text() and "no restart" in adopted.inner_text()
        assert page.locator(".rollback-plan tr.restarted").count() == 0
        assert Profile.objects.get(pk=fleet.profile.pk).revision == 2  # nothing saved yet
        page.screenshot(path=shots / "rollback-plan.png", full_page=True)
        page.get_by_role("button", name="Roll back to revision 1 now").click()
        said = page.locator(".message.success")
        said.wait_for()
        assert "is at revision 3, with revision 1's settings" in said.inner_text()
        assert f"{MODEL}-1 runs them already and took it without a restart" in said.inner_text()

        profile = Profile.objects.get(pk=fleet.profile.pk)
        assert (profile.revision, profile.gpus_per_node, profile.tp) == (3, 1, 1)
        # Every serving setting is revision 1's again, as the audit log recorded it.
        by_number = {r.number: r.settings for r in revisions(profile)}
        assert (
            {f: snapshot(profile)[f] for f in SERVING_FIELDS} == by_number[1] == by_number[3] != by_number[2]
        )
        live = Replica.objects.filter(profile=profile, state__in=Replica.LIVE_STATES)
        assert [(r.name, r.revision) for r in live] == [(f"{MODEL}-1", 3)]  # current
        # Not restarted: no operation for the rollback, and the agent runs the very same process.
        assert list(RestartOperation.objects.values_list("pk", flat=True)) == [resize.pk]
        with fleet.agents["gpu-a"].client() as http:
            now = http.get(f"/v1/replicas/{MODEL}-1").json()
        assert (now["state"], now["pid"], now["port"], now["started_at"]) == (
            "ready",
            running["pid"],
            running["port"],
            running["started_at"],
        )
        assert AuditEntry.objects.filter(action="resize", via="ui", actor="operator").count() == 1
        entry = AuditEntry.objects.get(action="rollback", via="ui", actor="operator")
        assert (entry.before["tp"], entry.after["tp"], entry.after["revision"]) == (2, 1, 3)
        adopt = AuditEntry.objects.get(action="adopt", object_key=f"{MODEL}-1", via="ui", actor="operator")
        assert (adopt.before["revision"], adopt.after["revision"]) == (1, 3)
        assert "without a restart: it runs revision 1's settings, the same" in adopt.message


def test_a_lead_reads_the_audit_log_at_a_laptops_width_with_its_messages_and_whole_request_ids(page, shots):
    """The leads' own page, from the menu: the summary and the message of each entry, and the request id
    whole, every column inside 1366 px (the admin's list cut the id off and had no message)."""
    from catalog.models import GPUClass
    from catalog.services import catalog as services

    actor = Actor(via="api", name="pytest")
    with acting_as(actor):
        cls = services.gpu_class_save(
            instance=GPUClass(name="h100-80g", memory_mib=81559, usable_mib=79000, compute_capability="9.0")
        )
        cls.usable_mib = 78000
        services.gpu_class_save(instance=cls)
    b.user(
        "lead",
        "audit.view_auditentry",
        "audit.export_auditentry",
        "catalog.view_servedmodel",
        password=PASSWORD,
    )
    sign_in(page, "lead")
    page.get_by_role("link", name="Audit", exact=True).click()
    page.wait_for_url(re.compile(r"/audit/$"))
    rows = page.locator("table.audit-list tbody tr")
    assert rows.count() == 2
    newest = rows.first
    assert "h100-80g: usable memory (MiB) 79000 → 78000" in newest.locator("td.summary").inner_text()
    request_id = newest.locator("td.request-id")
    assert request_id.inner_text() == actor.request_id and len(actor.request_id) == 32
    box = request_id.bounding_box()
    assert box is not None and box["x"] + box["width"] <= LAPTOP["width"]
    assert request_id.evaluate("e => e.scrollWidth <= e.clientWidth")  # not cut off
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]  # no sideways scroll
    page.screenshot(path=shots / "audit-list.png", full_page=True)
    request_id.get_by_role("link").click()
    page.wait_for_url(re.compile(r"request_id=" + actor.request_id))
    assert rows.count() == 2  # both entries of the one request


def test_an_operator_moves_a_replica_from_its_page_to_another_node(page, tmp_path, fast_restarts):
    from operations.services.runner import run_operation
    from tests.support.restart import fleet_of

    with fleet_of(tmp_path, nodes=("gpu-a", "gpu-b"), cards=4, processes=True) as fleet:
        fleet.start("llama-1", "gpu-a", [0])
        operator()
        sign_in(page, "operator")
        page.goto("/replicas/llama-1/")
        page.get_by_role("button", name="Move…").click()
        # The plan first, nothing changed yet; then the confirmation.
        page.locator("table.moves", has_text="gpu-b").wait_for()
        assert not RestartOperation.objects.exists()
        page.get_by_role("button", name="Move llama-1").click()
        page.locator(".message.success").wait_for()
        op = RestartOperation.objects.get()
        assert op.cause == "move of llama-1 off gpu-a"
        assert run_operation(op.pk) == "succeeded"
        page.locator(f"#operation-{op.pk}:not([hx-trigger])").wait_for()
        # The table follows the card: once it has ended, llama-1 is folded away among the stopped.
        page.locator(
            "#replicas details.stopped-replicas tr.replica.state-stopped", has_text="llama-1"
        ).wait_for(state="attached")
        assert "gpu-b" in page.locator("#replicas tr.replica.state-ready", has_text="llama-2").inner_text()
