#!/usr/bin/env python3
"""A stand-in for ``nvidia-smi``'s query interface, for demos and tests on machines without a GPU.

It answers ``--version`` as nvidia-smi of driver 550 and later prints it (``DRIVER version`` and
``CUDA Version`` lines, from ``$STANDIN_GPU_DIR/driver.json``: 580.65.06 and 13.0 unless a test or the
demo installs others), and the two queries the agent makes, in nvidia-smi's own CSV form
(``--format=csv,noheader,nounits``; fields as ``nvidia-smi --help-query-gpu`` and
``--help-query-compute-apps`` name them, driver 535+):

  --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,temperature.gpu,
              ecc.errors.uncorrected.volatile.total
  --query-compute-apps=gpu_uuid,pid,used_memory,process_name

from the files in ``$STANDIN_GPU_DIR``: ``cards.json`` (the node's cards: index, name,
memory_mib) and one ``proc-<pid>.json`` per process holding card memory
(``{"cards": [1], "used_mib": 30000, "name": "..."}``, or ``"fraction"`` of each card
instead of ``used_mib``). The stand-in engine writes its own file as it starts (vLLM takes
its ``--gpu-memory-utilization`` of each card, 0.9 by default); a test simulates a foreign
process by writing one for a process of its own. A file whose process is gone is ignored.
Utilisation and temperature are simulated from the memory held. ``ecc.json``, when there, gives
cards uncorrected ECC errors (``{"2": 3}``: card 2 has had 3), as a failing card reports them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

DRIVER = "580.65.06"
CUDA = "13.0"


def install(
    directory: Path, cards: list[dict[str, Any]], *, driver: str = DRIVER, cuda: str = CUDA
) -> dict[str, str]:
    """Set the stand-in up for an agent: its cards in ``directory/cards.json``, the driver and CUDA
    versions its ``--version`` prints in ``directory/driver.json``, a program named
    ``nvidia-smi`` in ``directory/bin`` that runs this file; the environment to give the agent
    (its PATH finds the stand-in, and its engines register the memory they hold)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cards.json").write_text(json.dumps(cards))
    (directory / "driver.json").write_text(json.dumps({"driver_version": driver, "cuda_version": cuda}))
    bin_dir = directory / "bin"
    bin_dir.mkdir(exist_ok=True)
    program = bin_dir / "nvidia-smi"
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    program.chmod(0o755)
    return {"STANDIN_GPU_DIR": str(directory), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _state(directory: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cards = json.loads((directory / "cards.json").read_text())
    totals = {int(c["index"]): int(c["memory_mib"]) for c in cards}
    processes = []
    for path in sorted(directory.glob("proc-*.json")):
        try:
            entry = json.loads(path.read_text())
            pid = int(entry.get("pid") or path.stem.split("-", 1)[1])
        except (OSError, ValueError):
            continue
        if not _alive(pid):
            continue
        for index in entry.get("cards", []):
            if int(index) not in totals:
                continue
            used = entry.get("used_mib")
            if isinstance(used, dict):  # what it holds card by card (agent/standin_memory.py)
                used = used.get(str(index))
            if used is None:
                used = round(float(entry.get("fraction", 0.9)) * totals[int(index)])
            processes.append(
                {
                    "card": int(index),
                    "pid": pid,
                    "used_mib": int(used),
                    "name": str(entry.get("name", "python3")),
                }
            )
    return cards, processes


def _uuid(index: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{index:012d}"


def _version(directory: Path) -> int:
    """``nvidia-smi --version`` as driver 550+ prints it."""
    try:
        driver = json.loads((directory / "driver.json").read_text())
    except (OSError, ValueError):
        driver = {}
    version = str(driver.get("driver_version", DRIVER))
    print(f"NVIDIA-SMI version  : {version}")
    print(f"NVML version        : {version.rsplit('.', 1)[0]}")
    print(f"DRIVER version      : {version}")
    print(f"CUDA Version        : {driver.get('cuda_version', CUDA)}")
    return 0


def main(argv: list[str]) -> int:
    directory = Path(os.environ.get("STANDIN_GPU_DIR", ""))
    if not os.environ.get("STANDIN_GPU_DIR") or not (directory / "cards.json").is_file():
        print("NVIDIA-SMI has failed: STANDIN_GPU_DIR/cards.json is missing (stand-in)", file=sys.stderr)
        return 9
    if "--version" in argv:
        return _version(directory)
    cards, processes = _state(directory)
    try:
        ecc = {int(k): int(v) for k, v in json.loads((directory / "ecc.json").read_text()).items()}
    except (OSError, ValueError, AttributeError):
        ecc = {}
    query = next((a for a in argv if a.startswith("--query-")), "")
    kind, _, fields_text = query.partition("=")
    fields = [f.strip() for f in fields_text.split(",") if f.strip()]
    rows: list[dict[str, Any]] = []
    if kind == "--query-gpu":
        for card in sorted(cards, key=lambda c: int(c["index"])):
            index = int(card["index"])
            used = sum(p["used_mib"] for p in processes if p["card"] == index)
            total = int(card["memory_mib"])
            util = 0 if not used else min(100, 20 + round(60 * used / total))
            rows.append(
                {
                    "index": index,
                    "uuid": _uuid(index),
                    "name": card.get("name", "NVIDIA H100 80GB HBM3"),
                    "memory.total": total,
                    "memory.used": used,
                    "utilization.gpu": util,
                    "temperature.gpu": 32 + util // 2,
                    "ecc.errors.uncorrected.volatile.total": ecc.get(index, 0),
                }
            )
    elif kind == "--query-compute-apps":
        for p in processes:
            rows.append(
                {
                    "gpu_uuid": _uuid(p["card"]),
                    "pid": p["pid"],
                    "used_memory": p["used_mib"],
                    "process_name": p["name"],
                }
            )
    else:
        print(
            f"stand-in nvidia-smi answers --query-gpu and --query-compute-apps only, not {argv}",
            file=sys.stderr,
        )
        return 2
    for row in rows:
        print(", ".join(str(row.get(f, "[N/A]")) for f in fields))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
