"""The demo as the README lists it: ``manage.py seed_demo`` outside make, its accounts' passwords kept
between runs, and a foreign process started in the demo seen on its card through the real agent and
the stand-in nvidia-smi."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest
from agent_testing import REPO_ROOT, wait_until
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from catalog.models import Replica, ServedModel
from demo import fleet
from telemetry.models import CardReading
from telemetry.services import fleet_sample
from tests.support.restart import database_url, fleet_of

User = get_user_model()


def _seed_demo(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    # What a shell outside make has: no LLMGW_ variable (neither the model roots nor the agent
    # networks make sets), debug on as the README says; a temporary directory of the test's own.
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "DJANGO_DEBUG": "1",
        "DATABASE_URL": database_url(),
        "LLMGW_VAR_DIR": str(tmp_path / "var"),
    }
    return subprocess.run(
        [sys.executable, "manage.py", "seed_demo", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_seed_demo_works_outside_make_and_keeps_the_passwords_it_printed_once(tmp_path):
    first = _seed_demo(tmp_path, "--users")
    assert first.returncode == 0, first.stderr
    # 57, and the model that needs two nodes: gpu-h3 and gpu-h4 (8 cards each), its model, profile and replica.
    assert "demo fleet: 78 object(s) created" in first.stdout
    gguf = ServedModel.objects.get(name="mistral-7b").source
    assert gguf == str(tmp_path / "llmgw-demo" / "Mistral-7B-Instruct-v0.3-Q4_K_M.gguf")
    assert Replica.objects.filter(state=Replica.State.READY).count() == len(fleet.REPLICAS) + len(
        fleet.GROUP_REPLICAS
    )
    group = Replica.objects.get(name="llama-3.1-405b-1")
    assert group.rendezvous_port == 8008 and group.profile.nodes == 2
    assert sorted(group.shards.order_by().values_list("rank", "card__node__name").distinct()) == [
        (0, "gpu-h3"),
        (1, "gpu-h4"),
    ]

    passwords = tmp_path / "var" / "demo-passwords.txt"
    assert stat.S_IMODE(passwords.stat().st_mode) == 0o600
    kept = fleet.read_passwords(passwords)
    assert sorted(kept) == sorted(fleet.USERS)
    for username, password in kept.items():
        assert f"  {username:<9} {password}   (" in first.stdout  # printed when made

    second = _seed_demo(tmp_path, "--users")
    assert second.returncode == 0, second.stderr
    assert "demo fleet: already loaded" in second.stdout
    assert f"keep their passwords: they are in {passwords}" in second.stdout
    assert not any(password in second.stdout for password in kept.values())
    assert fleet.read_passwords(passwords) == kept
    for username, password in kept.items():
        assert User.objects.get(username=username).check_password(password), username

    renewed = _seed_demo(tmp_path, "--users", "--new-passwords")
    assert renewed.returncode == 0, renewed.stderr
    now = fleet.read_passwords(passwords)
    assert all(now[name] != kept[name] and now[name] in renewed.stdout for name in fleet.USERS)
    assert not User.objects.get(username="viewer").check_password(kept["viewer"])
    assert User.objects.get(username="viewer").check_password(now["viewer"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_restarts", "audit_flushable")
def test_the_foreign_process_command_makes_the_card_held_through_the_agent_and_its_nvidia_smi(tmp_path):
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=3, gpus=True) as running:
        gpu_dir = running.gpu_dirs["gpu-a"]
        call_command(
            "demo_foreign_process", "gpu-a", "--card", "2", "--mib", "12000", "--gpu-dir", str(gpu_dir)
        )
        (entry,) = gpu_dir.glob("proc-*.json")
        pid = int(entry.stem.split("-", 1)[1])
        try:
            assert fleet_sample() == {"gpu-a": True}
            held = CardReading.objects.get(card__node__name="gpu-a", card__index=2)
            assert held.foreign_mib == 12000
            assert [(p["pid"], p["name"], p["foreign"]) for p in held.processes] == [
                (pid, "python3 train.py", True)
            ]
            assert CardReading.objects.get(card__node__name="gpu-a", card__index=1).foreign_mib == 0
        finally:
            call_command("demo_foreign_process", "gpu-a", "--stop", "--gpu-dir", str(gpu_dir))
        assert not list(gpu_dir.glob("proc-*.json"))

        def card_free() -> bool:
            # The agent runs nvidia-smi at most every 2 s (agent/llmgw_agent/telemetry.py).
            fleet_sample()
            return CardReading.objects.get(card__node__name="gpu-a", card__index=2).foreign_mib == 0

        wait_until(card_free, timeout=10, interval=0.5, what="card 2 to be free again")


@pytest.mark.django_db
def test_the_foreign_process_command_refuses_a_card_the_node_does_not_have(tmp_path):
    with fleet_of(tmp_path, nodes=("gpu-a",), cards=2, gpus=True) as running:
        with pytest.raises(CommandError, match="gpu-a has no card 5; its cards: 0, 1"):
            call_command(
                "demo_foreign_process", "gpu-a", "--card", "5", "--gpu-dir", str(running.gpu_dirs["gpu-a"])
            )
        assert not list(running.gpu_dirs["gpu-a"].glob("proc-*.json"))


def test_make_runs_metrics_token_is_made_once_kept_0600_and_long_enough(tmp_path):
    from demo.management.commands.demo import demo_metrics_token

    token = demo_metrics_token(tmp_path)
    assert len(token) >= 32 and demo_metrics_token(tmp_path) == token
    assert stat.S_IMODE((tmp_path / "metrics-token").stat().st_mode) == 0o600
