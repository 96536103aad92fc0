"""A generated fleet at the size the benchmark measures: nodes × 8 cards, models with three
profiles each, replicas holding most of the cards, finished restarts, and a long audit log.

Written with bulk inserts straight to the database (not audited: it is test data, and one audit
entry per generated row would be the slow part), all names starting with ``gen-`` so that it
never mixes with a real catalog. Idempotent: what is already there is kept, only what is missing
is added, and the audit log is only ever appended to (its chain continues from the last entry).
Deterministic: the same sizes give the same fleet.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from audit.chain import audit_key
from catalog.models import Card, GPUClass, Node, Profile, Replica, ServedModel, Shard
from operations.models import RestartOperation, RestartStep

PREFIX = "gen-"
BATCH = 5000

# name, total MiB, usable MiB, capability; the share of the nodes of each class.
CLASSES = [("gen-h100-80g", 81559, 73400, "9.0", 0.8), ("gen-a100-80g", 81920, 73700, "8.0", 0.2)]
CARDS_PER_NODE = 8
LIVE_ONE_CARD = 10  # each model: ten 1-card replicas of its first profile...
LIVE_TWO_CARD = 1  # ...one 2-card replica of its second...
STOPPED = 5  # ...and five stopped ones (no cards) of its third: 16 replicas a model
BENCH_USER = "gen-bench"

Step = Callable[[str, int], None]  # says how many rows of a kind were added


@dataclass(frozen=True)
class Sizes:
    nodes: int = 1000
    models: int = 500
    operations: int = 2000
    audit: int = 1_000_000

    @property
    def replicas(self) -> int:
        return self.models * (LIVE_ONE_CARD + LIVE_TWO_CARD + STOPPED)


def audit_model():
    """The audit entry model, wherever it lives (``audit`` once that app exists, else ``catalog``)."""
    for label in ("audit", "catalog"):
        try:
            return apps.get_model(label, "AuditEntry")
        except LookupError:
            continue
    raise LookupError("no AuditEntry model is installed")


def foreign_rows() -> list[str]:
    """What in the catalog was not generated here: the generator refuses to mix with it."""
    found = []
    for model, field in ((Node, "name"), (ServedModel, "name"), (GPUClass, "name")):
        n = model.objects.exclude(**{f"{field}__startswith": PREFIX}).count()
        if n:
            found.append(f"{n} {model._meta.verbose_name_plural}")
    return found


def _chunks(seq: list, size: int = BATCH):
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def _bulk(model, rows: list) -> None:
    for chunk in _chunks(rows):
        model.objects.bulk_create(chunk)


def generate(sizes: Sizes, *, say: Callable[[str], None] = print) -> dict[str, int]:
    """Add what is missing of the fleet of ``sizes``; answers how many rows of each kind it wrote."""
    rng = random.Random(14)
    wrote: dict[str, int] = {}
    t0 = time.monotonic()

    def step(what: str, n: int) -> None:
        wrote[what] = n
        say(f"{what}: {n} added ({time.monotonic() - t0:.1f} s)")

    with transaction.atomic():
        classes = _gpu_classes()
        node_class = _nodes(sizes, step)
        _cards(node_class, classes, step)
        models, model_class = _models(sizes, step)
        profiles = _profiles(models, model_class, classes, step)
        _replicas(model_class, node_class, classes, profiles, rng, step)
        user = _bench_user()
        _role_users()
        _operations(sizes, models, model_class, profiles, user, step)

    _append_audit(sizes.audit, user, rng, step)
    if any(wrote.values()) and connection.vendor == "postgresql":
        # Bulk inserts leave the planner's statistics as they were (a table of 77 nodes, not 1,000)
        # until autovacuum comes round; pages measured before then would be planned for the wrong fleet.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        say(f"statistics: analyzed ({time.monotonic() - t0:.1f} s)")
    return wrote


def _gpu_classes() -> dict[str, GPUClass]:
    """The generated GPU classes by name, created when missing."""
    classes = {}
    for name, total, usable, cap, _share in CLASSES:
        classes[name] = GPUClass.objects.get_or_create(
            name=name, defaults={"memory_mib": total, "usable_mib": usable, "compute_capability": cap}
        )[0]
    return classes


def _nodes(sizes: Sizes, step: Step) -> dict[str, str]:
    """Add the missing nodes; answers each node's GPU class by node name."""
    # The first 80 % h100, the rest a100; one in 30 cordoned, one in 50 down.
    node_class = {}
    edge = round(sizes.nodes * CLASSES[0][4])
    have = set(Node.objects.filter(name__startswith=PREFIX).values_list("name", flat=True))
    new_nodes = []
    for i in range(sizes.nodes):
        name = f"gen-node-{i:04d}"
        node_class[name] = CLASSES[0][0] if i < edge else CLASSES[1][0]
        if name not in have:
            state = "down" if i % 50 == 49 else "cordoned" if i % 30 == 29 else "ready"
            new_nodes.append(
                Node(
                    name=name,
                    agent_url=f"http://10.{i // 250}.{i % 250}.1:9101",
                    agent_token="gen",
                    state=state,
                )
            )
    _bulk(Node, new_nodes)
    step("nodes", len(new_nodes))
    return node_class


