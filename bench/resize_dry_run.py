"""How long a resize dry run (the live form's preview) takes as the fleet grows.

Run: `make bench-dry-run` (or `.venv/bin/python bench/resize_dry_run.py [--database-url URL] [--sizes N,...] [--repeat R]`).

It builds fleets of 10, 100, 1000 and 5000 nodes of 8 cards in a scratch
database, half the cards held by replicas, and times `model_resize(...,
dry_run=True)` through the service (queries included) and `plan_resize` alone
(the pure rules), reporting the median and the 95th percentile of repeated
runs and the number of queries.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    args = _arguments()
    _setup(args.database_url)
    from django.db import connection

    cls, model, profile, other = _catalog()
    print(f"database: {connection.vendor}; {args.repeat} runs per size\n")
    print(f"{'nodes':>6} {'cards':>6} {'queries':>8} {'service median':>15} {'p95':>9} {'rules median':>13}")
    built = 0
    for size in [int(s) for s in args.sizes.split(",")]:
        _grow_fleet(cls, profile, other, built, size)
        built = size
        print(_measured(model, profile, size, args.repeat))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        default=None,
        help="a PostgreSQL URL to a scratch database (dropped and created anew); "
        "default: a temporary SQLite file",
    )
    parser.add_argument("--sizes", default="10,100,1000,5000", help="node counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=30)
    return parser.parse_args()


def _setup(database_url: str | None) -> None:
    """Django on the scratch database (PostgreSQL, dropped and created anew, or a temporary
    SQLite file), migrated."""
    if database_url:
        from bench.pages import _create_database

        # Dropped rather than flushed: the audit log's triggers refuse TRUNCATE.
        _create_database(database_url, anew=True)
    tmp = tempfile.mkdtemp(prefix="llmgw-bench-")
    os.environ["DATABASE_URL"] = database_url or f"sqlite:///{tmp}/bench.sqlite3"
    os.environ.setdefault(
        "DJANGO_SECRET_KEY", "bench-only-secret-key-not-for-any-deployment-0123456789abcdef"
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_web.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _catalog() -> tuple[Any, Any, Any, Any]:
    """The card class, the model to resize (Llama-3.1-8B's shape) and its profile, and another
    model's profile, which holds most of the replicas."""
    from catalog.models import GPUClass, Profile, ServedModel

    cls = GPUClass.objects.create(
        name="h100-80g", memory_mib=81559, usable_mib=73400, compute_capability="9.0"
    )
    model = ServedModel.objects.create(
        name="llama-3.1-8b",
        source="meta-llama/Llama-3.1-8B-Instruct",
        context_length=131072,
        layers=32,
        attention_heads=32,
        kv_heads=8,
        head_dim=128,
        attention="gqa",
        kv_bytes_per_token=131072,
        weight_bytes=16060522496,
    )
    profile = Profile.objects.create(
        model=model, name="h100", engine="vllm", gpu_class=cls, args=["--max-model-len", "32768"]
    )
    other = Profile.objects.create(
        model=ServedModel.objects.create(name="other", source="x"), name="p", engine="vllm", gpu_class=cls
    )
    return cls, model, profile, other


def _grow_fleet(cls: Any, profile: Any, other: Any, built: int, size: int) -> None:
    """Nodes ``built`` to ``size`` of 8 cards, each with a ready replica on its first four cards
    (one in ten of ``profile``, the rest of ``other``)."""
    from catalog.models import Card, Node, Replica, Shard

    nodes = Node.objects.bulk_create(
        Node(name=f"gpu-{i:05d}", agent_url="http://127.0.0.1:9", agent_token="t") for i in range(built, size)
    )
    cards = Card.objects.bulk_create(Card(node=n, index=j, gpu_class=cls) for n in nodes for j in range(8))
    replicas = Replica.objects.bulk_create(
        Replica(
            name=f"r-{n.name}",
            profile=profile if k % 10 == 0 else other,
            port=8000,
            state="ready",
            revision=1,
        )
        for k, n in enumerate(nodes)
    )
    by_node = {n.pk: r for n, r in zip(nodes, replicas, strict=True)}
    Shard.objects.bulk_create(Shard(replica=by_node[c.node_id], card=c) for c in cards if c.index < 4)


def _measured(model: Any, profile: Any, size: int, repeat: int) -> str:
    """The table's line for a fleet of ``size`` nodes: the service's queries, its median and 95th
    percentile over ``repeat`` runs, and the pure rules' median."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from catalog import selectors
    from operations.services.resize import model_resize
    from planning import plan_resize

    with CaptureQueriesContext(connection) as queries:
        model_resize(name="llama-3.1-8b", gpus=2, dry_run=True)
    service = []
    for _ in range(repeat):
        t = time.perf_counter()
        model_resize(name="llama-3.1-8b", gpus=2, dry_run=True)
        service.append(time.perf_counter() - t)
    spec, classes, rooms = (
        selectors.model_spec(model),
        selectors.gpu_class_specs(),
        selectors.node_rooms(profile),
    )
    rules = []
    for _ in range(repeat):
        t = time.perf_counter()
        plan_resize(model=spec, gpus=2, profile=None, in_place=False, classes=classes, nodes=rooms, running=1)
        rules.append(time.perf_counter() - t)
    p95 = statistics.quantiles(service, n=20)[-1]
    return (
        f"{size:>6} {size * 8:>6} {len(queries):>8} {statistics.median(service) * 1e3:>12.2f} ms "
        f"{p95 * 1e3:>6.2f} ms {statistics.median(rules) * 1e3:>10.3f} ms"
    )


if __name__ == "__main__":
    main()
