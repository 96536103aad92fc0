"""The demo fleet: three kinds of card, six nodes, real model shapes, running replicas, one of them
across two nodes (Llama-3.1-405B on gpu-h3 and gpu-h4, one fabric domain).

Model shapes come from real Hugging Face configs shipped beside this file, with
the weight sizes their safetensors indexes give (or derive, where noted).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"

# The release each engine's stand-in is declared to be on the demo's nodes (the agent's [engines.NAME]
# version: a stand-in has no package to read), and the fleet's default seeded for each: the releases the
# demo plays, not a claim about what is current.
RELEASES = {
    "vllm": "0.19.1",
    "sglang": "0.5.10",
    "trtllm": "1.0.0",
    "llamacpp": "b6500",
    "freetoken": "0.2.1",
    "standin": "0.19.1",
}

GPU_CLASSES = [
    # name, total MiB (nvidia-smi), usable MiB (what an engine may fill, ~90%), capability
    ("h100-80g", 81559, 73400, "9.0"),
    ("a100-40g", 40960, 36860, "8.0"),
    ("l40s-48g", 46068, 41460, "8.9"),
]

NODES = [
    # name, class, cards, agent port
    ("gpu-h1", "h100-80g", 8, 9101),
    ("gpu-h2", "h100-80g", 8, 9102),
    ("gpu-a1", "a100-40g", 8, 9103),
    ("gpu-l1", "l40s-48g", 8, 9104),
    ("gpu-h3", "h100-80g", 8, 9105),
    ("gpu-h4", "h100-80g", 8, 9106),
]

# The H100 nodes share one fabric (Node.fabric_domain): a replica across nodes spans nodes of one domain.
FABRIC = {"gpu-h1": "ib-demo-1", "gpu-h2": "ib-demo-1", "gpu-h3": "ib-demo-1", "gpu-h4": "ib-demo-1"}


@dataclass(frozen=True)
class DemoModel:
    name: str
    config: str
    source: str
    total_size: int  # metadata.total_size of model.safetensors.index.json


MODELS = [
    DemoModel(
        "llama-3.1-8b",
        "meta-llama__Llama-3.1-8B-Instruct.json",
        "meta-llama/Llama-3.1-8B-Instruct",
        16060522496,
    ),
    DemoModel("qwen3-30b-a3b", "Qwen__Qwen3-30B-A3B.json", "Qwen/Qwen3-30B-A3B", 61064245248),
    # Derived (parameters x 2 bytes): its index is not in the fixtures.
    DemoModel(
        "deepseek-v2-lite", "deepseek-ai__DeepSeek-V2-Lite.json", "deepseek-ai/DeepSeek-V2-Lite", 31412968448
    ),
    DemoModel("gpt-oss-20b", "openai__gpt-oss-20b.json", "openai/gpt-oss-20b", 13761264768),
    DemoModel(
        "mistral-7b",
        "mistralai__Mistral-7B-Instruct-v0.3.json",
        "mistralai/Mistral-7B-Instruct-v0.3",
        14496047104,
    ),
    DemoModel("qwen2.5-7b", "Qwen__Qwen2.5-7B-Instruct.json", "Qwen/Qwen2.5-7B-Instruct", 15231233024),
    # The model that needs two nodes: about 812 GB of bf16 weights, more than a node of eight H100s
    # holds. Derived (parameters x 2 bytes, /work/shared/fixtures/hf-configs/README.md): its index is
    # not in the fixtures.
    DemoModel("llama-3.1-405b", "meta-llama__Llama-3.1-405B.json", "meta-llama/Llama-3.1-405B", 811706777600),
]

# The llama.cpp model is planned from a GGUF the demo makes (demo/gguf_file.py):
# Mistral-7B-v0.3's layout (its config.json) at Q4_K_M, written where the demo's files go.
GGUF_MODELS = {
    "mistral-7b": {
        "arch": "llama",
        "name": "Mistral-7B-Instruct-v0.3",
        "layers": 32,
        "heads": 32,
        "kv_heads": 8,
        "hidden": 4096,
        "ffn": 14336,
        "vocab": 32768,
        "context": 32768,
        "file": "Mistral-7B-Instruct-v0.3-Q4_K_M.gguf",
    },
}


def demo_dir() -> Path:
    """Where the demo writes its files: LLMGW_DEMO_DIR, else the system's temporary directory."""
    import os
    import tempfile

    return Path(os.environ.get("LLMGW_DEMO_DIR") or Path(tempfile.gettempdir()) / "llmgw-demo")


