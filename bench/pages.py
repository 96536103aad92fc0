"""The pages and endpoints against the floor, on the generated fleet, served as in production,
each asked by the role a real user needs, warm, right after a write, and under the sampler's writes.

Run: `make bench` (which runs this first, then the other benchmarks), or
`.venv/bin/python bench/pages.py [--nodes N] [--audit A] [--database-url URL] [--rounds R]
[--requests N] [--writes W] [--concurrency C] [--phases warm,replica,structure,sampler]`.

1. Generates the fleet (manage.py generate_fleet: by default 1,000 nodes × 8 cards, 500 models,
   1,500 profiles, 8,000 replicas, 2,000 restarts, 1,000,000 audit entries, and a viewer, an
   operator and a lead; bulk inserts, idempotent: a second run adds nothing) in a database of its
   own (one per fleet size: the generator only adds).
2. Serves it with `make serve` (gunicorn, 2 workers, debug off, whitenoise) on a free port.
3. Counts the queries and bytes of each request once, in this process, through Django's test
   client on the same database, as its role.
4. Measures each phase (``PHASES``): ``rounds`` times, every target in a new random order, the
   floor (GET /api/whoami/, a signed-in DRF view that reads nothing) among them, each asked with
   the session of the role it needs (``Target.role``: viewer, operator or lead; never a superuser,
   who reads no permission). Warm and under the sampler: ``requests`` requests at ``concurrency``
   at once. After a write: ``writes`` times one write (a replica's state, or a model's source)
   then one request. The machine is shared: each p50 is given as a ratio to the floor's in the
   same phase, and the 1-minute load average read beside each target's requests is given beside it.
5. Judges issue 25's goals (``page_report.GOALS``: the dry runs and preview within 2× warm, every
   page within 3× warm and 5× after a write, the nodes pages within 3× under the sampler) and
   exits 1 when one is missed.

To measure one more page, add a line to ``targets()`` (a name, the method, the path, a body).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.page_report import PHASES, in_process_table, machine, pct, table, verdicts  # noqa: E402 (after the path)
from bench.page_writes import WRITES, SamplerWrites  # noqa: E402

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/llmgw_bench"
SECRET = "bench-only-secret-key-not-for-any-deployment-0123456789abcdef"
FLOOR = "floor: GET /api/whoami/"


@dataclass(frozen=True)
class Target:
    name: str
    method: str
    path: str
    body: dict | None = None
    form: bool = False  # a page's form post (urlencoded, htmx) rather than the API's JSON

    @property
    def label(self) -> str:
        return f"{self.name}: {self.method} {self.path}"

    @property
    def role(self) -> str:
        """The role a real user needs for it (base/roles.py): the dry runs and the preview an
        operator's, the audit log's pages a lead's, the rest (the floor too) a viewer's."""
        if "/gpus/" in self.path or "/context/" in self.path or "preview" in self.path:
            return "operator"
        return "lead" if "audit" in self.path else "viewer"


def targets(audit: list[Target], node: str = "gen-node-0500") -> list[Target]:
    return [
        Target("floor", "GET", "/api/whoami/"),
        Target(
            "resize dry run",
            "POST",
            "/api/models/gen-model-001/gpus/",
            {"gpus": 2, "profile": "one", "dry_run": True},
        ),
        Target(
            "context dry run",
            "POST",
            "/api/models/gen-model-001/context/",
            {"tokens": 16384, "profile": "one", "dry_run": True},
        ),
        Target("model page", "GET", "/models/gen-model-001/"),
        Target(
            "resize preview",
            "POST",
            "/models/gen-model-001/resize/preview/",
            {"gpus": "2", "profile": "one"},
            form=True,
        ),
        Target("nodes, first page", "GET", "/nodes/"),
        Target("nodes, filtered", "GET", "/nodes/?gpu_class=gen-a100-80g&state=ready&free=2"),
        Target("nodes, compact", "GET", "/nodes/?view=compact"),
        Target("node page", "GET", f"/nodes/{node}/"),
        Target("model list", "GET", "/"),
        Target("model list, filtered", "GET", "/?engine=sglang&gpu_class=gen-a100-80g"),
        Target("models API", "GET", "/api/models/"),
        Target("nodes API", "GET", "/api/nodes/"),
        Target("profiles API", "GET", "/api/profiles/"),
        Target("replicas API", "GET", "/api/replicas/"),
        Target("operations", "GET", "/operations/"),
        Target("operations API", "GET", "/api/operations/"),
        *audit,
    ]


def audit_targets() -> list[Target]:
    """The leads' audit pages (issue 13): the first page, a page near the end (the oldest entries),
    filtered and not, an entry's page and the API's first page; and the admin's list, first page."""
    from django.urls import reverse

    from demo.scale import audit_model

    entries = audit_model().objects
    oldest = entries.order_by("id").values_list("id", flat=True).first() or 0
    middle = (
        entries.filter(id__gte=oldest + entries.count() // 2).order_by("id").values_list("id", flat=True)[:1]
    )
    url = reverse("audit:entry_list")
    meta = audit_model()._meta
    admin = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
    filtered = "action=update&object_type=profile&via=api"  # issue 23: the action and the kind apart
    return [
        Target("audit list", "GET", url),
        Target("audit list, near the end", "GET", f"{url}?before={oldest + 500}"),
        Target("audit list, filtered", "GET", f"{url}?{filtered}"),
        Target("audit list, filtered, near the end", "GET", f"{url}?{filtered}&before={oldest + 5000}"),
        Target("audit entry", "GET", reverse("audit:entry_detail", args=[middle[0] if middle else oldest])),
        Target("audit API", "GET", reverse("api-audit-list")),
        Target("admin audit list", "GET", admin),
    ]


# -- serving ----------------------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(env: dict[str, str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["make", "-s", "serve", f"ADDR=127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"make serve exited {proc.returncode}: {(proc.stderr.read() if proc.stderr else '')[-2000:]}"
            )
        try:
            httpx.get(f"http://127.0.0.1:{port}/accounts/login/", timeout=2)
            return proc
        except httpx.TransportError:
            time.sleep(0.3)
    raise SystemExit("make serve did not answer within 120 s")


