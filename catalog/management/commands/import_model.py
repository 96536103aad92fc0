from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandParser

from catalog.management.base import ActorCommand


class Command(ActorCommand):
    help = (
        "Create a model (or refresh its shape) from a local checkpoint: a directory with config.json "
        "and model.safetensors.index.json, or safetensors files whose headers are read."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("name", help="the served model's name, e.g. llama-3.1-8b")
        parser.add_argument("path", type=Path, help="checkpoint directory or .safetensors file")
        parser.add_argument("--source", help="what the nodes load (default: the path)")

    def act(self, *args: Any, **options: Any) -> None:
        from catalog.checkpoint import read_checkpoint
        from catalog.services.catalog import model_import

        path: Path = options["path"]
        shape = read_checkpoint(path)
        model = model_import(
            name=options["name"], source=options["source"] or str(path), shape=shape.as_fields()
        )
        for note in shape.notes:
            self.stderr.write(f"note: {note}")
        self.stdout.write(
            f"{model.name}: {model.layers or '?'} layers, {model.attention_heads or '?'} heads, "
            f"{model.kv_heads or '?'} KV heads, {model.attention or 'unknown'} attention, "
            f"KV {model.kv_bytes_per_token or '?'} bytes/token, weights {model.weight_bytes or '?'} bytes"
        )
