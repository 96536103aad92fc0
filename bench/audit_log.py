"""The audit log at a million entries: the export's memory, and the filtered last page against the first.

Run: `.venv/bin/python bench/audit_log.py [--database-url URL] [--entries N] [--rounds R]`
(PostgreSQL; a database of its own, created when missing, default llmgw_bench_audit).

1. Fills the log to N entries (manage.py generate_fleet --audit N on a one-node fleet; idempotent).
2. Export: streams the CSV and the JSON Lines export of the whole log, and of its first days, each
   in a fresh process through the real view (Django's test client, a signed-in superuser),
   reading the stream chunk by chunk, and reports each process's peak resident memory. Constant
   memory: the whole log's peak is within 32 MiB of the part's. Exits 1 otherwise.
3. Pages: the filtered list (via=api, object_type=profile), its newest page and its oldest
   (``after=0``), R times each, interleaved, through the view; the oldest's median must be within
   2x the newest's. The keyset queries' plans (EXPLAIN) must use an index and no sequential scan
   of the log. Exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/llmgw_bench_audit"
SECRET = "bench-only-secret-key-not-for-any-deployment-0123456789abcdef"
FILTER = {"via": "api", "object_type": "profile"}
MEMORY_SLACK_MIB = 32

EXPORT_CHILD = """
import json, resource, sys, time
import django
django.setup()
from django.contrib.auth import get_user_model
from django.test import Client
from demo.scale import BENCH_USER
kind, query = sys.argv[1], json.loads(sys.argv[2])
client = Client()
client.force_login(get_user_model().objects.get(username=BENCH_USER))
start = time.monotonic()
response = client.get(f"/audit/export.{kind}", query)
assert response.status_code == 200 and response.streaming, response.status_code
size = lines = 0
for chunk in response.streaming_content:
    size += len(chunk)
    lines += chunk.count(b"\\n")
print(json.dumps({"bytes": size, "lines": lines, "seconds": time.monotonic() - start,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_AUDIT_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", choices=["export", "pages"], default=None, help="run one half only")
    args = parser.parse_args()
    env = {
        "DATABASE_URL": args.database_url,
        "DJANGO_SECRET_KEY": SECRET,
        "DJANGO_SETTINGS_MODULE": "llmgw_web.settings",
        "ALLOWED_HOSTS": "testserver,127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
    }
    os.environ.update(env)
    _create_database(args.database_url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    t = time.monotonic()
    call_command(
        "generate_fleet", "--nodes", "1", "--models", "1", "--operations", "0", "--audit", str(args.entries)
    )
    print(f"log ready in {time.monotonic() - t:.0f} s", flush=True)

    failures = (export_memory(env) if args.only != "pages" else []) + (
        pages(args.rounds) if args.only != "export" else []
    )
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


def export_memory(env: dict[str, str]) -> list[str]:
    from audit.models import AuditEntry

    total = AuditEntry.objects.count()
    tenth = AuditEntry.objects.order_by("id").values_list("at", flat=True)[total // 10]
    failures = []
    for kind in ("csv", "jsonl"):
        runs = {}
        for label, query in (("part", {"until": str(tenth.date())}), ("all", {})):
            out = subprocess.run(
                [sys.executable, "-c", EXPORT_CHILD, kind, json.dumps(query)],
                cwd=ROOT,
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                check=True,
            )
            runs[label] = json.loads(out.stdout.strip().splitlines()[-1])
            r = runs[label]
            print(
                f"export {kind:5} {label:7}: {r['lines']:>9,} lines, {r['bytes'] / 2**20:7.1f} MiB in "
                f"{r['seconds']:6.1f} s, peak memory {r['peak_mib']:6.1f} MiB",
                flush=True,
            )
        grew = runs["all"]["peak_mib"] - runs["part"]["peak_mib"]
        if grew > MEMORY_SLACK_MIB:
            failures.append(
                f"the {kind} export's peak memory grew {grew:.0f} MiB from part of the log to all of it"
            )
    return failures


def pages(rounds: int) -> list[str]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    from audit.selectors import entries_matching
    from demo.scale import BENCH_USER

    setup_test_environment()  # so that each response carries its template context, to check the page
    client = Client()
    client.force_login(get_user_model().objects.get(username=BENCH_USER))
    timings: dict[str, list[float]] = {"newest": [], "oldest": []}
    for _ in range(rounds):
        for label, extra in (("newest", {}), ("oldest", {"after": "0"})):
            start = time.perf_counter()
            response = client.get("/audit/", {**FILTER, **extra})
            timings[label].append(time.perf_counter() - start)
            assert response.status_code == 200 and response.context["page"].entries
    first, last = (statistics.median(timings[k]) * 1000 for k in ("newest", "oldest"))
    print(
        f"filtered list {FILTER}: newest page {first:.1f} ms, oldest page {last:.1f} ms (median of {rounds})"
    )
    failures = []
    if last > 2 * first:
        failures.append(f"the oldest page took {last:.1f} ms, more than twice the newest's {first:.1f} ms")
    from audit.selectors import keyset_page

    qs = entries_matching(FILTER).order_by()
    newest, oldest = keyset_page(qs), keyset_page(qs, after=0)
    queries = (
        ("newest page", qs.order_by("-id")[:50]),
        ("oldest page", qs.filter(id__gt=0).order_by("id")[:50]),
        # the pager's probes at the two ends, where nothing lies beyond: each must be an index range
        ("newest page's newer probe", qs.filter(id__gt=newest.entries[0].pk)[:1]),
        ("oldest page's older probe", qs.filter(id__lt=oldest.entries[-1].pk)[:1]),
    )
    for label, query in queries:
        sql, params = query.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        uses = "index" if "Index" in plan and "Seq Scan" not in plan else "NO INDEX"
        scan = next((line.strip() for line in plan.splitlines() if "Scan" in line), plan.splitlines()[0])
        print(f"plan of the {label}: {uses}: {scan}")
        if uses != "index":
            failures.append(f"the {label}'s query plan does not use an index:\n{plan}")
    return failures


def _create_database(url: str) -> None:
    if not url.startswith("postgres"):
        raise SystemExit("bench/audit_log.py needs PostgreSQL (BENCH_AUDIT_DATABASE_URL)")
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    sys.exit(main())