def sign_in(base: str, username: str, password: str) -> dict[str, str]:
    """Headers of a signed-in session. Cookies are carried by hand: with debug off they are
    marked Secure, and this benchmark speaks plain HTTP to 127.0.0.1."""
    import httpx

    def cookies(response) -> dict[str, str]:
        out = {}
        for raw in response.headers.get_list("set-cookie"):
            name, _, rest = raw.partition("=")
            out[name.strip()] = rest.split(";", 1)[0]
        return out

    with httpx.Client(base_url=base, timeout=10) as http:
        jar = cookies(http.get("/accounts/login/"))
        response = http.post(
            "/accounts/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": jar["csrftoken"]},
            headers={"Cookie": f"csrftoken={jar['csrftoken']}", "Referer": f"{base}/accounts/login/"},
        )
        jar.update(cookies(response))
    if response.status_code != 302 or "sessionid" not in jar:
        raise SystemExit(f"signing in as {username} failed (HTTP {response.status_code})")
    return {
        "Cookie": f"csrftoken={jar['csrftoken']}; sessionid={jar['sessionid']}",
        "X-CSRFToken": jar["csrftoken"],
        "Referer": f"{base}/",
    }


# -- measuring --------------------------------------------------------------------------------------------


@dataclass
class Samples:
    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0
    errors: int = 0
    loads: list[float] = field(default_factory=list)  # the 1-minute load average beside each burst


def burst(
    base: str, headers: dict[str, str], target: Target, n: int, concurrency: int, samples: Samples
) -> None:
    import httpx

    local = threading.local()
    lock = threading.Lock()

    def one(_: int) -> None:
        http = getattr(local, "http", None)
        if http is None:
            http = local.http = httpx.Client(base_url=base, headers=headers, timeout=60)
        t = time.perf_counter()
        if target.method == "GET":
            r = http.get(target.path)
        elif target.form:
            r = http.post(target.path, data=target.body, headers={"HX-Request": "true"})
        else:
            r = http.post(target.path, json=target.body)
        dt = time.perf_counter() - t
        with lock:
            if r.status_code != 200:
                samples.errors += 1
            samples.latencies.append(dt)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(n)))
    samples.wall += time.perf_counter() - t0


def count_in_process(target: Target, username: str) -> tuple[int, int, int]:
    """Queries and bytes of one request, through Django's test client on the same database: its
    queries cold (nothing kept, as the first request after a write) and warm (asked again)."""
    from django.contrib.auth import get_user_model
    from django.core.cache import caches
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    c = Client()
    c.force_login(get_user_model().objects.get(username=username))
    caches["answers"].clear()
    counts = []
    for _ in range(2):
        with CaptureQueriesContext(connection) as ctx:
            if target.method == "GET":
                r = c.get(target.path)
            elif target.form:
                r = c.post(target.path, target.body, HTTP_HX_REQUEST="true")
            else:
                r = c.post(target.path, json.dumps(target.body), content_type="application/json")
        if r.status_code != 200:
            raise SystemExit(f"{target.label} answered {r.status_code}: {r.content[:300]!r}")
        counts.append(len(ctx.captured_queries))
    return counts[0], counts[1], len(r.content)


