"""The stand-in engine's STANDIN_* variables (never ready, crash after, ignore SIGTERM, the memory it
reports) are the stand-in's alone: a real engine's profile naming one is refused, saying so, on the
API as on every write path, and the agent refuses such a spec too. STANDIN_MEMORY's figures are
named ones only, each once, each within its bounds."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmgw_policy import PolicyError, check_profile, default_policy, load_policy
from rest_framework.test import APIClient

from audit.models import AuditEntry
from catalog.models import Profile
from tests.support import builders as b

POLICY = default_policy()
STANDIN_VARIABLES = {
    "STANDIN_LOAD_SECONDS": "1",
    "STANDIN_NEVER_READY": "1",
    "STANDIN_EXIT_AT_START": "3",
    "STANDIN_CRASH_AFTER": "5",
    "STANDIN_IGNORE_SIGTERM": "1",
    "STANDIN_GENERATION_FAILS": "1",
    "STANDIN_MEMORY": "weights=1.5",
}
REAL_ENGINES = sorted(name for name in POLICY.engines if name != "standin")


@pytest.mark.parametrize("engine", REAL_ENGINES)
@pytest.mark.parametrize("name", sorted(STANDIN_VARIABLES))
def test_no_real_engine_takes_a_standin_variable(engine, name):
    (refusal,) = check_profile(POLICY, engine, [], {name: STANDIN_VARIABLES[name]})
    assert refusal.code == "refused_env" and refusal.subject == name
    assert f"{name} is refused for {engine}" in refusal.sentence
    assert "only a profile of engine standin sets them" in refusal.sentence


def test_the_standin_engine_takes_them_all():
    assert check_profile(POLICY, "standin", ["--max-num-seqs", "8"], STANDIN_VARIABLES) == []


@pytest.mark.django_db
def test_a_vllm_profile_naming_one_is_refused_by_the_api_and_nothing_is_saved():
    profile = b.profile(b.llama_8b("llama"), "h100")
    client = APIClient()
    client.force_authenticate(b.user("editor", roles=("editor",)))
    response = client.patch(
        f"/api/profiles/{profile.pk}/", {"env": {"STANDIN_IGNORE_SIGTERM": "1"}}, format="json"
    )
    assert response.status_code == 400, response.content
    assert "STANDIN_IGNORE_SIGTERM is refused for vllm" in response.json()["detail"]
    assert Profile.objects.get(pk=profile.pk).env == {} and not AuditEntry.objects.exists()
    standin = b.profile(b.llama_8b("llama-standin"), "h100", engine="standin")
    taken = client.patch(
        f"/api/profiles/{standin.pk}/", {"env": {"STANDIN_IGNORE_SIGTERM": "1"}}, format="json"
    )
    assert taken.status_code == 200, taken.content


FULL = "weights=14.96,non_torch=0.35,activation=1.26,kv_cache=53.29,cuda_graph=0.64,total=79.22,fraction=0.9,context=8192,sequences=13.3"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("weights=1,path=2", "names the figure 'path', which is not one of"),
        ("weights=1,weights=2", "names the figure 'weights' twice"),
        ("weights=99999999", "has weights=99999999, above 16777216"),
        ("context=8192.5", "has context=8192.5, which must be a whole number"),
        ("weights=-1", "must be name=number pairs"),
        ("weights=1e3", "must be name=number pairs"),
        ("weights=1;rm -rf /", "must be name=number pairs"),
        ("", "must be 1 to 32 name=number pairs"),
        (",".join(["weights=1"] * 33), "must be 1 to 32 name=number pairs"),
    ],
)
def test_standin_memory_takes_only_its_named_figures_within_bounds(value, problem):
    (refusal,) = check_profile(POLICY, "standin", [], {"STANDIN_MEMORY": value})
    assert problem in refusal.sentence, refusal.sentence


def test_standin_memory_takes_every_figure_the_standin_prints():
    assert check_profile(POLICY, "standin", [], {"STANDIN_MEMORY": FULL}) == []


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ('{ value = "figures", min = 0, max = 1, src = "standin" }', "needs the names it may hold"),
        ('{ value = "figures", max = 1, src = "standin", keys = { a = "float" } }', "needs its bounds"),
        (
            '{ value = "figures", min = 0, max = 1, src = "standin", keys = { a = "name" } }',
            "its kind int or float",
        ),
        (
            '{ value = "figures", min = 0, max = 1, src = "standin", keys = { "A-B" = "int" } }',
            "lower-case letters",
        ),
    ],
)
def test_a_figures_entry_without_named_keys_and_bounds_stops_the_policy(tmp_path: Path, entry, problem):
    text = default_policy().path.read_text()
    text = text.replace("[engines.standin.env]\n", f"[engines.standin.env]\nSTANDIN_TEST = {entry}\n")
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=problem):
        load_policy(path)


def test_the_api_key_variable_is_marked_for_the_readiness_probe_and_only_on_a_secret(tmp_path: Path):
    assert POLICY.api_key_env("vllm") == ("VLLM_API_KEY",)
    assert POLICY.api_key_env("standin") == ("VLLM_API_KEY",)  # the stand-in plays vLLM's key too
    assert POLICY.api_key_env("llamacpp") == ("LLAMA_API_KEY",)
    assert POLICY.api_key_env("sglang") == ()  # its key is not passed through a profile
    assert POLICY.api_key_env("no-such-engine") == ()
    text = POLICY.path.read_text().replace(
        "[engines.standin.env]\n",
        '[engines.standin.env]\nSTANDIN_TEST = { value = "token", api_key = true, src = "standin" }\n',
    )
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match="true only on a secret"):
        load_policy(path)
