"""The audit log's verifier at a million entries, and the page of changes made outside the application.

Run: `.venv/bin/python bench/audit_verify.py [--database-url URL] [--entries N] [--after K] [--rounds R]`
(PostgreSQL; a database of its own, created when missing, default llmgw_bench_verify).

1. Fills the log to N entries (manage.py generate_fleet --audit N: the 1,000-node fleet, whose 25,000
   catalog rows are written without auditing and so are changes outside the application) and gives
   every entry a row change of an audited transaction, as the application's writes leave them
   (inserted straight into audit_rowchange with the entries' transaction ids; the commit-time trigger
   judges each as it would a real one). Idempotent: a second run adds only what is missing.
2. A signed checkpoint of the log's end (to a file of the bench's own), then K more entries appended.
3. ``manage.py audit_verify`` (from the checkpoint: its entry and the K after it) and then
   ``manage.py audit_verify --full`` (every entry, its progress printed as it comes), each in a process
   of its own, timed, with the load average beside each. Both must finish with the chain intact (the
   verdict names the generated fleet's rows as changed outside the application: exit 1 for that alone
   is expected); the incremental run within 60 s.
4. ``/audit/outside/``: its newest, second and oldest pages through the view, R rounds interleaved,
   median time and queries per page.
Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "agent"))

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/llmgw_bench_verify"
SECRET = "bench-only-secret-key-not-for-any-deployment-0123456789abcdef"
INCREMENTAL_TARGET_S = 60.0
OUTSIDE_ONLY = "the chain is intact, but"
BATCH = 100_000  # the verdict when only the generated fleet's rows are unaudited


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (5 min {five:.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_VERIFY_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--after", type=int, default=10_000, help="entries appended after the checkpoint")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    checkpoints = Path(
        os.environ.get("BENCH_VERIFY_CHECKPOINTS", "/tmp/llmgw-bench-verify/checkpoints.jsonl")
    )
    env = {
        "DATABASE_URL": args.database_url,
        "DJANGO_SECRET_KEY": SECRET,
        "DJANGO_SETTINGS_MODULE": "llmgw_web.settings",
        "ALLOWED_HOSTS": "testserver,127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
        "LLMGW_AUDIT_CHECKPOINT_FILE": str(checkpoints),
    }
    os.environ.update(env)
    _create_database(args.database_url)
    import django

    django.setup()
    from django.core.management import call_command

    print(f"{os.cpu_count()} cores; {load()} at the start", flush=True)
    t = time.monotonic()
    call_command("migrate", verbosity=0)
    call_command("generate_fleet", "--audit", str(args.entries))
    print(f"fleet and log ready in {time.monotonic() - t:.0f} s", flush=True)
    _row_changes()

    from audit.chain import checkpoint_append, checkpoint_now
    from audit.models import AuditEntry

    checkpoint_append(checkpoints, checkpoint_now())
    total = AuditEntry.objects.count() + args.after
    call_command("generate_fleet", "--audit", str(total))
    print(f"checkpoint written, then {args.after:,} entries appended: {total:,} in all", flush=True)

    failures = []
    seconds, out = _verify(env, [])
    print(f"audit_verify (from the checkpoint): {seconds:.1f} s, {load()}\n  {out}", flush=True)
    if seconds >= INCREMENTAL_TARGET_S:
        failures.append(f"audit_verify from the checkpoint took {seconds:.1f} s (target: under 60 s)")
    if not out.startswith(("the audit log is intact", OUTSIDE_ONLY)):
        failures.append(f"audit_verify from the checkpoint did not find the chain intact: {out}")
    seconds, out = _verify(env, ["--full"])
    print(f"audit_verify --full: {seconds:.1f} s, {load()}\n  {out}", flush=True)
    if not out.startswith(("the audit log is intact", OUTSIDE_ONLY)):
        failures.append(f"audit_verify --full did not find the chain intact: {out}")
    failures += _outside_pages(args.rounds)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


def _row_changes() -> None:
    """One row change per entry, of the entry's transaction: what a million audited writes leave."""
    from django.db import connection, transaction

    from audit.models import AuditEntry, RowChange

    log, changes = AuditEntry._meta.db_table, RowChange._meta.db_table
    t = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT coalesce(max(row_key::bigint), 0) FROM {changes} WHERE table_name = 'gen_bench'"
        )
        done = cursor.fetchone()[0]
    last = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
    added = 0
    for start in range(done, last, BATCH):  # a transaction a batch: the commit's trigger queue stays small
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {changes} (at, txid, table_name, operation, row_key, before, after, db_role) "
                f"SELECT at, txid, 'gen_bench', 'UPDATE', id::text, %s, %s, 'llmgw_app' FROM {log} "
                "WHERE id > %s AND id <= %s ORDER BY id",
                ['{"state": "ready"}', '{"state": "cordoned"}', start, start + BATCH],
            )
            added += cursor.rowcount
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {changes}")
    print(
        f"row changes of audited transactions: {added:,} added ({time.monotonic() - t:.1f} s, the commit's "
        f"trigger judging each); {RowChange.objects.count():,} in all",
        flush=True,
    )


def _verify(env: dict[str, str], options: list[str]) -> tuple[float, str]:
    """``manage.py audit_verify`` in a process of its own: its time and its verdict; progress as it comes."""
    start = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "audit_verify", *options],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None and process.stdout is not None
    verdict = []
    for line in process.stderr:
        if line.startswith("read "):
            print(f"    {line.rstrip()} ({load()})", flush=True)
        elif line.strip():
            verdict.append(line.rstrip())
    out = process.stdout.read().strip()
    process.wait()
    seconds = time.monotonic() - start
    said = out or next(
        (line.removeprefix("CommandError: ") for line in verdict if "CommandError" in line), ""
    )
    return seconds, f"{said} (exit {process.returncode})"


def _outside_pages(rounds: int) -> list[str]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from audit.selectors import outside_count, outside_page
    from demo.scale import BENCH_USER

    setup_test_environment()
    client = Client()
    client.force_login(get_user_model().objects.get(username=BENCH_USER))
    second = outside_page().older
    pages: dict[str, dict[str, Any]] = {"newest": {}, "second": {"before": second}, "oldest": {"after": 0}}
    timings: dict[str, list[float]] = {label: [] for label in pages}
    queries: dict[str, int] = {}
    client.get("/audit/outside/")  # the session read once
    for _ in range(rounds):
        for label, query in pages.items():
            with CaptureQueriesContext(connection) as captured:
                start = time.perf_counter()
                response = client.get("/audit/outside/", query)
                timings[label].append(time.perf_counter() - start)
            assert response.status_code == 200 and response.context["page"].entries, label
            queries[label] = len(captured)
    print(f"/audit/outside/ ({outside_count():,} changes made outside, median of {rounds}, {load()}):")
    failures = []
    for label, times in timings.items():
        ms = statistics.median(times) * 1000
        print(f"  {label} page: {ms:.1f} ms, {queries[label]} queries")
        if ms > 250:
            failures.append(f"the outside page's {label} page took {ms:.0f} ms")
    return failures


def _create_database(url: str) -> None:
    if not url.startswith("postgres"):
        raise SystemExit("bench/audit_verify.py needs PostgreSQL (BENCH_VERIFY_DATABASE_URL)")
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    sys.exit(main())