def in_process(target: Target, username: str, *, runs: int) -> dict[str, float]:
    """Medians of ``runs`` requests through Django's test client, one at a time, cold (nothing kept:
    the answers cache emptied before each, as the first request after a write finds it) and warm
    (kept, as every request between writes finds it): time, time in the database, queries."""
    from django.contrib.auth import get_user_model
    from django.core.cache import caches
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    c = Client()
    c.force_login(get_user_model().objects.get(username=username))

    def one() -> tuple[float, float, int]:
        with CaptureQueriesContext(connection) as ctx:
            t = time.perf_counter()
            if target.method == "GET":
                r = c.get(target.path)
            elif target.form:
                r = c.post(target.path, target.body, HTTP_HX_REQUEST="true")
            else:
                r = c.post(target.path, json.dumps(target.body), content_type="application/json")
            dt = time.perf_counter() - t
        assert r.status_code == 200, (target.label, r.status_code)
        return dt, sum(float(q["time"]) for q in ctx.captured_queries), len(ctx.captured_queries)

    out: dict[str, float] = {}
    for kind in ("cold", "warm"):
        samples = []
        one()  # the connection, the templates, and (warm) the answer kept
        for _ in range(runs):
            if kind == "cold":
                caches["answers"].clear()
            samples.append(one())
        out[f"{kind}_ms"] = round(1000 * statistics.median(x[0] for x in samples), 1)
        out[f"{kind}_db_ms"] = round(1000 * statistics.median(x[1] for x in samples), 1)
        out[f"{kind}_queries"] = statistics.median(x[2] for x in samples)
    return out


def main() -> None:
    args = _arguments()
    env = _setup(args)
    from demo.scale import BENCH_PASSWORD, ROLE_USERS

    node = f"gen-node-{args.nodes // 2:04d}"
    chosen = [x for x in targets(audit_targets(), node) if x.name == "floor" or args.only in x.name]
    shape = {x.label: count_in_process(x, ROLE_USERS[x.role]) for x in chosen}
    if args.in_process:
        _in_process_report(chosen, runs=args.in_process, out=Path(args.out).with_name("in_process.json"))
        return
    phases = [p for p in args.phases.split(",") if p]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"no such phase {unknown}: the phases are {', '.join(PHASES)}")
    meta = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "fleet": f"{args.nodes} nodes × 8 cards, {args.models} models, {args.audit:,} audit entries",
        "rounds": args.rounds,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "writes": args.writes,
        "sampler": args.sampler,
        "load_at_start": round(os.getloadavg()[0], 1),
    }
    port = free_port()
    server = serve(env, port)
    base = f"http://127.0.0.1:{port}"
    results: dict[str, list[dict]] = {}
    try:
        sessions = {role: sign_in(base, name, BENCH_PASSWORD) for role, name in ROLE_USERS.items()}
        for x in chosen:  # warm each worker's caches and connections
            burst(base, sessions[x.role], x, 4, 2, Samples())
        for phase in phases:
            samples = _phase(phase, base, sessions, chosen, args)
            results[phase] = _rows(chosen, samples, shape)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    meta["load_at_end"] = round(os.getloadavg()[0], 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "phases": results}, indent=2))
    print(table(results, meta))
    judged = verdicts(results)
    for said, met, detail in judged:
        print(f"target {said}: {'met' if met else 'not met'} ({detail})")
    if not all(met for _, met, _ in judged):
        raise SystemExit("pages: a target was missed")


