"""A telemetry sampling round at fleet scale: 1,000 nodes of 8 cards against the interval.

Run: `.venv/bin/python bench/telemetry_round.py [--database-url URL] [--nodes 1000] [--agents 16]
[--rounds 3]`.

The generated fleet (demo/scale.py: ``--nodes`` nodes of 8 cards, 500 models, their replicas)
in the benchmark's own database (created anew: BENCH_TELEMETRY_DATABASE_URL), each card's
history filled to LLMGW_TELEMETRY_HISTORY_SAMPLES samples (the steady state the prune meets).
Three ways, each ``--rounds`` times, the load average beside each:

- *per node*: ``telemetry_record`` for each node in turn, one transaction a node (the path the
  issue timed, now a batch of one);
- *batched, no agents*: the round's write path without agent calls: every node's answer built
  here (each card's processes named by the replicas the catalog puts on it) and written by
  ``readings_write`` LLMGW_TELEMETRY_BATCH nodes at a time, then ``readings_prune``;
- *with stand-in agents*: ``fleet_sample()`` as the worker runs it, against ``--agents`` real
  ``python -m llmgw_agent`` processes on 127.0.0.1 reading the stand-in nvidia-smi, every node's
  address pointing at one of them (a thousand agent processes would not fit two cores).

Printed per way: the seconds (median, and each), the share of LLMGW_TELEMETRY_SECONDS, the CPU
time of the benchmark's own process (the control plane's side: its threads, not the database's
nor the agents'), and how many times the readings' version was raised in a round. JSON in var/bench/telemetry_round.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "agent"))

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/llmgw_bench_telemetry"


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_TELEMETRY_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=16, help="stand-in agent processes (0: none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "var" / "bench" / "telemetry_round.json"))
    args = parser.parse_args()

    from bench.localfleet import SECRET
    from bench.pages import _create_database

    os.environ.update(
        {
            "DATABASE_URL": args.database_url,
            "DJANGO_SECRET_KEY": SECRET,
            "DJANGO_SETTINGS_MODULE": "llmgw_web.settings",
            "LLMGW_AGENT_NETWORKS": "private,127.0.0.0/8",
        }
    )
    _create_database(args.database_url, anew=True)
    import django

    django.setup()
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    from django.conf import settings
    from django.core.management import call_command

    from demo.scale import Sizes, generate

    call_command("migrate", verbosity=0)
    t = time.monotonic()
    generate(
        Sizes(nodes=args.nodes, models=min(500, args.nodes // 2), operations=0, audit=0), say=lambda _: None
    )
    print(f"fleet of {args.nodes} nodes ready in {time.monotonic() - t:.0f} s", flush=True)
    _fill_history(settings.LLMGW_TELEMETRY_HISTORY_SAMPLES, settings.LLMGW_TELEMETRY_SECONDS)

    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "nodes": args.nodes,
        "batch": settings.LLMGW_TELEMETRY_BATCH,
        "interval": settings.LLMGW_TELEMETRY_SECONDS,
        "ways": {},
    }
    bodies = _bodies()
    results["ways"]["per node"] = _rounds(args.rounds, lambda: _per_node(bodies))
    _report("per node (telemetry_record, one transaction a node)", results["ways"]["per node"])
    results["ways"]["batched"] = _rounds(args.rounds, lambda: _batched(bodies))
    _report("batched, no agents (readings_write, then readings_prune)", results["ways"]["batched"])
    if args.agents:
        with _agents(args.agents) as count:
            from telemetry.services import fleet_sample, sampling_parallel

            def sampled() -> dict[str, float]:
                t = time.monotonic()
                answered = fleet_sample()
                assert all(answered.values()), [n for n, ok in answered.items() if not ok][:5]
                return {"seconds": time.monotonic() - t}

            results["ways"]["agents"] = _rounds(args.rounds, sampled) | {
                "agents": count,
                "parallel": sampling_parallel(args.nodes),
            }
            _report(
                f"with {count} stand-in agents (fleet_sample, {sampling_parallel(args.nodes)} at a time)",
                results["ways"]["agents"],
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


def _fill_history(samples: int, interval: float) -> None:
    """Every card's history as a sampler at ``interval`` leaves it: ``samples`` samples, one SQL statement."""
    from django.db import connection

    t = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO telemetry_cardsample (card_id, at, memory_used_mib, utilization_percent, temperature_c, "
            "foreign_mib) SELECT c.id, now() - make_interval(secs => %s * s), 1000, 10, 40, 0 "
            "FROM catalog_card c CROSS JOIN generate_series(1, %s) s",
            [interval, samples],
        )
        cursor.execute("ANALYZE telemetry_cardsample")
    print(f"history: {samples} samples a card in {time.monotonic() - t:.0f} s", flush=True)


