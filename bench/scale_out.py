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
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    "LLMGW_STOP_DRAIN_SECONDS": "0.5",
    "LLMGW_OPERATION_HEARTBEAT_SECONDS": "1",
    "LLMGW_OPERATION_SWEEP_SECONDS": "2",
}


@dataclass
class Watched:
    """Who ran which operation (the workers that held it, in turn) and the worker killed."""

    held: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    killed: str = ""
    victim_op: int | None = None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_SCALE_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--load-seconds", type=float, default=2.0)
    args = parser.parse_args()

    env, actor = _setup(args.database_url)
    from bench.localfleet import local_fleet
    from bench.pages import sign_in

    tmp = Path(tempfile.mkdtemp(prefix="llmgw-scale-"))
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
        procs, webs = _processes(env, tmp, stack)
        sessions = [sign_in(base, "bench", PASSWORD) for base in webs]
        ops = _restarts_asked(fleet, actor, webs, sessions)
        watched = _watch_and_kill(ops, procs)
        problems = _operation_problems(fleet, ops, watched) + _run_problems(ops, watched)
    for problem in problems:
        print("PROBLEM:", problem)
    print("scale-out: " + ("all checks hold" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


def _setup(database_url: str) -> tuple[dict[str, str], Any]:
    """The scratch database, migrated, with the superuser the web sessions sign in as; the
    environment of the benchmark's processes and the actor the fleet is recorded as."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "agent"))
    from bench.localfleet import scratch_database

    env = scratch_database(database_url)
    from django.contrib.auth import get_user_model

    from base.actor import Actor

    actor = Actor(via="cli", name="bench")
    get_user_model().objects.create_superuser("bench", password=PASSWORD)
    return env, actor


def _processes(
    env: dict[str, str], tmp: Path, stack: contextlib.ExitStack
) -> tuple[dict[str, subprocess.Popen], list[str]]:
    """Two workers (taking over quickly) and two web servers of one gunicorn worker each, stopped
    when ``stack`` closes; the processes by name and the servers' base URLs, once they answer."""
    import httpx
    from agent_testing import free_port

    from bench.localfleet import process, worker

    web_env = {
        **env,
        "DJANGO_DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
    }
    # What the two `make serve` would otherwise each do at once in a checkout not yet installed
    # (uv brought in, the venv synced), done once before; and each collects the static files into
    # a directory of its own, not both into one.
    subprocess.run(["make", "-s", "install"], cwd=ROOT, check=True)
    procs = {}
    for name in ("worker-a", "worker-b"):
        procs[name] = worker(name, {**env, **FAST_TAKEOVER}, tmp / f"{name}.log")
    webs = []
    for n in (1, 2):
        port = free_port()
        procs[f"web-{n}"] = process(
            ["make", "-s", "serve", f"ADDR=127.0.0.1:{port}", "WEB_WORKERS=1"],
            {**web_env, "STATIC_ROOT": str(ROOT / "var" / "bench" / f"static-{n}")},
            tmp / f"web-{n}.log",
        )
        webs.append(f"http://127.0.0.1:{port}")
    for p in procs.values():
        stack.callback(_kill, p)
    for base in webs:
        _wait_for(lambda base=base: _answers(httpx, base), 120, f"{base} to answer")
    return procs, webs


def _restarts_asked(fleet: Any, actor: Any, webs: list[str], sessions: list[dict[str, str]]) -> list[int]:
    """Each model's profile changed, and its restart asked through the API, the models taking
    the two web servers in turn; the operations' ids."""
    import httpx

    from base.actor import acting_as
    from bench.localfleet import made_stale
    from catalog.models import Profile
    from catalog.services import catalog as services

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
    return ops


def _watch_and_kill(ops: list[int], procs: dict[str, subprocess.Popen]) -> Watched:
    """Who holds which operation, sampled until all have ended (at most 5 minutes); the first
    worker is killed once both hold one and one of its replacements is loading."""
    from operations.models import RestartOperation, RestartStep

    watched = Watched()
    held = watched.held
    name_of = {f"worker:{socket.gethostname()}-{procs[n].pid}": n for n in ("worker-a", "worker-b")}
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
        if not watched.killed:
            by_a = [pk for pk, state, who in rows if state == "running" and who == "worker-a"]
            by_b = [pk for pk, state, who in rows if state == "running" and who == "worker-b"]
            if by_a and by_b and RestartStep.objects.filter(operation_id=by_a[0], state="waiting").exists():
                watched.victim_op = by_a[0]
                os.killpg(procs["worker-a"].pid, signal.SIGKILL)
                procs["worker-a"].wait(timeout=10)
                watched.killed = "worker-a"
                print(f"killed worker-a while it ran operation {watched.victim_op}", flush=True)
        if all(state not in ("queued", "running") for _, state, _ in rows):
            break
        time.sleep(0.1)
    return watched


def _operation_problems(fleet: Any, ops: list[int], watched: Watched) -> list[str]:
    """Each operation's line printed; what went wrong with it: it did not succeed, a step has no
    replacement, a replacement was not launched exactly once on its agent."""
    from operations.models import RestartOperation

    problems = []
    results = {op.pk: op for op in RestartOperation.objects.filter(pk__in=ops)}
    for pk in ops:
        op = results[pk]
        steps = list(op.steps.select_related("new_replica"))
        ok = sum(s.state == "succeeded" for s in steps)
        print(
            f"operation {pk} ({op.model.name}): {op.state}, {ok} of {len(steps)} steps, run by {' then '.join(watched.held[pk]) or '?'}"
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
    return problems


def _run_problems(ops: list[int], watched: Watched) -> list[str]:
    """What went wrong with the run as a whole: a replica not replaced, no worker killed, the
    killed worker's operation not taken over, the operations not shared by the two workers."""
    from operations.models import RestartStep

    problems = []
    held, victim_op = watched.held, watched.victim_op
    replaced = RestartStep.objects.filter(operation_id__in=ops, state="succeeded").count()
    if replaced != len(MODELS) * PER_MODEL:
        problems.append(f"{replaced} of {len(MODELS) * PER_MODEL} replicas replaced")
    if not watched.killed:
        problems.append("no worker was killed: the two never held an operation each at once")
    elif victim_op is not None and "worker-b" not in held[victim_op][1:]:
        problems.append(f"operation {victim_op} was not taken over by worker-b ({held[victim_op]})")
    workers_used = {w for ws in held.values() for w in ws}
    if workers_used != {"worker-a", "worker-b"}:
        problems.append(f"the operations were not shared: only {sorted(workers_used)} ran them")
    return problems


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
