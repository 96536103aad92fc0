"""Hostile launch inputs through every path: the API, the admin, the cluster
settings file and a real agent process. Each one is refused with a sentence
naming the argument or variable and why; rows and audit entries are unchanged.

The cases are the ones the issue saw get through, plus others from each
engine's argument list (agent/llmgw_policy/policy.toml says where each was
checked).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_testing import TransportError, free_port, running_agent, standin_spec
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from llmgw_policy import default_policy, launch_args

from audit.models import AuditEntry
from catalog.models import Profile, ServedModel
from tests.support import builders as b

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """Users are made per case here: hash their passwords cheaply (tests only)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


MANY = ["--max-num-seqs", "8"] * 10_000  # 20,000 arguments
HUGE = "x" * (1 << 20)  # a 1 MB argument

# engine, args, env, the argument or variable the sentence must name, a word of why
CASES: list[tuple[str, list[str], dict[str, str], str, str]] = [
    # vLLM flags that fetch, read files or load code
    (
        "vllm",
        ["--speculative-config", '{"model": "org/draft", "num_speculative_tokens": 4}'],
        {},
        "'model'",
        "key",
    ),
    ("vllm", ["--speculative-config.model", "org/draft"], {}, "--speculative-config.model", "JSON"),
    ("vllm", ["--generation-config", "/srv/gen"], {}, "--generation-config", "reads"),
    ("vllm", ["--scheduler-cls", "evil.Scheduler"], {}, "--scheduler-cls", "imports"),
    ("vllm", ["--logits-processors", "evil.Processor"], {}, "--logits-processors", "imports"),
    ("vllm", ["--kv-transfer-config", '{"kv_connector": "Evil"}'], {}, "--kv-transfer-config", "hosts"),
    ("vllm", ["--load-format", "runai_streamer"], {}, "--load-format", "one of"),
    ("vllm", ["--hf-overrides", '{"architectures": ["Evil"]}'], {}, "--hf-overrides", "code"),
    ("vllm", ["--revision", "main"], {}, "--revision", "source"),
    ("vllm", ["--tool-server", "evil.example:80"], {}, "--tool-server", "hosts"),
    ("vllm", ["--otlp-traces-endpoint", "http://evil.example"], {}, "--otlp-traces-endpoint", "host"),
    ("vllm", ["--trust_remote_code"], {}, "--trust_remote_code", "Python"),
    ("vllm", ["--trust-remote"], {}, "--trust-remote", "reads it as --trust-remote-code"),
    ("vllm", ["--chat-template", "/etc/passwd"], {}, "--chat-template", "reads a template file"),
    ("vllm", ["--compilation-config", '{"debug_dump_path": "/tmp"}'], {}, "'debug_dump_path'", "key"),
    ("vllm", ["/etc/passwd"], {}, "'/etc/passwd'", "not an argument"),
    ("vllm", ["--max-num-seqs", "--trust-remote-code"], {}, "--max-num-seqs", "looks like a flag"),
    ("vllm", ["--enforce-eager", "x.so"], {}, "'x.so'", "not an argument"),
    # flags the launcher owns
    ("vllm", ["--port", "9999"], {}, "--port", "launcher"),
    ("vllm", ["--host", "0.0.0.0"], {}, "--host", "launcher"),
    ("vllm", ["--served-model-name", "other-model"], {}, "--served-model-name", "launcher"),
    ("vllm", ["--tensor-parallel-size", "4"], {}, "--tensor-parallel-size", "resize"),
    ("vllm", ["-tp", "4"], {}, "-tp", "resize"),
    ("vllm", ["--tensor_parallel_size=4"], {}, "--tensor_parallel_size", "resize"),
    ("vllm", ["--model", "/srv/other"], {}, "--model", "source"),
    ("vllm", ["--api-key", "sk-abcdef"], {}, "--api-key", "VLLM_API_KEY"),
    ("vllm", ["--max-model-len", "99999999"], {}, "--max-model-len", "context"),
    # sizes
    ("vllm", MANY, {}, "arguments", "at most"),
    ("vllm", ["--reasoning-parser", HUGE], {}, "bytes", "at most"),
    # environment
    ("vllm", [], {"PYTHONUSERBASE": "/tmp/u"}, "PYTHONUSERBASE", "Python"),
    ("vllm", [], {"LD_AUDIT": "/tmp/a.so"}, "LD_AUDIT", "loader"),
    ("vllm", [], {"LD_PRELOAD": "/tmp/a.so"}, "LD_PRELOAD", "loader"),
    ("vllm", [], {"PYTHONPATH": "/tmp"}, "PYTHONPATH", "Python"),
    ("vllm", [], {"PATH": "/tmp/bin"}, "PATH", "program"),
    ("vllm", [], {"HOME": "/tmp"}, "HOME", "directory"),
    ("vllm", [], {"HTTPS_PROXY": "http://evil.example"}, "HTTPS_PROXY", "host"),
    ("vllm", [], {"HF_HOME": "/tmp"}, "HF_HOME", "directory"),
    ("vllm", [], {"XDG_CACHE_HOME": "/tmp"}, "XDG_CACHE_HOME", "directories"),
    ("vllm", [], {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, "CUDA_DEVICE_ORDER", "agent"),
    ("vllm", [], {"CUDA_VISIBLE_DEVICES": "0,1"}, "CUDA_VISIBLE_DEVICES", "agent"),
    ("vllm", [], {"LLMGW_REPLICA_ID": "x"}, "LLMGW_REPLICA_ID", "agent"),
    ("vllm", [], {"VLLM_PLUGINS": "evil"}, "VLLM_PLUGINS", "plugin"),
    ("vllm", [], {"SOME_UNLISTED_VAR": "1"}, "SOME_UNLISTED_VAR", "not on vllm's list"),
    ("vllm", [], {"HF_TOKEN": "has spaces in it"}, "HF_TOKEN", "token"),
    # llama.cpp: "_" is "-" in every "--" flag (common_params_parse_ex)
    ("llamacpp", ["--hf_repo", "org/r"], {}, "--hf_repo", "Hugging Face"),
    ("llamacpp", ["--model_url", "http://evil.example/x.gguf"], {}, "--model_url", "URL"),
    ("llamacpp", ["--lora_scaled", "a.gguf", "1"], {}, "--lora_scaled", "adapter"),
    ("llamacpp", ["--chat_template_file", "t.jinja"], {}, "--chat_template_file", "template"),
    ("llamacpp", ["--mmproj_url", "http://evil.example/p"], {}, "--mmproj_url", "URL"),
    ("llamacpp", ["-hf", "org/r"], {}, "-hf", "Hugging Face"),
    ("llamacpp", ["--hf-repo=org/r"], {}, "--hf-repo", "Hugging Face"),
    ("llamacpp", ["--rpc", "10.0.0.9:50052"], {}, "--rpc", "hosts"),
    ("llamacpp", ["-ts", "1,1"], {}, "-ts", "cards"),
    ("llamacpp", ["--alias", "other"], {}, "--alias", "launcher"),
    # a bare -fa takes the next argument as its value (common/arg.cpp at 145b6280)
    ("llamacpp", ["-fa", "--jinja"], {}, "-fa", "one of on, off, auto"),
    ("llamacpp", [], {"LLAMA_ARG_MODEL_URL": "http://evil.example/x"}, "LLAMA_ARG_MODEL_URL", "URL"),
    ("llamacpp", [], {"LLAMA_ARG_CTX_SIZE": "4096"}, "LLAMA_ARG_CTX_SIZE", "context"),
    # SGLang
    ("sglang", ["--load-format", "remote"], {}, "--load-format", "hosts"),
    ("sglang", ["--custom-weight-loader", "evil.load"], {}, "--custom-weight-loader", "imports"),
    ("sglang", ["--tp", "4"], {}, "--tp", "resize"),
    ("sglang", ["--model-path", "/srv/x"], {}, "--model-path", "source"),
    ("sglang", ["--enable-custom-logit-processor"], {}, "--enable-custom-logit-processor", "code"),
    # TensorRT-LLM
    ("trtllm", ["--extra_llm_api_options", "x.yaml"], {}, "--extra_llm_api_options", "YAML"),
    ("trtllm", ["--tp_size", "4"], {}, "--tp_size", "resize"),
    ("trtllm", ["--trust-remote-code"], {}, "--trust-remote-code", "not on trtllm's list"),
    # FreeToken
    ("freetoken", ["--model", "/srv/x"], {}, "--model", "source"),
    ("freetoken", ["--model-source", "modelscope"], {}, "--model-source", "ModelScope"),
    ("freetoken", [], {"FREETOKEN_KERNEL_CACHE_DIR": "/tmp"}, "FREETOKEN_KERNEL_CACHE_DIR", "kernel"),
]

IDS = [f"{engine}-{(args[:1] or list(env))[0][:30]}-{n}" for n, (engine, args, env, _, _) in enumerate(CASES)]

# sources a model may not have
SOURCES = ["/etc", "http://evil.example/model", "--model", "org/name/extra", "../models/x", "/tmp/../etc"]


def _model() -> ServedModel:
    model = b.llama_8b()
    b.profile(model, "existing", args=["--max-num-seqs", "8"])
    return model


def _counts() -> tuple[int, int, int]:
    return Profile.objects.count(), ServedModel.objects.count(), AuditEntry.objects.count()


def _says(detail: str, named: str, why: str) -> None:
    assert named in detail, detail[:400]
    assert why in detail, detail[:400]


def _api(username: str = "editor") -> Client:
    from rest_framework.test import APIClient

    user = b.user(
        username,
        "catalog.add_profile",
        "catalog.change_profile",
        "catalog.add_servedmodel",
        "catalog.change_servedmodel",
        "catalog.view_profile",
    )
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def admin_client(db) -> Client:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_superuser("root", "root@example.org", "pw-for-tests-only-123")
    client = Client()
    client.force_login(user)
    return client


# -- the API -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "args", "env", "named", "why"), CASES, ids=IDS)
def test_the_api_refuses_each_hostile_profile_and_changes_nothing(engine, args, env, named, why):
    model = _model()
    existing = model.profiles.get()
    client = _api()
    before = _counts()

    created = client.post(
        "/api/profiles/",
        {
            "model": model.name,
            "name": "hostile",
            "engine": engine,
            "gpu_class": "h100-80g",
            "args": args,
            "env": env,
        },
        format="json",
    )
    changed = client.patch(
        f"/api/profiles/{existing.pk}/", {"engine": engine, "args": args, "env": env}, format="json"
    )

    for response in (created, changed):
        assert response.status_code == 400, response.content[:300]
        _says(response.json()["detail"], named, why)
    assert _counts() == before
    existing.refresh_from_db()
    assert (existing.engine, existing.args, existing.env, existing.revision) == (
        "vllm",
        ["--max-num-seqs", "8"],
        {},
        1,
    )


@pytest.mark.parametrize("source", SOURCES)
def test_the_api_refuses_a_source_that_is_not_a_repo_id_or_a_path_under_the_roots(source, settings):
    settings.LLMGW_MODEL_ROOTS = ("/srv/models",)
    model = _model()
    client = _api()
    before = _counts()

    created = client.post("/api/models/", {"name": "hostile", "source": source}, format="json")
    changed = client.patch(f"/api/models/{model.name}/", {"source": source}, format="json")

    for response in (created, changed):
        assert response.status_code == 400, response.content
        assert response.json()["code"] == "refused_source"
        assert "source" in response.json()["detail"]
    assert _counts() == before


def test_a_repo_id_with_a_revision_and_a_path_under_the_roots_are_sources(settings):
    settings.LLMGW_MODEL_ROOTS = ("/srv/models",)
    client = _api()
    for n, source in enumerate(["org/name", "org/name@v1.2", "/srv/models/llama", "/srv/models"]):
        response = client.post("/api/models/", {"name": f"ok-{n}", "source": source}, format="json")
        assert response.status_code == 201, (source, response.content)


# -- the admin ---------------------------------------------------------------------------------


def _admin_form(model: ServedModel, engine: str, args: list[str], env: dict[str, str]) -> dict[str, str]:
    return {
        "model": str(model.pk),
        "name": "hostile",
        "engine": engine,
        "gpu_class": str(b.gpu_class().pk),
        "gpus_per_node": "1",
        "tp": "1",
        "nodes": "1",
        "pp": "0",
        "args": json.dumps(args),
        "env": json.dumps(env),
    }


@pytest.mark.parametrize(("engine", "args", "env", "named", "why"), CASES, ids=IDS)
def test_the_admin_refuses_each_hostile_profile_keeping_what_was_typed(
    admin_client, engine, args, env, named, why
):
    model = _model()
    existing = model.profiles.get()
    before = _counts()

    added = admin_client.post("/admin/catalog/profile/add/", _admin_form(model, engine, args, env))
    changed = admin_client.post(
        f"/admin/catalog/profile/{existing.pk}/change/",
        {**_admin_form(model, engine, args, env), "name": "existing"},
    )

    for response in (added, changed):
        # The form again, with the refusal on it and the editor's input kept.
        assert response.status_code == 200
        text = response.content.decode()
        assert "errornote" in text or "errorlist" in text
        from html import unescape

        _says(unescape(text), named, why)
        if len(json.dumps(args)) < 2000:
            assert unescape(json.dumps(args)) in unescape(text)
    assert _counts() == before


def test_the_admin_refuses_a_hostile_source_keeping_what_was_typed(admin_client, settings):
    settings.LLMGW_MODEL_ROOTS = ("/srv/models",)
    before = _counts()
    response = admin_client.post(
        "/admin/catalog/servedmodel/add/",
        {
            "name": "hostile",
            "source": "http://evil.example/model",
            "sliding_layers": "0",
            "profiles-TOTAL_FORMS": "0",
            "profiles-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 200
    assert "http://evil.example/model" in response.content.decode()
    assert "is neither a Hugging Face repo id" in response.content.decode()
    assert _counts() == before


# -- the cluster settings file -----------------------------------------------------------------


def _toml(value: object) -> str:
    return json.dumps(value)  # a JSON string or list of strings is TOML too


@pytest.mark.parametrize(("engine", "args", "env", "named", "why"), CASES, ids=IDS)
def test_the_cluster_settings_file_refuses_each_hostile_profile_whole(
    tmp_path, settings, engine, args, env, named, why
):
    _model()
    b.gpu_class()
    env_table = ", ".join(f"{k} = {_toml(v)}" for k, v in env.items())
    path = tmp_path / "cluster.toml"
    path.write_text(
        "[[models]]\n"
        'name = "declared-one"\n'
        'source = "org/declared"\n'
        "context_length = 131072\n"
        "[[models.profiles]]\n"
        'name = "p"\n'
        f'engine = "{engine}"\n'
        'gpu_class = "h100-80g"\n'
        f"args = {_toml(args)}\n"
        f"env = {{ {env_table} }}\n"
    )
    settings.LLMGW_CLUSTER_SETTINGS = str(path)
    before = _counts()

    with pytest.raises(CommandError) as caught:
        call_command("sync_cluster_settings")

    assert str(path) in str(caught.value)
    _says(str(caught.value), named, why)
    assert _counts() == before


@pytest.mark.parametrize("source", SOURCES)
def test_the_cluster_settings_file_refuses_a_hostile_source(tmp_path, settings, source):
    settings.LLMGW_MODEL_ROOTS = ("/srv/models",)
    path = tmp_path / "cluster.toml"
    path.write_text(f'[[models]]\nname = "declared-one"\nsource = {_toml(source)}\n')
    settings.LLMGW_CLUSTER_SETTINGS = str(path)
    before = _counts()
    with pytest.raises(CommandError, match="source"):
        call_command("sync_cluster_settings")
    assert _counts() == before


# -- a real agent ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    with running_agent(tmp_path_factory.mktemp("agent")) as running, running.client() as http:
        yield running, http


@pytest.mark.parametrize(("engine", "args", "env", "named", "why"), CASES, ids=IDS)
def test_a_real_agent_refuses_each_hostile_spec_and_starts_nothing(agent, engine, args, env, named, why):
    running, http = agent
    spec = standin_spec(port=free_port(), engine=engine, args=args, env=env)
    try:
        response = http.put("/v1/replicas/hostile", json=spec)
    except TransportError as exc:  # pragma: no cover - the agent must answer
        pytest.fail(f"the agent did not answer: {exc}")

    assert response.status_code in (400, 413), response.text[:300]
    detail = response.json()["detail"]
    if response.status_code == 413 or response.json()["code"] == "invalid_spec":
        # Refused before the policy by the spec's own limits, naming them.
        assert "items" in detail or "bytes" in detail, detail
    else:
        _says(detail, named, why)
    assert http.get("/v1/replicas").json() == []


def test_a_real_agent_refuses_a_hostile_source(agent):
    _, http = agent
    for source in SOURCES:
        port = free_port()
        args = launch_args(default_policy(), "vllm", source=source, port=port, model="m", tp=1, args=[])
        response = http.put(
            "/v1/replicas/hostile", json=standin_spec(port=port, model="m", args=args, launch=False)
        )
        assert response.status_code == 400, source
        assert response.json()["code"] in ("refused_source", "launch_mismatch"), response.json()
    assert http.get("/v1/replicas").json() == []


def test_the_agents_limits_are_the_control_planes(agent):
    """The same numbers on both sides: what the catalog lets through the agent accepts."""
    _, http = agent
    limits = default_policy().limits
    args = ["--max-num-seqs", "8"] * (limits.max_args // 2)
    spec = standin_spec(port=free_port(), args=args)
    assert len(spec["args"]) <= 1000  # the spec's shape limit leaves room for the launcher's own
    response = http.put("/v1/replicas/big", json=spec)
    assert response.status_code == 201, response.text
    assert http.delete("/v1/replicas/big").json()["state"] == "stopped"
    over = standin_spec(port=free_port(), args=[*args, "--enforce-eager"])
    refused = http.put("/v1/replicas/big2", json=over)
    assert (refused.status_code, refused.json()["code"]) == (400, "refused_arg")
    assert f"at most {limits.max_args}" in refused.json()["detail"]


def test_the_shipped_policy_file_is_the_one_both_sides_read():
    from django.conf import settings as django_settings

    assert default_policy().path == Path(django_settings.BASE_DIR) / "agent" / "llmgw_policy" / "policy.toml"
