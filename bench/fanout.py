"""The restart fan-out against its ideal: 64 replicas over 16 local agents, a 2 s engine load.

Run: `make bench` (after bench/pages.py), or
`.venv/bin/python bench/fanout.py [--database-url URL] [--parallel 1,4,8,16] [--load-seconds 2]`.

Sixteen real node agents on 127.0.0.1 (ports below the kernel's ephemeral range), eight cards
each, the stand-in engine for vLLM; one model whose one-card profile has 64 ready replicas, four
on each node. For each ``--max-parallel`` asked, the profile is changed (so every replica is
stale) and a rolling restart of all 64 is started through the service; a real
``manage.py db_worker`` runs it with the production settings. The time is the operation's own,
from its start to its end as the database records them, and the wall time from the request to
the end. Ideal: ``ceil(64 / p)`` waves of one engine load each.

The database is the benchmark's own (flushed at the start): BENCH_FANOUT_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/llmgw_bench_fanout"
NODES, CARDS, REPLICAS = 16, 8, 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_FANOUT_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--parallel", default="1,4,8,16", help="--max-parallel values, comma-separated")
    parser.add_argument("--load-seconds", type=float, default=2.0)
    parser.add_argument("--out", default=str(ROOT / "var" / "bench" / "fanout.json"))
    args = parser.parse_args()
    parallels = [int(p) for p in args.parallel.split(",")]

    sys.path.insert(0, str(ROOT))
    from bench.localfleet import local_fleet, scratch_database, worker

    env = scratch_database(args.database_url)
    from audit.actor import Actor, acting_as
    from catalog.models import Profile
    from catalog.services import catalog as services
    from operations.models import RestartOperation
    from operations.services.start import restart_start

    tmp = Path(tempfile.mkdtemp(prefix="llmgw-fanout-"))
    actor = Actor(via="cli", name="bench")
    results = []
    with (
        local_fleet(
            tmp,
            nodes=NODES,
            cards=CARDS,
            models={"fanout": REPLICAS},
            load_seconds=args.load_seconds,
            actor=actor,
        ) as fleet,
        contextlib.ExitStack() as stack,
    ):
        print(f"{REPLICAS} replicas ready on {NODES} agents", flush=True)
        w = worker("bench-worker", env, tmp / "worker.log")
        stack.callback(lambda: (w.kill(), w.wait(timeout=30)))
        for run, p in enumerate(parallels):
            profile = Profile.objects.get(pk=fleet.profiles["fanout"].pk)
            profile.env = {**profile.env, "BENCH_RUN": str(run)}
            with acting_as(actor):
                services.profile_save(instance=profile)
            asked = time.monotonic()
            with acting_as(actor):
                op = restart_start(model_name="fanout", max_parallel=p, ready_timeout=120)
            while True:
                op = RestartOperation.objects.get(pk=op.pk)
                if op.state not in ("queued", "running"):
                    break
                time.sleep(0.2)
            wall = time.monotonic() - asked
            took = (op.finished_at - op.started_at).total_seconds()
            ideal = math.ceil(REPLICAS / p) * args.load_seconds
            done = op.steps.filter(state="succeeded").count()
            results.append(
                {
                    "max_parallel": p,
                    "state": op.state,
                    "steps_succeeded": done,
                    "seconds": round(took, 1),
                    "wall_seconds": round(wall, 1),
                    "ideal_seconds": ideal,
                    "ratio": round(took / ideal, 2),
                }
            )
            print(
                f"--max-parallel {p}: {op.state}, {done} of {REPLICAS} steps, {took:.1f} s "
                f"(request to end {wall:.1f} s), ideal {ideal:g} s: {took / ideal:.2f}×",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": results}, indent=2)
    )
    print("\n| --max-parallel | took | ideal | × ideal | steps |\n|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['max_parallel']} | {r['seconds']} s | {r['ideal_seconds']:g} s | {r['ratio']} | "
            f"{r['steps_succeeded']} of {REPLICAS} |"
        )


if __name__ == "__main__":
    main()
