"""The safetensors files: the index (``metadata.total_size`` and ``weight_map``)
and each file's header, whose tensors' ``data_offsets`` give the weight bytes,
the routed experts' apart. Only headers are read, never tensor data."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from catalog.modelfiles.limits import MAX_HEADER_BYTES, parse_json_object
from catalog.modelfiles.shape import bad, json_type, show

INDEX_NAME = "model.safetensors.index.json"
SHARD_NAME = re.compile(r"-(\d+)-of-(\d+)\.safetensors$")


def index_total_size(index: Any, name: str) -> int | None:
    """``metadata.total_size`` of a parsed safetensors index; None when absent."""
    if not isinstance(index, dict):
        raise bad(f"{name} is {json_type(index)}, expected a JSON object with metadata and weight_map.")
    metadata = index.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise bad(f"{name}: metadata is {json_type(metadata)}, expected an object holding total_size.")
    total = metadata.get("total_size")
    if total is None:
        return None
    if isinstance(total, str) and total.isascii() and total.isdigit():
        total = int(total)
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        raise bad(
            f"{name}: metadata.total_size is {show(total)}, expected the checkpoint's size in bytes as a whole "
            f"number greater than zero. Download {name} again or correct metadata.total_size."
        )
    return total


def parse_index_bytes(data: bytes, name: str = INDEX_NAME) -> dict[str, Any]:
    """The safetensors index in ``data``, its ``metadata.total_size`` and ``weight_map`` checked.

    Raises DomainError naming ``name`` when it is not JSON, not an object, or
    those two fields are malformed.
    """
    index = parse_json_object(data, name, "with metadata and weight_map")
    index_total_size(index, name)
    weight_map_files(index, name)
    return index


def weight_map_files(index: dict[str, Any], name: str) -> list[str]:
    """The shard files an index names, each once, in order."""
    weight_map = index.get("weight_map")
    if weight_map is None:
        return []
    if not isinstance(weight_map, dict):
        raise bad(f"{name}: weight_map is {json_type(weight_map)}, expected an object from tensor to file.")
    files: list[str] = []
    for tensor, file in weight_map.items():
        # Only plain names: the shards sit beside the index, and a path could
        # point the reader anywhere on the host.
        if not isinstance(file, str) or not file or Path(file).name != file or file in (".", ".."):
            raise bad(
                f"{name}: weight_map gives {show(file)} for tensor {tensor!r}, expected a file name beside {name}."
            )
        if file not in files:
            files.append(file)
    return files


def header_sums(header: Any, name: str) -> tuple[int, int]:
    """(all tensor bytes, routed-expert tensor bytes) of a parsed safetensors header."""
    if not isinstance(header, dict):
        raise bad(f"{name} is {json_type(header)}, expected a JSON object of tensors.")
    total = experts = 0
    tensors = 0
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        start, end = _data_offsets(tensor, entry, name)
        tensors += 1
        total += end - start
        # Routed experts only: DeepSeek's "shared_experts" and Qwen's
        # "shared_expert" run for every token like any dense weight.
        if ".experts." in tensor and "shared_expert" not in tensor:
            experts += end - start
    if not tensors or not total:
        raise bad(
            f"{name} lists no tensor data; it holds no weights. Check that it is the model's weights file."
        )
    return total, experts


def _data_offsets(tensor: str, entry: Any, name: str) -> tuple[int, int]:
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise bad(
            f"{name}: tensor {tensor!r} has data_offsets {show(offsets)}, expected [start, end] with "
            f"0 <= start <= end. The file is damaged; download it again."
        )
    return offsets[0], offsets[1]


def read_safetensors_header(path: str | Path) -> dict[str, Any]:
    """The parsed JSON header of a local ``.safetensors`` file, its tensors' offsets checked against its size.

    Reads only the header. Raises DomainError naming the file when it is
    truncated, declares an absurd header, or its header is not valid.
    """
    path = Path(path)
    name = str(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise bad(
                    f"{name} is {size} bytes long, too short to hold the 8-byte header length: it is truncated "
                    "or not a safetensors file. Download it again."
                )
            length = int.from_bytes(prefix, "little", signed=False)
            if length > MAX_HEADER_BYTES:
                raise bad(
                    f"{name} declares a {length}-byte header, over the {MAX_HEADER_BYTES}-byte limit: it is not "
                    "a safetensors file or its first 8 bytes are damaged. Download it again."
                )
            if 8 + length > size:
                raise bad(
                    f"{name} declares a {length}-byte header but only {size - 8} bytes follow: the file is "
                    "truncated. Download it again."
                )
            raw = handle.read(length)
    except OSError as exc:
        raise bad(f"{name} cannot be read: {exc.strerror or exc}.") from exc
    header = parse_json_object(raw, f"{name} (header)", "of tensors", limit=MAX_HEADER_BYTES)
    data_bytes = size - 8 - length
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        _, end = _data_offsets(tensor, entry, name)
        if end > data_bytes:
            raise bad(
                f"{name}: tensor {tensor!r} ends at byte {end} of the data but the file holds only {data_bytes} "
                "bytes of data: the file is truncated. Download it again."
            )
    return header


def refuse_lone_shard(path: Path) -> None:
    match = SHARD_NAME.search(path.name)
    if match and int(match.group(2)) > 1:
        raise bad(
            f"{path} is shard {int(match.group(1))} of {int(match.group(2))}; its size is not the model's. "
            f"Give the directory {path.parent} instead."
        )


def safetensors_files(directory: Path) -> list[Path]:
    """The weight files of a directory with no index: model.safetensors, else every shard, checked complete."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    shards = [(p, match) for p in files if (match := SHARD_NAME.search(p.name))]
    if not shards:
        return files
    # Shards named "-00001-of-00004" are one set; anything else beside them
    # (Mistral's consolidated.safetensors) is another copy of the same weights.
    totals = {int(match.group(2)) for _, match in shards}
    numbers = {int(match.group(1)) for _, match in shards}
    if len(totals) != 1 or numbers != set(range(1, totals.pop() + 1)):
        raise bad(
            f"{directory} holds an incomplete or mixed set of safetensors shards "
            f"({', '.join(p.name for p, _ in shards)}); download the missing shards or add {INDEX_NAME}."
        )
    return [p for p, _ in shards]


def merged_header(files: list[Path]) -> dict[str, Any]:
    """Every file's tensors in one header, each tensor's name kept once."""
    merged: dict[str, Any] = {}
    owner: dict[str, Path] = {}
    for file in files:
        for tensor, entry in read_safetensors_header(file).items():
            if tensor == "__metadata__":
                continue
            if tensor in merged:
                raise bad(
                    f"{file}: tensor {tensor!r} is also in {owner[tensor]}; the shards overlap. "
                    "Remove the extra copy of the weights."
                )
            merged[tensor] = entry
            owner[tensor] = file
    return merged