def _cards(node_class: dict[str, str], classes: dict[str, GPUClass], step: Step) -> None:
    """Add each node's missing cards, of its node's class."""
    nodes = {n.name: n for n in Node.objects.filter(name__startswith=PREFIX)}
    have_cards = set(Card.objects.filter(node__name__startswith=PREFIX).values_list("node_id", "index"))
    new_cards = [
        Card(node=node, index=i, gpu_class=classes[node_class[name]])
        for name, node in nodes.items()
        if name in node_class
        for i in range(CARDS_PER_NODE)
        if (node.pk, i) not in have_cards
    ]
    _bulk(Card, new_cards)
    step("cards", len(new_cards))


def _models(sizes: Sizes, step: Step) -> tuple[dict[str, ServedModel], dict[str, str]]:
    """Add the missing models; answers the models by name and each model's GPU class by model name."""
    # Llama-3.1-8B-like shapes of a few sizes; the last 20 % on a100 nodes.
    have = set(ServedModel.objects.filter(name__startswith=PREFIX).values_list("name", flat=True))
    new_models = []
    model_edge = round(sizes.models * CLASSES[0][4])
    for i in range(sizes.models):
        name = f"gen-model-{i:03d}"
        if name not in have:
            kv_heads = (8, 4, 8, 2)[i % 4]
            new_models.append(
                ServedModel(
                    name=name,
                    source=f"gen-org/model-{i:03d}",
                    context_length=131072,
                    layers=32,
                    attention_heads=32,
                    kv_heads=kv_heads,
                    head_dim=128,
                    dtype="bfloat16",
                    attention="gqa",
                    kv_bytes_per_token=2 * 32 * kv_heads * 128 * 2,
                    weight_bytes=(8 + i % 5) * 2 * 10**9,
                )
            )
    _bulk(ServedModel, new_models)
    step("models", len(new_models))
    models = {m.name: m for m in ServedModel.objects.filter(name__startswith=PREFIX)}
    model_class = {
        f"gen-model-{i:03d}": CLASSES[0][0] if i < model_edge else CLASSES[1][0] for i in range(sizes.models)
    }
    return models, model_class


def _profiles(
    models: dict[str, ServedModel], model_class: dict[str, str], classes: dict[str, GPUClass], step: Step
) -> dict[tuple[str, str], Profile]:
    """Add each model's missing profiles (one, two and four cards); answers them by (model, profile)."""
    have_profiles = set(
        Profile.objects.filter(model__name__startswith=PREFIX).values_list("model__name", "name")
    )
    layouts = [("one", 1, "vllm"), ("two", 2, "vllm"), ("four", 4, "sglang")]
    new_profiles = [
        Profile(
            model=models[name],
            name=pname,
            engine=engine,
            gpu_class=classes[model_class[name]],
            gpus_per_node=n,
            tp=n,
            args=["--max-model-len", "32768"] if engine == "vllm" else ["--context-length", "32768"],
        )
        for name in model_class
        for pname, n, engine in layouts
        if (name, pname) not in have_profiles
    ]
    _bulk(Profile, new_profiles)
    step("profiles", len(new_profiles))
    return {
        (p.model.name, p.name): p
        for p in Profile.objects.filter(model__name__startswith=PREFIX).select_related("model")
    }


def _replicas(
    model_class: dict[str, str],
    node_class: dict[str, str],
    classes: dict[str, GPUClass],
    profiles: dict[tuple[str, str], Profile],
    rng: random.Random,
    step: Step,
) -> None:
    """Add the replicas of each model that has none yet, with their shards.

    Its two-card replica on two free cards of a node of its class (nodes in turn), then its
    one-card replicas on the class's free cards at random; what is left stays free, a few cards on
    most nodes.
    """
    placed = set(
        Replica.objects.filter(name__startswith=PREFIX).values_list("profile__model__name", flat=True)
    )
    todo = [m for m in model_class if m not in placed]
    if not todo:
        return
    free: dict[str, dict[int, list[Card]]] = {c: {} for c in classes}
    for card in (
        Card.objects.filter(node__name__startswith=PREFIX, shard__isnull=True)
        .select_related("node")
        .order_by("node__name", "index")
    ):
        free[node_class[card.node.name]].setdefault(card.node_id, []).append(card)
    replicas: list[Replica] = []
    shards: list[tuple[int, Card]] = []
    port = 20000 + len(placed) * (LIVE_ONE_CARD + LIVE_TWO_CARD + STOPPED)

    def add(model: str, profile: str, n: int, state: str, cards: list[Card]) -> None:
        nonlocal port
        replicas.append(
            Replica(
                name=f"{model}-{profile}-{n}",
                profile=profiles[(model, profile)],
                port=port,
                state=state,
                revision=1,
            )
        )
        shards.extend((len(replicas) - 1, card) for card in cards)
        port += 1

    for cls in classes:
        names = [m for m in todo if model_class[m] == cls]
        pairs = [cards for cards in free[cls].values() if len(cards) >= 2]
        for k, model in enumerate(names):
            if pairs:
                two = pairs[k % len(pairs)]
                add(model, "two", 1, "ready", [two.pop(0), two.pop(0)])
                if len(two) < 2:
                    pairs.remove(two)
        singles = [card for cards in free[cls].values() for card in cards]
        rng.shuffle(singles)
        for model in names:
            for j in range(min(LIVE_ONE_CARD, len(singles))):
                add(model, "one", j + 1, "ready" if j else "loading", [singles.pop()])
            for j in range(STOPPED):
                add(model, "four", j + 1, "stopped", [])
    _bulk(Replica, replicas)
    by_name = dict(Replica.objects.filter(name__startswith=PREFIX).values_list("name", "pk"))
    _bulk(Shard, [Shard(replica_id=by_name[replicas[i].name], card=card) for i, card in shards])
    step("replicas", len(replicas))


