"""The model's files on this host: a directory (config.json beside a safetensors
index or the safetensors files) or one ``.safetensors`` file."""

from __future__ import annotations

from pathlib import Path

from catalog.modelfiles.config import parse_config_bytes, shape_from_config
from catalog.modelfiles.safetensors import (
    INDEX_NAME,
    header_sums,
    index_total_size,
    merged_header,
    parse_index_bytes,
    refuse_lone_shard,
    safetensors_files,
    weight_map_files,
)
from catalog.modelfiles.shape import ModelFilesShape, bad


def read_model_files(path: str | Path) -> ModelFilesShape:
    """The shape of a model's files on this host: a directory, or one ``.safetensors`` file.

    A directory gives ``config.json`` and, for the weights, either
    ``model.safetensors.index.json`` (``metadata.total_size``) or the headers
    of its safetensors files (``model.safetensors``, else every shard). Shard
    headers that are present are also read for the exact routed-expert bytes.
    A ``.safetensors`` file is read with the ``config.json`` beside it, if
    any; with none, only the weights are known. Raises DomainError
    ``bad_checkpoint`` naming the file and field that cannot be read.
    """
    path = Path(path)
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if path.is_file():
        if path.suffix != ".safetensors":
            raise bad(f"{path} is neither a checkpoint directory nor a .safetensors file; give one of those.")
        refuse_lone_shard(path)
        directory, weight_files, index, index_name = path.parent, [path], None, INDEX_NAME
    elif path.is_dir():
        directory = path
        index_path = directory / INDEX_NAME
        index_name = str(index_path)
        index = parse_index_bytes(_read_bytes(index_path), index_name) if index_path.is_file() else None
        if index is not None:
            shard_paths = [directory / f for f in weight_map_files(index, index_name)]
            # Shards not all downloaded: the index still gives the weights,
            # and the experts are derived from the config.
            weight_files = shard_paths if shard_paths and all(p.is_file() for p in shard_paths) else []
        else:
            weight_files = safetensors_files(directory)
    else:
        raise bad(
            f"{path}: no such file or directory; give a local checkpoint directory or a .safetensors file."
        )

    header = merged_header(weight_files) if weight_files else None
    header_name = str(weight_files[0]) if len(weight_files) == 1 else f"safetensors headers in {directory}"
    config_path = directory / "config.json"
    if not config_path.is_file():
        weight_bytes = index_total_size(index, index_name) if index is not None else None
        expert_bytes = None
        if header is not None:
            total, experts = header_sums(header, header_name)
            weight_bytes = weight_bytes or total
            expert_bytes = experts or None
        if weight_bytes is None:
            raise bad(
                f"{directory} holds no config.json and no safetensors weights; is it a model checkpoint?"
            )
        where = header_name if header is not None else index_name
        return ModelFilesShape(
            weight_bytes=weight_bytes,
            expert_bytes=expert_bytes,
            notes=(
                f"shape unknown: no config.json beside {where}; layers, heads, KV cache and context are "
                "unknown and the checks that need them will be skipped",
            ),
        )
    config = parse_config_bytes(_read_bytes(config_path), str(config_path))
    return shape_from_config(
        config,
        index=index,
        header=header,
        source=str(config_path),
        index_source=index_name,
        header_source=header_name,
    )


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise bad(f"{path} cannot be read: {exc.strerror or exc}.") from exc