def passwords_file() -> Path:
    """Where seed_demo keeps the demo accounts' passwords: var/demo-passwords.txt (mode 0600)."""
    from django.conf import settings

    return Path(settings.VAR_DIR) / "demo-passwords.txt"


def read_passwords(path: Path) -> dict[str, str]:
    """The kept passwords, ``user password`` a line; none when the file is missing."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    pairs = (line.split(None, 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return {name: password.strip() for name, password in pairs}


def write_passwords(path: Path, passwords: dict[str, str]) -> None:
    """Write the passwords readable and writable by this user alone (0600), before any byte is written."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # a file that was there keeps its old mode otherwise
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write("# the demo's accounts (manage.py seed_demo --users): user password\n")
        out.writelines(f"{name} {password}\n" for name, password in passwords.items())


PROFILES = [
    # model, profile, engine, class, gpus_per_node, tp, args
    ("llama-3.1-8b", "h100", "vllm", "h100-80g", 1, 1, ["--max-model-len", "32768"]),
    ("qwen3-30b-a3b", "h100", "sglang", "h100-80g", 2, 2, ["--context-length", "32768"]),
    ("deepseek-v2-lite", "a100", "vllm", "a100-40g", 2, 2, ["--max-model-len", "16384"]),
    ("gpt-oss-20b", "l40s", "freetoken", "l40s-48g", 1, 1, ["--max-seq-len-override", "32768"]),
    ("mistral-7b", "l40s", "llamacpp", "l40s-48g", 2, 1, ["--ctx-size", "16384"]),
    ("qwen2.5-7b", "cpu", "llamacpp", None, 1, 1, ["--ctx-size", "8192"]),
    ("llama-3.1-405b", "h100", "vllm", "h100-80g", 8, 8, ["--max-model-len", "32768"]),
]

# Profiles across nodes: (model, profile) to (nodes, pipeline stages). vLLM's way: TP 8 within a
# node, a pipeline stage a node (planning/engines.toml, span).
SPANS = {("llama-3.1-405b", "h100"): (2, 2)}

REPLICAS = [
    # replica, model, node, cards, port. In the demo every "node" is this
    # machine, so ports are distinct across nodes too.
    ("llama-3.1-8b-1", "llama-3.1-8b", "gpu-h1", [0], 8001),
    ("llama-3.1-8b-2", "llama-3.1-8b", "gpu-h2", [0], 8002),
    ("qwen3-30b-a3b-1", "qwen3-30b-a3b", "gpu-h1", [1, 2], 8003),
    ("deepseek-v2-lite-1", "deepseek-v2-lite", "gpu-a1", [0, 1], 8004),
    ("gpt-oss-20b-1", "gpt-oss-20b", "gpu-l1", [0], 8005),
    ("mistral-7b-1", "mistral-7b", "gpu-l1", [1, 2], 8006),
]

# Replicas across nodes: replica, model, each rank's (node, cards) rank 0 first, serving port,
# rendezvous port (rank 0's, on gpu-h3).
GROUP_REPLICAS = [
    (
        "llama-3.1-405b-1",
        "llama-3.1-405b",
        [("gpu-h3", list(range(8))), ("gpu-h4", list(range(8)))],
        8007,
        8008,
    ),
]

# One demo user per role (base/roles.py), named after it; admin is a superuser as well.
USERS = ["viewer", "operator", "editor", "lead", "admin"]
