"""What the fleet's version counter costs its writers (versions/triggers.py).

Run: `.venv/bin/python bench/versions.py [--database-url URL] [--writers 1,4,8] [--transactions N]`
on the benchmark's database (BENCH_DATABASE_URL, a generated fleet; it needs to be migrated).

Each writer is a connection that commits ``transactions`` small transactions, one telemetry
sample of one card each (what the sampler writes: the telemetry area's busiest writer), first
with the version trigger on the sample table and then with it disabled, ``writers`` at once, in
interleaved rounds. Printed: transactions a second and the median commit time, on and off. The
rows it writes are deleted after; the trigger is enabled again whatever happens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/llmgw_bench"


def run(url: str, writers: int, transactions: int, card_ids: list[int]) -> tuple[float, float]:
    import psycopg

    durations: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(writers)

    def writer(n: int) -> None:
        with psycopg.connect(url) as conn:
            mine = []
            start.wait()
            for i in range(transactions):
                card = card_ids[(n * transactions + i) % len(card_ids)]
                t = time.perf_counter()
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO telemetry_cardsample (card_id, at, foreign_mib) VALUES (%s, now(), 0)",
                        [card],
                    )
                mine.append(time.perf_counter() - t)
            with lock:
                durations.extend(mine)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return len(durations) / wall, 1000 * statistics.median(durations)


def main() -> None:
    import psycopg

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--writers", default="1,4,8")
    parser.add_argument("--transactions", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = args.database_url
    with psycopg.connect(url, autocommit=True) as conn:
        card_ids = [r[0] for r in conn.execute("SELECT id FROM catalog_card ORDER BY id LIMIT 1000")]
        row = conn.execute("SELECT coalesce(max(id), 0) FROM telemetry_cardsample").fetchone()
        first = row[0] if row else 0
        if not card_ids:
            raise SystemExit(
                "no cards: generate the fleet first (bench/pages.py or manage.py generate_fleet)"
            )
    print("| writers | version trigger | transactions/s | median commit |")
    print("|---:|---|---:|---:|")
    try:
        for writers in (int(w) for w in args.writers.split(",")):
            results: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
            for _ in range(args.rounds):
                for state in ("on", "off"):
                    with psycopg.connect(url, autocommit=True) as conn:
                        verb = "ENABLE" if state == "on" else "DISABLE"
                        conn.execute(f"ALTER TABLE telemetry_cardsample {verb} TRIGGER versions_touch")
                    results[state].append(run(url, writers, args.transactions, card_ids))
            for state in ("on", "off"):
                rate = statistics.median(r[0] for r in results[state])
                commit = statistics.median(r[1] for r in results[state])
                print(f"| {writers} | {state} | {rate:.0f} | {commit:.2f} ms |", flush=True)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE telemetry_cardsample ENABLE TRIGGER versions_touch")
            conn.execute("DELETE FROM telemetry_cardsample WHERE id > %s", [first])


if __name__ == "__main__":
    main()
