"""Card telemetry: per card memory used and total, utilisation, temperature, and the processes
holding memory on it, each named by the replica it belongs to, or by none (a foreign process).

Read from nvidia-smi's query interface (``--query-gpu`` and ``--query-compute-apps`` with
``--format=csv,noheader,nounits``; the field names are those ``nvidia-smi --help-query-gpu``
and ``--help-query-compute-apps`` list, unchanged since driver 410 and current in 535-570).
Where no nvidia-smi is on the agent's PATH, the configured cards are reported with their total
and nothing else (``source: "config"``). On a machine without a GPU the demo and the tests put
the stand-in (``agent/standin_nvidia_smi.py``) on the agent's PATH: the same code path reads it.

Sampled at a bounded rate: one run of nvidia-smi at most every ``MIN_INTERVAL`` seconds,
however often the control plane asks; the last sample is answered meanwhile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from .config import CardConfig

# ecc.errors.uncorrected.volatile.total: uncorrected ECC errors since the driver last loaded ("[N/A]"
# on a card without ECC, or with it off). Xid errors have no query field: they are in the kernel's log
# (NVRM: Xid lines, read by root) and DCGM, neither of which this unprivileged, stdlib-only agent reads.
GPU_FIELDS = (
    "index",
    "uuid",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "temperature.gpu",
    "ecc.errors.uncorrected.volatile.total",
)
APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")
MIN_INTERVAL = 2.0  # seconds between two runs of nvidia-smi
TIMEOUT = 5.0


def _number(text: str) -> int | None:
    try:
        return round(float(text))
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_gpus(text: str) -> list[dict[str, Any]]:
    cards = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(GPU_FIELDS) or not parts[0].isdigit():
            continue
        values = dict(zip(GPU_FIELDS, parts, strict=True))
        cards.append(
            {
                "index": int(values["index"]),
                "uuid": values["uuid"],
                "memory_used_mib": _number(values["memory.used"]),
                "memory_total_mib": _number(values["memory.total"]),
                "utilization_percent": _number(values["utilization.gpu"]),
                "temperature_c": _number(values["temperature.gpu"]),
                "ecc_uncorrected": _number(values["ecc.errors.uncorrected.volatile.total"]),
            }
        )
    return cards


def parse_apps(text: str) -> list[dict[str, Any]]:
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", len(APP_FIELDS) - 1)]
        if len(parts) != len(APP_FIELDS) or not parts[1].isdigit():
            continue
        apps.append(
            {"uuid": parts[0], "pid": int(parts[1]), "used_mib": _number(parts[2]), "name": parts[3][:120]}
        )
    return apps


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class Telemetry:
    """The node's card telemetry, sampled at most every ``min_interval`` seconds.

    ``groups`` answers the process groups of the replicas the agent runs (``{pgid: replica}``):
    a process in none of them is foreign.
    """

    def __init__(
        self,
        cards: tuple[CardConfig, ...],
        groups: Callable[[], dict[int, str]],
        *,
        min_interval: float = MIN_INTERVAL,
    ):
        self.cards = cards
        self.groups = groups
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._last: dict[str, Any] | None = None
        self._at = 0.0

    def sample(self) -> dict[str, Any]:
        with self._lock:
            if self._last is None or time.monotonic() - self._at >= self.min_interval:
                self._last = self._read()
                self._at = time.monotonic()
            return self._last

    def _run(self, exe: str, query: str, fields: tuple[str, ...]) -> str | None:
        try:
            done = subprocess.run(
                [exe, f"{query}={','.join(fields)}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    def _read(self) -> dict[str, Any]:
        at = time.time()
        exe = shutil.which("nvidia-smi")
        gpus = self._run(exe, "--query-gpu", GPU_FIELDS) if exe else None
        if gpus is None:
            return {
                "at": at,
                "source": "config",
                "cards": [
                    {
                        "index": c.index,
                        "memory_used_mib": None,
                        "memory_total_mib": c.memory_mib,
                        "utilization_percent": None,
                        "temperature_c": None,
                        "ecc_uncorrected": None,
                        "processes": [],
                    }
                    for c in self.cards
                ],
            }
        cards = parse_gpus(gpus)
        by_uuid = {card.pop("uuid"): card for card in cards}
        for card in cards:
            card["processes"] = []
        groups = self.groups()
        for app in parse_apps(self._run(exe, "--query-compute-apps", APP_FIELDS) or "") if exe else []:
            holder = by_uuid.get(app.pop("uuid"))
            if holder is None:
                continue
            group = _group_of(app["pid"])
            app["replica"] = groups.get(group) if group is not None else None
            holder["processes"].append(app)
        return {"at": at, "source": "nvidia-smi", "cards": sorted(cards, key=lambda c: c["index"])}
