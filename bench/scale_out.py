"""Scale-out, shown: two web processes and two workers on one PostgreSQL share a 64-replica
fan-out; a worker killed mid-run is taken over, and nothing runs twice.

Run: `make scale-out` (or `.venv/bin/python bench/scale_out.py [--database-url URL]`).

Sixteen real node agents on 127.0.0.1, eight cards each; four models with sixteen ready
replicas each (64 in all). Two `make serve` processes (gunicorn, one worker each) and two
`manage.py db_worker` processes, all on the same database. Each model's profile is changed, and
its restart asked through the API, two models through each web process, eight steps at a time:
four operations, which the two workers share. Once both workers hold one, the first is killed
(SIGKILL) while its replacements load; the other worker takes its operation over when its
heartbeat goes stale. At the end it checks, and exits 1 unless all hold: every operation
succeeded, every replica was replaced, each replacement was launched once on its agent, no
operation was run by two live workers at once, and the killed worker's operation was finished
by the other.

The database is its own (created anew at the start): BENCH_SCALE_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/llmgw_bench_scale"
MODELS = [f"scale-{i}" for i in range(4)]
PER_MODEL = 16
PASSWORD = "bench-scale-password-not-for-anything-real"  # noqa: S105 - a scratch database's user

# A worker's operation is taken over once its heartbeat is this old (production: 60 s); the stale
# threshold must be above the longest agent call (llmgw_web/settings.py), so those are shortened too.
FAST_TAKEOVER = {
    "LLMGW_OPERATION_STALE_SECONDS": "6",
    "LLMGW_AGENT_TIMEOUT_SECONDS": "3",
    "LLMGW_AGENT_WAIT_SECONDS": "2",
    "LLMGW_AGENT_STOP_SECONDS": "5",
    "LLMGW_OPERATION_HEARTBEAT_SECONDS": "1",
    "LLMGW_OPERATION_SWEEP_SECONDS": "2",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_SCALE_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--load-seconds", type=float, default=2.0)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "agent"))
    from agent_testing import free_port

    from bench.localfleet import local_fleet, made_stale, process, scratch_database, worker
    from bench.pages import sign_in

    env = scratch_database(args.database_url)
    import httpx
    from django.contrib.auth import get_user_model

    from base.actor import Actor, acting_as
    from catalog.models import Profile
    from catalog.services import catalog as services
    from operations.models import RestartOperation, RestartStep

    actor = Actor(via="cli", name="bench")
    get_user_model().objects.create_superuser("bench", password=PASSWORD)
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-scale-"))
    web_env = {
        **env,
        "DJANGO_DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
        "STATIC_ROOT": str(ROOT / "var" / "bench" / "static"),
    }
    problems: list[str] = []
    with (
        local_fleet(
            tmp,
            nodes=16,
            cards=8,
            models=dict.fromkeys(MODELS, PER_MODEL),
            load_seconds=args.load_seconds,
            actor=actor,
        ) as fleet,
        contextlib.ExitStack() as stack,
    ):
        print(f"{len(MODELS) * PER_MODEL} replicas of {len(MODELS)} models ready on 16 agents", flush=True)
        procs = {}
        for name in ("worker-a", "worker-b"):
            procs[name] = worker(name, {**env, **FAST_TAKEOVER}, tmp / f"{name}.log")
        webs = []
        for n in (1, 2):
            port = free_port()
            procs[f"web-{n}"] = process(
                ["make", "-s", "serve", f"ADDR=127.0.0.1:{port}", "WEB_WORKERS=1"],
                web_env,
                tmp / f"web-{n}.log",
            )
            webs.append(f"http://127.0.0.1:{port}")
        for p in procs.values():
            stack.callback(_kill, p)
        for base in webs:
            _wait_for(lambda base=base: _answers(httpx, base), 120, f"{base} to answer")
        sessions = [sign_in(base, "bench", PASSWORD) for base in webs]

        for model in MODELS:
            profile = made_stale(Profile.objects.get(pk=fleet.profiles[model].pk), 1)
            with acting_as(actor):
                services.profile_save(instance=profile)
        ops = []
        for i, model in enumerate(MODELS):
            base, headers = webs[i % 2], sessions[i % 2]
            response = httpx.post(
                f"{base}/api/models/{model}/restart/",
                # No settle time: what is checked is who ran what, not how long replacements stay ready.
                json={"max_parallel": 8, "ready_timeout": 120, "settle_seconds": 0},
                headers=headers,
                timeout=30,
            )
            if response.status_code != 202:
                raise SystemExit(
                    f"restart of {model} through {base}: HTTP {response.status_code} {response.text}"
                )
            ops.append(response.json()["id"])
        print(f"operations {ops} asked through {webs[0]} and {webs[1]}", flush=True)

        # Who holds which operation, sampled until all have ended; the first worker is killed once
        # both hold one and one of its replacements is loading.
        held: dict[int, list[str]] = defaultdict(list)
        name_of = {f"worker:{socket.gethostname()}-{procs[n].pid}": n for n in ("worker-a", "worker-b")}
        killed, victim_op = "", None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            rows = [
                (pk, state, name_of.get(who, who))
                for pk, state, who in RestartOperation.objects.filter(pk__in=ops).values_list(
                    "pk", "state", "worker"
                )
            ]
            for pk, state, who in rows:
                if state == "running" and who and (not held[pk] or held[pk][-1] != who):
                    held[pk].append(who)
            if not killed:
                by_a = [pk for pk, state, who in rows if state == "running" and who == "worker-a"]
                by_b = [pk for pk, state, who in rows if state == "running" and who == "worker-b"]
                if (
                    by_a
                    and by_b
                    and RestartStep.objects.filter(operation_id=by_a[0], state="waiting").exists()
                ):
                    victim_op = by_a[0]
                    os.killpg(procs["worker-a"].pid, signal.SIGKILL)
                    procs["worker-a"].wait(timeout=10)
                    killed = "worker-a"
                    print(f"killed worker-a while it ran operation {victim_op}", flush=True)
            if all(state not in ("queued", "running") for _, state, _ in rows):
                break
            time.sleep(0.1)

        results = {op.pk: op for op in RestartOperation.objects.filter(pk__in=ops)}
        for pk in ops:
            op = results[pk]
            steps = list(op.steps.select_related("new_replica"))
            ok = sum(s.state == "succeeded" for s in steps)
            print(
                f"operation {pk} ({op.model.name}): {op.state}, {ok} of {len(steps)} steps, run by {' then '.join(held[pk]) or '?'}"
            )
            if op.state != "succeeded":
                problems.append(f"operation {pk} ended {op.state}: {op.reason}")
            for s in steps:
                if s.new_replica is None:
                    problems.append(f"operation {pk}: a step has no replacement ({s.reason})")
                    continue
                n = fleet.launches(s.new_replica.name)
                if n != 1:
                    problems.append(f"{s.new_replica.name} was launched {n} times")
        replaced = RestartStep.objects.filter(operation_id__in=ops, state="succeeded").count()
        if replaced != len(MODELS) * PER_MODEL:
            problems.append(f"{replaced} of {len(MODELS) * PER_MODEL} replicas replaced")
        if not killed:
            problems.append("no worker was killed: the two never held an operation each at once")
        elif victim_op is not None and "worker-b" not in held[victim_op][1:]:
            problems.append(f"operation {victim_op} was not taken over by worker-b ({held[victim_op]})")
        workers_used = {w for ws in held.values() for w in ws}
        if workers_used != {"worker-a", "worker-b"}:
            problems.append(f"the operations were not shared: only {sorted(workers_used)} ran them")
    for problem in problems:
        print("PROBLEM:", problem)
    print("scale-out: " + ("all checks hold" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


def _answers(httpx, base: str) -> bool:
    try:
        httpx.get(f"{base}/accounts/login/", timeout=2)
        return True
    except httpx.TransportError:
        return False


def _wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise SystemExit(f"timed out waiting for {what}")


def _kill(p) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except Exception:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
