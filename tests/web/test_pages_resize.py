"""The resize and context previews on a model's page (the API's sentences, with status 200), and apply:
saved and audited once through the pages, checked again on the server."""

from __future__ import annotations

import html

import pytest

from audit.models import AuditEntry
from catalog.models import Profile, ServedModel
from tests.web.pages_support import HX, api_detail, big_on_h100, llama_on_h100

pytestmark = pytest.mark.django_db


# -- the resize and context previews ----------------------------------------------------------------------


def test_a_count_that_fits_previews_before_after_the_bar_and_the_nodes_with_room(operator):
    llama_on_h100()
    response = operator.post("/models/llama-3.1-8b/resize/preview/", {"gpus": "4", "profile": "h100"}, **HX)
    assert response.status_code == 200
    text = response.content.decode()
    assert "<html" not in text
    assert "1 → <strong>4</strong> cards" in text
    # 3.74 + 1.0 + outside PyTorch 0.35 + NVLink buffers 1.8 + CUDA graphs 1
    assert "weights 3.7 GiB" in text and "7.9 GiB per card of 71.7 GiB usable" in text
    assert "communication buffers 1.8 GiB" in text
    # the whole argument list the engine gets, the TP width included (the program itself is the
    # node agent's own, from its configuration: the launch policy never takes it from the catalog)
    assert '<code class="launch">meta-llama/Llama-3.1-8B-Instruct --port {port}' in text
    assert "--tensor-parallel-size 4 --max-model-len 32768" in text
    assert "<code>--max-model-len 32768</code>" in text
    assert "Room beside the running replicas on <strong>gpu-1, gpu-2</strong>" in text
    assert 'hx-post="/models/llama-3.1-8b/resize/"' in text and "Apply: 4 cards" in text
    assert Profile.objects.get().revision == 1  # a dry run


@pytest.mark.parametrize(
    ("model", "body", "code"),
    [
        ("big-70b", {"gpus": 1}, "memory"),
        ("big-70b", {"gpus": 3}, "heads"),
        ("big-70b", {"gpus": 65}, "gpus_range"),
        ("big-70b", {"gpus": 2}, "unchanged"),
        ("big-70b", {"gpus": 16}, "too_few_cards"),
        ("big-70b", {"tokens": 10_000_000}, "context_range"),
    ],
)
def test_a_refused_preview_answers_200_with_the_apis_sentence(operator, model, body, code):
    big_on_h100()
    sentence = api_detail(model, body)
    kind = "resize" if "gpus" in body else "context"
    response = operator.post(f"/models/{model}/{kind}/preview/", {**body, "profile": "h100"}, **HX)
    assert response.status_code == 200
    text = response.content.decode()
    assert "<html" not in text
    assert html.escape(sentence) in text, (sentence, text)
    assert "Apply" not in text


def test_a_memory_refusal_shows_the_overflowing_bar_and_both_ways_out(operator):
    big_on_h100()
    text = operator.post(
        "/models/big-70b/resize/preview/", {"gpus": 1, "profile": "h100"}, **HX
    ).content.decode()
    assert '<figure class="membar over">' in text and 'class="limit"' in text
    assert "more than the 71.7 GiB usable on each" in text
    assert "Two ways out: more cards (2 cards would hold it), or a shorter context" in text


def test_the_context_preview_uses_the_same_rules(operator):
    llama_on_h100()
    text = operator.post(
        "/models/llama-3.1-8b/context/preview/", {"tokens": 131072, "profile": "h100"}, **HX
    ).content.decode()
    assert "32768 → <strong>131072</strong> tokens" in text
    assert "KV cache 16.0 GiB (131072 tokens)" in text
    assert "<code>--max-model-len 131072</code>" in text
    assert 'hx-post="/models/llama-3.1-8b/context/"' in text


def test_the_preview_says_once_what_it_could_not_check(operator):
    m = llama_on_h100()
    ServedModel.objects.filter(pk=m.pk).update(weight_bytes=None)
    text = operator.post(
        "/models/llama-3.1-8b/resize/preview/", {"gpus": 2, "profile": "h100"}, **HX
    ).content.decode()
    assert "Not checked" in text
    assert text.count("weight bytes are not known, so what each card holds is not checked.") == 1
    assert "membar" not in text and "Apply: 2 cards" in text


def test_what_is_not_a_whole_number_is_refused_in_the_preview(operator):
    llama_on_h100()
    response = operator.post(
        "/models/llama-3.1-8b/resize/preview/", {"gpus": "four", "profile": "h100"}, **HX
    )
    assert response.status_code == 200 and b"A card count is a whole number." in response.content


def test_the_preview_without_htmx_renders_the_whole_page_with_the_preview(operator):
    llama_on_h100()
    response = operator.post("/models/llama-3.1-8b/resize/preview/", {"gpus": 2, "profile": "h100"})
    text = response.content.decode()
    assert response.status_code == 200 and text.lstrip().startswith("<!doctype html>")
    assert "1 → <strong>2</strong> cards" in text and 'value="2"' in text


# -- apply ------------------------------------------------------------------------------------------------


def test_apply_saves_the_profile_audits_once_through_the_pages_and_goes_back_to_the_model(
    operator, operator_user
):
    llama_on_h100()
    response = operator.post("/models/llama-3.1-8b/resize/", {"gpus": 2, "profile": "h100"}, **HX)
    assert response.status_code == 204
    assert response["HX-Location"] == "/models/llama-3.1-8b/#restart"
    profile = Profile.objects.get()
    assert (profile.revision, profile.tp, profile.gpus_per_node) == (2, 2, 2)
    entries = AuditEntry.objects.filter(action="resize")
    assert entries.count() == 1
    entry = entries.get()
    assert (entry.via, entry.actor, entry.user_id) == ("ui", "operator", operator_user.pk)
    assert entry.before["tp"] == 1 and entry.after["tp"] == 2
    page = operator.get("/models/llama-3.1-8b/").content.decode()
    assert "llama-3.1-8b/h100: 1 → 2 cards, saved as revision 2." in page


def test_apply_without_htmx_redirects_with_303(operator):
    llama_on_h100()
    response = operator.post("/models/llama-3.1-8b/context/", {"tokens": 65536, "profile": "h100"})
    assert response.status_code == 303 and response["Location"] == "/models/llama-3.1-8b/#restart"
    assert Profile.objects.get().args == ["--max-model-len", "65536"]
    assert AuditEntry.objects.filter(action="set_context", via="ui").count() == 1


def test_apply_is_checked_again_on_the_server_and_saves_nothing_when_refused(operator):
    big_on_h100()
    response = operator.post("/models/big-70b/resize/", {"gpus": 1, "profile": "h100"}, **HX)
    assert response.status_code == 200 and b"Does not fit:" in response.content
    assert Profile.objects.get().revision == 1
    assert not AuditEntry.objects.filter(via="ui").exists()


def test_apply_refuses_a_declared_model_even_when_posted_by_hand(operator):
    m = llama_on_h100()
    ServedModel.objects.filter(pk=m.pk).update(declared=True)
    response = operator.post("/models/llama-3.1-8b/resize/", {"gpus": 2, "profile": "h100"}, **HX)
    assert response.status_code == 200 and b"read-only here" in response.content
    assert Profile.objects.get().revision == 1
