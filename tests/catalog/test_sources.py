"""Shapes from where models live: a Hugging Face repo (through huggingface_hub,
against a pre-filled cache in offline mode, never the internet), and a GGUF
file read with llama.cpp's gguf package."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEntry
from base.errors import DomainError
from catalog.modelfiles import looks_like_repo_id, read_gguf, shape_from_hub
from catalog.models import ServedModel
from demo.gguf_file import write_model_gguf

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf-configs"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def prefill(cache: Path, repo: str, files: dict[str, bytes]) -> None:
    """The Hugging Face cache layout (models--org--name/refs/main, snapshots/<commit>/file)."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    snapshot = root / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Nothing may reach a network: an unroutable endpoint, should offline mode be ignored.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


LLAMA_INDEX = json.dumps(
    {"metadata": {"total_size": 16060522496}, "weight_map": {"a": "model-00001-of-00004.safetensors"}}
)


def test_a_repo_id_gives_the_shape_from_config_and_index_in_the_cache(hub_cache):
    config = (FIXTURES / "meta-llama__Llama-3.1-8B-Instruct.json").read_bytes()
    prefill(
        hub_cache,
        "meta-llama/Llama-3.1-8B-Instruct",
        {"config.json": config, "model.safetensors.index.json": LLAMA_INDEX.encode()},
    )
    shape = shape_from_hub("meta-llama/Llama-3.1-8B-Instruct")
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.attention) == (32, 8, 128, "gqa")
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert shape.weight_bytes == 16060522496
    assert (shape.hidden_size, shape.vocab_size) == (4096, 128256)


def test_a_repo_without_an_index_says_the_weights_are_unknown(hub_cache):
    prefill(hub_cache, "org/small", {"config.json": (FIXTURES / "Qwen__Qwen2.5-7B.json").read_bytes()})
    shape = shape_from_hub("org/small")
    assert shape.weight_bytes is None
    assert any("no model.safetensors.index.json" in note for note in shape.notes)


def test_a_repo_not_in_the_cache_offline_says_how_to_get_it(hub_cache):
    with pytest.raises(DomainError) as err:
        shape_from_hub("org/absent")
    assert err.value.code == "bad_checkpoint"
    assert "not in the Hugging Face cache" in err.value.message and "HF_ENDPOINT" in err.value.message


def test_a_broken_config_in_the_repo_names_the_file(hub_cache):
    prefill(hub_cache, "org/broken", {"config.json": b"{not json"})
    with pytest.raises(DomainError) as err:
        shape_from_hub("org/broken")
    assert "org/broken/config.json is not valid JSON" in err.value.message


@pytest.mark.parametrize(
    ("text", "is_repo"),
    [
        ("meta-llama/Llama-3.1-8B", True),
        ("/srv/models/llama", False),
        ("./llama", False),
        ("a/b/c", False),
        ("llama", False),
    ],
)
def test_a_repo_id_is_told_from_a_path(text, is_repo):
    assert looks_like_repo_id(text) is is_repo


MISTRAL = dict(
    arch="llama",
    name="Mistral-7B",
    layers=32,
    heads=32,
    kv_heads=8,
    hidden=4096,
    ffn=14336,
    vocab=32768,
    context=32768,
)


def test_a_gguf_gives_its_layers_heads_context_quantization_and_its_size_as_weights(tmp_path):
    path = write_model_gguf(tmp_path / "m.gguf", **MISTRAL)
    shape = read_gguf(path)
    assert (shape.layers, shape.attention_heads, shape.kv_heads, shape.head_dim) == (32, 32, 8, 128)
    assert (shape.context_length, shape.dtype, shape.attention) == (32768, "Q4_K_M", "gqa")
    assert shape.kv_bytes_per_token == 32 * 8 * (128 + 128) * 2  # f16 K and V
    assert shape.weight_bytes == path.stat().st_size
    assert (shape.hidden_size, shape.intermediate_size, shape.vocab_size) == (4096, 14336, 32768)


def test_a_file_that_is_not_gguf_is_refused_saying_so(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(DomainError) as err:
        read_gguf(path)
    assert "is not a GGUF file llama.cpp can read" in err.value.message
    with pytest.raises(DomainError):
        read_gguf(tmp_path / "absent.gguf")


@pytest.mark.django_db
def test_import_model_takes_a_repo_id_and_a_gguf(hub_cache, tmp_path):
    config = (FIXTURES / "meta-llama__Llama-3.1-8B-Instruct.json").read_bytes()
    prefill(
        hub_cache,
        "meta-llama/Llama-3.1-8B-Instruct",
        {"config.json": config, "model.safetensors.index.json": LLAMA_INDEX.encode()},
    )
    out = StringIO()
    call_command("import_model", "llama", "meta-llama/Llama-3.1-8B-Instruct", stdout=out, stderr=StringIO())
    model = ServedModel.objects.get(name="llama")
    assert (model.source, model.weight_bytes, model.layers) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        16060522496,
        32,
    )
    gguf_path = write_model_gguf(tmp_path / "m.gguf", **MISTRAL)
    call_command("import_model", "mistral-gguf", str(gguf_path), stdout=StringIO(), stderr=StringIO())
    assert ServedModel.objects.get(name="mistral-gguf").weight_bytes == gguf_path.stat().st_size
    assert AuditEntry.objects.filter(object_key__in=["llama", "mistral-gguf"]).count() == 2
    with pytest.raises(CommandError):
        call_command("import_model", "nope", "org/absent", stdout=StringIO(), stderr=StringIO())
    assert not ServedModel.objects.filter(name="nope").exists()


@pytest.mark.django_db
def test_the_admin_imports_from_a_repo_id(hub_cache, client, django_user_model):
    config = (FIXTURES / "meta-llama__Llama-3.1-8B-Instruct.json").read_bytes()
    prefill(
        hub_cache,
        "meta-llama/Llama-3.1-8B-Instruct",
        {"config.json": config, "model.safetensors.index.json": LLAMA_INDEX.encode()},
    )
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    url = "/admin/catalog/servedmodel/import-config/"
    response = client.post(
        url, {"name": "llama", "source": "meta-llama/Llama-3.1-8B-Instruct", "from_hub": "on"}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert ServedModel.objects.get(name="llama").weight_bytes == 16060522496
    # neither a file nor the Hub: refused, nothing saved
    response = client.post(url, {"name": "other", "source": "x/y"})
    assert response.status_code == 200 and "tick Fetch from the Hub" in response.content.decode()
    assert not ServedModel.objects.filter(name="other").exists()