def _phase(
    phase: str, base: str, sessions: dict[str, dict[str, str]], chosen: list[Target], args: argparse.Namespace
) -> dict[str, Samples]:
    """``rounds`` rounds of every target (the floor among them) in a new random order, each target's
    requests asked as its role, the load average read beside each: bursts of ``requests`` at
    ``concurrency`` (warm, sampler), or ``writes`` times a write then one request (replica, structure)."""
    samples = {x.label: Samples() for x in chosen}
    sampler = SamplerWrites(args.nodes, batched=args.sampler == "batched") if phase == "sampler" else None
    if sampler is not None:
        sampler.start()
    rng = random.Random(1)
    try:
        for r in range(args.rounds):
            order = chosen[:]
            rng.shuffle(order)
            for x in order:
                s = samples[x.label]
                s.loads.append(os.getloadavg()[0])
                if phase in ("replica", "structure"):
                    for _ in range(args.writes):
                        WRITES[phase]()
                        burst(base, sessions[x.role], x, 1, 1, s)
                else:
                    burst(base, sessions[x.role], x, args.requests, args.concurrency, s)
                s.loads.append(os.getloadavg()[0])
            print(f"{phase}: round {r + 1} of {args.rounds} done", flush=True)
    finally:
        if sampler is not None:
            sampler.stop()
            print(f"sampler: {sampler.recorded} nodes' readings written, {sampler.rounds} rounds", flush=True)
    return samples


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", ""),
        help=f"default {DEFAULT_DB}, with _NODES after it for a fleet of other than 1,000 nodes",
    )
    parser.add_argument("--nodes", type=int, default=1000, help="the fleet's nodes of 8 cards (default 1000)")
    parser.add_argument("--models", type=int, default=0, help="the fleet's models (default half the nodes)")
    parser.add_argument(
        "--operations", type=int, default=0, help="finished restarts (default twice the nodes)"
    )
    parser.add_argument("--audit", type=int, default=1_000_000, help="audit entries to generate")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--requests", type=int, default=20, help="requests per target per round (warm, sampler)"
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--sampler",
        choices=("batched", "per-node"),
        default="batched",
        help="the sampler phase's writes: as the worker's sampler writes them, a batch of "
        "LLMGW_TELEMETRY_BATCH nodes a transaction once an interval (default), or one node a "
        "transaction spread over the interval (the sampler before its batching; the harsher load)",
    )
    parser.add_argument(
        "--writes", type=int, default=4, help="writes, each then a request, per target per round"
    )
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"which to measure, of {', '.join(PHASES)} (default all)"
    )
    parser.add_argument("--only", default="", help="measure only targets whose name contains this")
    parser.add_argument("--out", default=str(ROOT / "var" / "bench" / "pages.json"))
    parser.add_argument(
        "--in-process",
        type=int,
        default=0,
        metavar="RUNS",
        help="only measure in this process, one request at a time, cold and warm: the median of RUNS",
    )
    args = parser.parse_args()
    args.models = args.models or max(2, args.nodes // 2)
    args.operations = args.operations or 2 * args.nodes
    if not args.database_url:
        args.database_url = DEFAULT_DB if args.nodes == 1000 else f"{DEFAULT_DB}_{args.nodes}"
    return args


def _setup(args: argparse.Namespace) -> dict[str, str]:
    """Django on the benchmark's database (created when missing), migrated, with the generated
    fleet of ``args``' sizes; the environment ``make serve`` is given."""
    from bench.localfleet import keep_bytecode

    keep_bytecode()
    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "DJANGO_SECRET_KEY": SECRET,
        "DJANGO_DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
        "SECURE_SSL_REDIRECT": "0",
        "DJANGO_SETTINGS_MODULE": "llmgw_web.settings",
        # collectstatic's copy of its own, so the worktree's staticfiles/ is left as it was
        "STATIC_ROOT": str(ROOT / "var" / "bench" / "static"),
    }
    os.environ.update(env)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    _create_database(args.database_url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    t = time.monotonic()
    call_command(
        "generate_fleet",
        "--nodes",
        str(args.nodes),
        "--models",
        str(args.models),
        "--operations",
        str(args.operations),
        "--audit",
        str(args.audit),
    )
    print(f"fleet ready in {time.monotonic() - t:.0f} s", flush=True)
    return env


def _in_process_report(chosen: list[Target], *, runs: int, out: Path) -> None:
    """``--in-process``: each target measured in this process, as its role, kept in ``out`` and printed."""
    from demo.scale import ROLE_USERS

    measured = {x.label: in_process(x, ROLE_USERS[x.role], runs=runs) for x in chosen}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(measured, indent=2))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine()}")
    print(in_process_table(measured))


def _rows(
    chosen: list[Target], samples: dict[str, Samples], shape: dict[str, tuple[int, int, int]]
) -> list[dict]:
    """A row a target: its role, latencies, queries and size, its p50 against the floor's in the
    same phase, and the load average while it was measured (median of the readings beside it)."""
    floor = statistics.median(samples[chosen[0].label].latencies)
    rows = []
    for x in chosen:
        s = samples[x.label]
        queries, warm_queries, size = shape[x.label]
        p50 = statistics.median(s.latencies)
        rows.append(
            {
                "target": x.label,
                "role": x.role,
                "p50_ms": round(1000 * p50, 1),
                "p95_ms": round(1000 * pct(s.latencies, 95), 1),
                "queries": queries,
                "warm_queries": warm_queries,
                "bytes": size,
                "ratio": round(p50 / floor, 2),
                "load": round(statistics.median(s.loads), 1),
                "errors": s.errors,
            }
        )
    return rows


def _create_database(url: str, *, anew: bool = False) -> None:
    """The benchmark's database, created when missing (PostgreSQL); ``anew``: dropped first, as
    a scratch database is (the audit log refuses TRUNCATE, so ``flush`` cannot empty it)."""
    if not url.startswith("postgres"):
        return
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if anew:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    main()