# A user of each role the pages ask for (base/roles.py), for the benchmark to request each page as
# whoever would: a superuser reads no permission, and so measures less than anyone real.
ROLE_USERS = {"viewer": "gen-viewer", "operator": "gen-operator", "lead": "gen-lead"}


def _role_users() -> None:
    """The benchmark's users of the roles, created when missing, with BENCH_PASSWORD."""
    from django.contrib.auth.models import Group

    for role, name in ROLE_USERS.items():
        user = get_user_model().objects.filter(username=name).first()
        if user is None:
            user = get_user_model().objects.create_user(name, password=BENCH_PASSWORD)
        user.groups.set([Group.objects.get(name=role)])


def _bench_user():
    """The benchmark's superuser, created when missing."""
    user = get_user_model().objects.filter(username=BENCH_USER).first()
    if user is None:
        user = get_user_model().objects.create_superuser(BENCH_USER, password=BENCH_PASSWORD)
    return user


def _operations(
    sizes: Sizes,
    models: dict[str, ServedModel],
    model_class: dict[str, str],
    profiles: dict[tuple[str, str], Profile],
    user,
    step: Step,
) -> None:
    """Add finished restarts up to ``sizes.operations``, a step each, spread over the models."""
    have_ops = RestartOperation.objects.filter(model__name__startswith=PREFIX).count()
    if have_ops >= sizes.operations:
        return
    now = timezone.now()
    names = sorted(model_class)
    ops = []
    for k in range(have_ops, sizes.operations):
        name = names[k % len(names)]
        at = now - timedelta(minutes=sizes.operations - k)
        ops.append(
            RestartOperation(
                model=models[name],
                profile=profiles[(name, "one")],
                state="succeeded" if k % 7 else "partly_failed",
                in_place=False,
                requested_by=user,
                requested_by_name=BENCH_USER,
                via="api",
                reason="generated",
                created_at=at,
                started_at=at,
                finished_at=at + timedelta(seconds=30),
            )
        )
    _bulk(RestartOperation, ops)
    new_ops = list(
        RestartOperation.objects.filter(model__name__startswith=PREFIX, steps__isnull=True).values_list(
            "pk", flat=True
        )
    )
    _bulk(
        RestartStep,
        [
            RestartStep(operation_id=pk, node="gen-node-0000", cards=[0], state="succeeded", reason="ready")
            for pk in new_ops
        ],
    )
    step("operations", len(ops))


BENCH_PASSWORD = "gen-bench-password-not-for-anything-real"  # noqa: S105 - generated test data only


def _append_audit(target: int, user, rng: random.Random, step: Step) -> None:
    """Append entries until the log holds ``target``, each chained to the one before it (the
    model's own ``compute_hash`` with the chain's key, so the chain verifies), in batches of their own transaction."""
    Entry = audit_model()
    have = Entry.objects.count()
    if have >= target:
        step("audit entries", 0)
        return
    prev = Entry.objects.order_by("-id").values_list("hash", flat=True).first() or "0" * 64
    chain_key = audit_key()
    start = timezone.now() - timedelta(seconds=target - have)
    actions = [
        ("profile", "profile.update"),
        ("node", "node.update"),
        ("model", "model.update"),
        ("replica", "replica.start"),
    ]
    vias = ["ui", "api", "admin", "cli", "worker"]
    added = 0
    while have + added < target:
        batch = []
        for k in range(min(BATCH * 2, target - have - added)):
            n = have + added + k
            obj, action = actions[n % len(actions)]
            key = f"gen-model-{n % 500:03d}/one" if obj == "profile" else f"gen-{obj}-{n % 1000:04d}"
            entry = Entry(
                at=start + timedelta(seconds=added + k),
                user=user if n % 3 else None,
                actor=BENCH_USER if n % 3 else "worker",
                via=vias[n % len(vias)],
                action=action,
                object_type=obj,
                object_key=key,
                object_repr=key,
                before={"revision": n % 9 + 1},
                after={"revision": n % 9 + 2},
                message="generated",
                request_id=f"{rng.getrandbits(64):016x}",
                prev_hash=prev,
            )
            entry.hash = entry.compute_hash(chain_key)
            prev = entry.hash
            batch.append(entry)
        with transaction.atomic():
            Entry.objects.bulk_create(batch)
        added += len(batch)
    step("audit entries", added)
