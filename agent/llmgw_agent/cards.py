"""The node's cards: from nvidia-smi when it is there and works, else from the
configuration (nodes without a driver, demos and tests)."""

from __future__ import annotations

import logging
import shutil
import subprocess

from .config import CardConfig

log = logging.getLogger("llmgw_agent")

QUERY = ["--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]


def discover_cards(
    configured: tuple[CardConfig, ...], *, timeout: float = 15.0
) -> tuple[tuple[CardConfig, ...], str]:
    """The cards and where they came from: ``"nvidia-smi"`` or ``"config"``.

    Read once at startup: cards do not come and go while the agent runs, and
    nvidia-smi can take seconds on a busy node.
    """
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return configured, "config"
    try:
        done = subprocess.run(
            [binary, *QUERY],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi did not run (%s); using the cards from the configuration", exc)
        return configured, "config"
    if done.returncode != 0:
        log.warning(
            "nvidia-smi exited with %s (%s); using the cards from the configuration",
            done.returncode,
            done.stderr.strip()[:200],
        )
        return configured, "config"
    try:
        cards = parse_nvidia_smi(done.stdout)
    except ValueError as exc:
        log.warning("could not read nvidia-smi's output (%s); using the cards from the configuration", exc)
        return configured, "config"
    if not cards:
        log.warning("nvidia-smi lists no cards; using the cards from the configuration")
        return configured, "config"
    return cards, "nvidia-smi"


def parse_nvidia_smi(output: str) -> tuple[CardConfig, ...]:
    """Cards from ``nvidia-smi --query-gpu=index,name,memory.total
    --format=csv,noheader,nounits`` output, e.g. ``0, NVIDIA H100 80GB HBM3, 81559``."""
    cards = []
    for line in output.splitlines():
        if not line.strip():
            continue
        index, sep, rest = line.partition(",")
        name, sep2, memory = rest.rpartition(",")
        if not sep or not sep2:
            raise ValueError(f"unexpected line {line!r}")
        cards.append(
            CardConfig(index=int(index.strip()), name=name.strip(), memory_mib=int(float(memory.strip())))
        )
    return tuple(sorted(cards, key=lambda card: card.index))
