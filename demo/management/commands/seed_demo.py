from __future__ import annotations

import json
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import CommandParser
from django.db import transaction

from base.commands import ActorCommand
from base.roles import role
from catalog.models import Card, EngineDefault, GPUClass, Node, Profile, Replica, ServedModel, Shard
from catalog.services import catalog as services
from demo import fleet


class Command(ActorCommand):
    help = (
        "Load the demo fleet (GPU classes, nodes, models with real shapes, profiles, replicas). Idempotent."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--users",
            action="store_true",
            help="also create one account per role (viewer, operator, editor, lead, admin); a password is made "
            "and printed only for an account that has none, and kept in var/demo-passwords.txt (mode 0600)",
        )
        parser.add_argument(
            "--new-passwords",
            action="store_true",
            help="with --users: make new passwords for every demo account (the old ones stop working)",
        )

    def act(self, *args: Any, **options: Any) -> None:
        from catalog.modelfiles import read_gguf, shape_from_config

        created = 0
        with transaction.atomic():
            classes = {}
            for name, memory, usable, capability in fleet.GPU_CLASSES:
                obj = GPUClass.objects.filter(name=name).first()
                if obj is None:
                    obj = services.gpu_class_save(
                        instance=GPUClass(
                            name=name, memory_mib=memory, usable_mib=usable, compute_capability=capability
                        )
                    )
                    created += 1
                classes[name] = obj
            nodes = {}
            for name, class_name, count, port in fleet.NODES:
                node = Node.objects.filter(name=name).first()
                if node is None:
                    node = services.node_save(
                        instance=Node(
                            name=name,
                            agent_url=f"http://127.0.0.1:{port}",
                            agent_token=f"demo-agent-token-for-{name}-not-secret",
                            fabric_domain=fleet.FABRIC.get(name, ""),
                        )
                    )
                    created += 1
                for index in range(count):
                    if not Card.objects.filter(node=node, index=index).exists():
                        services.card_save(
                            instance=Card(node=node, index=index, gpu_class=classes[class_name])
                        )
                        created += 1
                nodes[name] = node
            for demo in fleet.MODELS:
                if ServedModel.objects.filter(name=demo.name).exists():
                    continue
                source = demo.source
                if demo.name in fleet.GGUF_MODELS:
                    from demo.gguf_file import write_model_gguf

                    spec: dict[str, Any] = dict(fleet.GGUF_MODELS[demo.name])
                    path = write_model_gguf(fleet.demo_dir() / str(spec.pop("file")), **spec)
                    shape = read_gguf(path)
                    source = str(path)
                else:
                    config = json.loads((fleet.CONFIGS / demo.config).read_text())
                    weights_index = {"metadata": {"total_size": demo.total_size}, "weight_map": {}}
                    shape = shape_from_config(config, index=weights_index, source=demo.config)
                services.model_import(
                    name=demo.name, source=source, shape=shape.as_fields(), message="demo fleet"
                )
                created += 1
            for engine_name, release in fleet.RELEASES.items():
                if not EngineDefault.objects.filter(engine=engine_name).exists():
                    services.engine_default_save(engine=engine_name, version=release, message="demo fleet")
            for model_name, name, engine, profile_class, gpn, tp, profile_args in fleet.PROFILES:
                model = ServedModel.objects.get(name=model_name)
                if Profile.objects.filter(model=model, name=name).exists():
                    continue
                services.profile_save(
                    instance=Profile(
                        model=model,
                        name=name,
                        engine=engine,
                        gpu_class=classes.get(profile_class) if profile_class else None,
                        gpus_per_node=gpn,
                        tp=tp,
                        nodes=fleet.SPANS.get((model_name, name), (1, 0))[0],
                        pp=fleet.SPANS.get((model_name, name), (1, 0))[1],
                        args=profile_args,
                    ),
                    # The demo's contexts are set as the context operation would set them.
                    context_from_operation=True,
                )
                created += 1
            for name, model_name, node_name, cards, port in fleet.REPLICAS:
                if Replica.objects.filter(name=name).exists():
                    continue
                profile = Profile.objects.get(model__name=model_name, gpu_class__isnull=False)
                replica = services.replica_save(
                    instance=Replica(
                        name=name,
                        profile=profile,
                        port=port,
                        state=Replica.State.READY,
                        revision=profile.revision,
                        # The release the demo's agents declare their stand-in of the engine to be.
                        engine_version=fleet.RELEASES.get(profile.engine, ""),
                    )
                )
                for index in cards:
                    services.shard_save(
                        instance=Shard(
                            replica=replica, card=Card.objects.get(node=nodes[node_name], index=index)
                        )
                    )
                created += 1
            created += self._group_replicas(nodes)
        self.stdout.write(
            f"demo fleet: {created} object(s) created" if created else "demo fleet: already loaded"
        )
        if options["users"]:
            self._users(new_passwords=options["new_passwords"])

    def _group_replicas(self, nodes: dict[str, Node]) -> int:
        """The replicas across nodes: each rank's cards held as that rank, rank 0's rendezvous port."""
        created = 0
        for name, model_name, ranks, port, rendezvous_port in fleet.GROUP_REPLICAS:
            if Replica.objects.filter(name=name).exists():
                continue
            profile = Profile.objects.get(model__name=model_name, gpu_class__isnull=False)
            replica = services.replica_save(
                instance=Replica(
                    name=name,
                    profile=profile,
                    port=port,
                    rendezvous_port=rendezvous_port,
                    state=Replica.State.READY,
                    revision=profile.revision,
                    engine_version=fleet.RELEASES.get(profile.engine, ""),
                )
            )
            for rank, (node_name, cards) in enumerate(ranks):
                for index in cards:
                    services.shard_save(
                        instance=Shard(
                            replica=replica,
                            card=Card.objects.get(node=nodes[node_name], index=index),
                            rank=rank,
                        )
                    )
            created += 1
        return created

    def _users(self, *, new_passwords: bool) -> None:
        """One account per role. A password is made only for an account without one (or for all with
        ``new_passwords``), printed then and kept in the demo's password file, so every ``make run``
        signs in with the same ones."""
        User = get_user_model()
        path = fleet.passwords_file()
        kept = fleet.read_passwords(path)
        made = {}
        for username in fleet.USERS:
            user = User.objects.filter(username=username).first() or User(username=username)
            user.is_superuser = user.is_staff = username == "admin"
            if new_passwords or user.pk is None or not user.has_usable_password():
                made[username] = secrets.token_urlsafe(12)
                user.set_password(made[username])
            user.save()
            user.groups.set([Group.objects.get(name=username)])
        if made:
            fleet.write_passwords(path, {**kept, **made})
            lines = [f"  {name:<9} {password}   ({role(name).does})" for name, password in made.items()]
            self.stdout.write(
                "sign in at http://127.0.0.1:8000/ with one of (new passwords, kept in "
                f"{path}, readable by you alone):\n" + "\n".join(lines)
            )
        elif path.is_file():
            self.stdout.write(
                f"the demo's accounts ({', '.join(fleet.USERS)}) keep their passwords: they are in {path}"
            )
        else:
            self.stdout.write(
                f"the demo's accounts ({', '.join(fleet.USERS)}) keep their passwords, printed when they were "
                f"made ({path} is gone); `manage.py seed_demo --users --new-passwords` makes new ones"
            )
