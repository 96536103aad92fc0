"""Management commands: audited as cli with the command's user, exit non-zero on failure."""

from __future__ import annotations

import json
import shutil
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEntry
from audit.services import verify_chain
from catalog.models import Card, GPUClass, Node, Profile, Replica, ServedModel
from tests.support import builders as b

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf-configs"


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def checkpoint(tmp_path: Path, config: str, total_size: int | None) -> Path:
    shutil.copy(FIXTURES / config, tmp_path / "config.json")
    if total_size is not None:
        (tmp_path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total_size}, "weight_map": {}})
        )
    return tmp_path


def test_import_model_reads_a_checkpoint_directory_and_is_audited_as_cli(tmp_path):
    path = checkpoint(tmp_path, "meta-llama__Llama-3.1-8B-Instruct.json", 16060522496)
    out = run("import_model", "llama-3.1-8b", str(path), "--as", "ops-bot")
    assert "llama-3.1-8b: 32 layers" in out
    m = ServedModel.objects.get(name="llama-3.1-8b")
    assert (m.weight_bytes, m.kv_bytes_per_token, m.source) == (16060522496, 2 * 32 * 8 * 128 * 2, str(path))
    (entry,) = AuditEntry.objects.all()
    assert (entry.actor, entry.via, entry.action, entry.after["kv_heads"]) == ("ops-bot", "cli", "create", 8)


def test_import_model_with_a_broken_config_exits_non_zero_and_saves_nothing(tmp_path):
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 32, "num_attention_heads": "lots"}')
    with pytest.raises(CommandError) as err:
        run("import_model", "broken", str(tmp_path))
    assert err.value.returncode == 1
    assert "config.json" in str(err.value) and "num_attention_heads" in str(err.value)
    assert not ServedModel.objects.exists() and not AuditEntry.objects.exists()


def test_import_model_refuses_a_declared_model(tmp_path):
    b.llama_8b("llama-3.1-8b", declared=True, declared_in="/etc/llmgw/cluster.toml")
    path = checkpoint(tmp_path, "meta-llama__Llama-3.1-8B-Instruct.json", None)
    with pytest.raises(CommandError, match="cluster.toml"):
        run("import_model", "llama-3.1-8b", str(path))
    assert not AuditEntry.objects.exists()


CLUSTER = """
[[models]]
name = "llama-3.1-8b"
source = "meta-llama/Llama-3.1-8B-Instruct"
checkpoint = "llama"
context_length = 65536

[[models.profiles]]
name = "h100"
engine = "vllm"
gpu_class = "h100-80g"
gpus_per_node = 2
tp = 2
args = ["--max-model-len", "32768"]
"""


def test_sync_cluster_settings_declares_models_and_is_audited(tmp_path, settings):
    b.gpu_class("h100-80g")
    (tmp_path / "llama").mkdir()
    checkpoint(tmp_path / "llama", "meta-llama__Llama-3.1-8B-Instruct.json", 16060522496)
    path = tmp_path / "cluster.toml"
    path.write_text(CLUSTER)
    settings.LLMGW_CLUSTER_SETTINGS = str(path)
    out = run("sync_cluster_settings", "--as", "deployer")
    assert "1 created" in out
    m = ServedModel.objects.get(name="llama-3.1-8b")
    assert (m.declared, m.declared_in, m.context_length, m.kv_heads) == (True, str(path), 65536, 8)
    p = m.profiles.get()
    assert (p.engine, p.tp, p.args) == ("vllm", 2, ["--max-model-len", "32768"])
    assert list(AuditEntry.objects.order_by("id").values_list("object_type", "actor", "via")) == [
        ("model", "deployer", "cli"),
        ("profile", "deployer", "cli"),
    ]
    # Running it again changes nothing and records nothing.
    run("sync_cluster_settings")
    assert AuditEntry.objects.count() == 2


def test_a_model_no_longer_in_the_file_becomes_editable_again(tmp_path, settings):
    b.llama_8b("old", declared=True, declared_in="x")
    path = tmp_path / "cluster.toml"
    path.write_text("models = []\n")
    settings.LLMGW_CLUSTER_SETTINGS = str(path)
    assert "(old)" in run("sync_cluster_settings")
    assert ServedModel.objects.get(name="old").declared is False


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[[models]]\nname = 'm'\n", "models[0].source: is required"),
        ("[[models]]\nname = 'm'\nsource = 's'\ncolour = 'red'\n", "unknown key(s) colour"),
        (
            "[[models]]\nname = 'm'\nsource = 'org/s'\n[[models.profiles]]\nname = 'p'\nengine = 'vllm'\ngpu_class = 'nope'\n",
            "no GPU class 'nope'",
        ),
        ("[[models]\n", "not valid TOML"),
    ],
)
def test_a_bad_settings_file_is_refused_whole_with_the_file_and_key(tmp_path, settings, text, says):
    b.llama_8b("kept")
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    settings.LLMGW_CLUSTER_SETTINGS = str(path)
    with pytest.raises(CommandError) as err:
        run("sync_cluster_settings")
    assert str(path) in str(err.value) and says in str(err.value)
    assert ServedModel.objects.filter(declared=True).count() == 0
    assert ServedModel.objects.count() == 1 and not AuditEntry.objects.exists()


def test_seed_demo_loads_the_fleet_once_and_is_idempotent():
    out = run("seed_demo", "--as", "demo")
    assert "created" in out
    assert GPUClass.objects.count() == 3
    assert Node.objects.count() == 6 and Card.objects.count() == 48  # gpu-h3 and gpu-h4 for the 405B
    engines = set(Profile.objects.values_list("engine", flat=True))
    assert {"vllm", "sglang", "llamacpp", "freetoken"} <= engines
    attention = set(ServedModel.objects.values_list("attention", flat=True))
    assert {"gqa", "mla"} <= attention
    assert ServedModel.objects.filter(expert_bytes__gt=0).exists()  # a MoE
    assert Replica.objects.filter(state="ready").count() >= 4
    entries = AuditEntry.objects.count()
    assert run("seed_demo") == "demo fleet: already loaded\n"
    assert AuditEntry.objects.count() == entries
    assert verify_chain() == []


def test_seed_demo_prints_a_sign_in(capsys):
    out = run("seed_demo", "--users")
    assert "sign in at http://127.0.0.1:8000/" in out
    assert "operator" in out and "viewer" in out