def _bodies() -> list[tuple[Any, dict[str, Any]]]:
    """Each node's answer as its agent gives it: each card's memory, and a process per replica the
    catalog puts on it (every 50th card also held by a foreign process)."""
    from catalog.models import Node, Shard

    on: dict[tuple[int, int], list[str]] = {}
    for node_id, index, name in Shard.objects.values_list("card__node_id", "card__index", "replica__name"):
        on.setdefault((node_id, index), []).append(name)
    out = []
    for k, node in enumerate(Node.objects.order_by("name")):
        cards = []
        for index in range(8):
            names = on.get((node.pk, index), [])
            processes: list[dict[str, Any]] = [
                {"pid": 1000 + j, "used_mib": 70000, "name": "vllm", "replica": r}
                for j, r in enumerate(names)
            ]
            if (k * 8 + index) % 50 == 0:
                processes.append({"pid": 99, "used_mib": 512, "name": "python3", "replica": None})
            cards.append(
                {
                    "index": index,
                    "memory_used_mib": sum(int(p["used_mib"]) for p in processes),
                    "memory_total_mib": 81559,
                    "utilization_percent": 30,
                    "temperature_c": 45,
                    "processes": processes,
                }
            )
        out.append((node, {"source": "nvidia-smi", "cards": cards}))
    return out


def _version() -> int:
    from versions.models import Version

    return Version.objects.get(area="telemetry").n


def _per_node(bodies) -> dict[str, float]:
    from telemetry.services import readings_prune, telemetry_record

    t = time.monotonic()
    for node, body in bodies:
        telemetry_record(node=node, body=body)
    write = time.monotonic() - t
    readings_prune()
    return {"seconds": time.monotonic() - t, "write": write}


def _batched(bodies) -> dict[str, float]:
    from django.conf import settings

    from telemetry.services import readings_prune, readings_write

    size = settings.LLMGW_TELEMETRY_BATCH
    t = time.monotonic()
    for i in range(0, len(bodies), size):
        readings_write(bodies[i : i + size])
    write = time.monotonic() - t
    readings_prune()
    return {"seconds": time.monotonic() - t, "write": write}


def _rounds(n: int, one) -> dict[str, Any]:
    runs = []
    for _ in range(n):
        before, load, cpu = _version(), _load(), time.process_time()
        figures = one() | {"cpu": time.process_time() - cpu}
        runs.append(
            {**{k: round(v, 2) for k, v in figures.items()}, "raises": _version() - before, "load": load}
        )
    seconds = [r["seconds"] for r in runs]
    return {"median": round(statistics.median(seconds), 2), "runs": runs}


def _report(what: str, result: dict[str, Any]) -> None:
    from django.conf import settings

    interval = settings.LLMGW_TELEMETRY_SECONDS
    print(
        f"{what}: median {result['median']} s ({result['median'] / interval:.0%} of {interval:g} s); "
        + "; ".join(
            f"{r['seconds']} s"
            + (f" (write {r['write']} s)" if "write" in r else "")
            + f", this process's CPU {r['cpu']} s"
            + f", {r['raises']} version raises, load {r['load']}"
            for r in result["runs"]
        ),
        flush=True,
    )


class _agents:
    """``count`` real agents reading the stand-in nvidia-smi, every node pointed at one of them."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __enter__(self) -> int:
        import contextlib

        from agent_fakes import standin_gpus
        from agent_testing import free_port, running_agent

        from catalog.models import Node

        self.stack = contextlib.ExitStack()
        tmp = Path(tempfile.mkdtemp(prefix="llmgw-telemetry-"))
        cards = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559} for i in range(8)]
        agents = [
            self.stack.enter_context(
                running_agent(
                    tmp / f"agent-{i}",
                    node=f"agent-{i}",
                    port=free_port(),
                    cards=cards,
                    env=standin_gpus(tmp / f"agent-{i}-gpus", cards),
                )
            )
            for i in range(self.count)
        ]
        for k, pk in enumerate(Node.objects.order_by("name").values_list("pk", flat=True)):
            agent = agents[k % len(agents)]
            Node.objects.filter(pk=pk).update(agent_url=agent.base_url, agent_token=agent.token)
        return self.count

    def __exit__(self, *exc: object) -> None:
        self.stack.close()


if __name__ == "__main__":
    main()
