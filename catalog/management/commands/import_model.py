from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand


class Command(ActorCommand):
    help = (
        "Create a model (or refresh its shape) from where it lives: a local checkpoint (a directory with "
        "config.json and model.safetensors.index.json, or safetensors files whose headers are read), a GGUF "
        "file (for llama.cpp), or a Hugging Face repo id (only config.json and the safetensors index are "
        "fetched, honouring HF_TOKEN, HF_ENDPOINT, the Hugging Face cache and HF_HUB_OFFLINE)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("name", help="the served model's name, e.g. llama-3.1-8b")
        parser.add_argument(
            "path", help="checkpoint directory, .safetensors or .gguf file, or a repo id such as org/name"
        )
        parser.add_argument("--source", help="what the nodes load (default: the path or repo id)")
        parser.add_argument("--revision", help="the repo's branch, tag or commit (default: main)")

    def act(self, *args: Any, **options: Any) -> None:
        from catalog.modelfiles import looks_like_repo_id, read_gguf, read_model_files, shape_from_hub
        from catalog.services.catalog import model_import

        where: str = options["path"]
        if Path(where).suffix == ".gguf":
            shape = read_gguf(Path(where))
        elif looks_like_repo_id(where):
            shape = shape_from_hub(where, revision=options["revision"])
        else:
            shape = read_model_files(Path(where))
        model = model_import(name=options["name"], source=options["source"] or where, shape=shape.as_fields())
        for note in shape.notes:
            self.stderr.write(f"note: {note}")
        self.stdout.write(
            f"{model.name}: {model.layers or '?'} layers, {model.attention_heads or '?'} heads, "
            f"{model.kv_heads or '?'} KV heads, {model.attention or 'unknown'} attention, "
            f"KV {model.kv_bytes_per_token or '?'} bytes/token, weights {model.weight_bytes or '?'} bytes"
        )
