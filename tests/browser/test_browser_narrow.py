"""The operator's lists at a narrow window (800 px, a laptop split in two): the model page with its
replicas, the operations list and the audit list fit without a sideways scroll (static/css/operator.css);
the card-memory bar's legend gives each term its own colour."""

from __future__ import annotations

import pytest

from base.actor import Actor, acting_as
from catalog.models import Profile
from catalog.services import catalog as services
from operations.services.start import restart_start
from tests.browser.browser_support import PASSWORD, sign_in
from tests.support import builders as b

pytestmark = [
    pytest.mark.browser,
    pytest.mark.deployed_hasher,  # the user signs in through the form
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("audit_flushable"),
]

NARROW = {"width": 800, "height": 900}


def test_the_model_page_the_operations_list_and_the_audit_list_fit_800_px(page, demo, shots):
    with acting_as(Actor(via="cli", name="pytest")):
        profile = Profile.objects.get(model__name="llama-3.1-8b", name="h100")
        profile.args = [*profile.args, "--max-num-seqs", "64"]
        services.profile_save(instance=profile)
        restart_start(model_name="llama-3.1-8b", cause="the narrow window's test", ready_timeout=30)
    b.user(
        "lead",
        "audit.view_auditentry",
        "audit.export_auditentry",
        "catalog.view_servedmodel",
        "catalog.restart_model",
        "catalog.resize_model",
        password=PASSWORD,
    )
    sign_in(page, "lead")
    page.set_viewport_size(NARROW)
    for path, what, shot in [
        ("/models/llama-3.1-8b/", "table.replicas", "narrow-model.png"),
        ("/operations/", "table", "narrow-operations.png"),
        ("/audit/", "table.audit-list", "narrow-audit.png"),
    ]:
        page.goto(path)
        page.locator(what).first.wait_for()
        widths = page.evaluate(
            "({scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth})"
        )
        assert widths["scroll"] <= widths["client"], (path, widths)
        page.screenshot(path=shots / shot, full_page=True)
        if path.startswith("/models/"):
            # The card-memory bar's legend: each term its own colour, as in the bar.
            keys = page.locator(".membar").first.locator("figcaption .swatch")
            colours = keys.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
            assert len(colours) >= 4 and len(set(colours)) == len(colours), colours
