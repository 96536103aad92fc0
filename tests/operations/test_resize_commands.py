"""python manage.py gpus / context: print the change, exit 1 on a refusal, audited as cli with --as."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEntry
from catalog.models import Profile
from tests.support import builders as b
from tests.support.restart import database_url

pytestmark = pytest.mark.django_db

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def refused(*args: str) -> CommandError:
    with pytest.raises(CommandError) as err:
        run(*args)
    return err.value


def llama(gpus: int = 1, cards: int = 8) -> Profile:
    b.node("gpu-1", cards=cards)
    return b.profile(b.llama_8b(), "h100", gpus=gpus, args=["--max-model-len", "32768"])


def state(p: Profile) -> tuple:
    p.refresh_from_db()
    return (p.gpus_per_node, p.tp, p.args, p.revision, AuditEntry.objects.count())


def test_gpus_prints_the_change_and_is_audited_as_cli_with_the_as_name():
    p = llama(gpus=1)
    out = run("gpus", "llama-3.1-8b", "2", "--as", "ops-bot")
    assert out.splitlines()[:3] == [
        "changed llama-3.1-8b/h100 (vllm on h100-80g): 1 → 2 card(s)",
        "  args: --max-model-len 32768",
        "  memory: 12.6 GiB on each of 2 cards, of 71.7 GiB usable on each",
    ]
    assert state(p) == (2, 2, ["--max-model-len", "32768"], 2, 1)
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.via, entry.user, entry.action) == ("ops-bot", "cli", None, "resize")
    assert (entry.before["tp"], entry.after["tp"]) == (1, 2)


def test_as_a_known_account_links_the_audit_entry_to_it():
    llama()
    alice = b.user("alice")
    run("gpus", "llama-3.1-8b", "4", "--as", "alice")
    assert (AuditEntry.objects.get().user, AuditEntry.objects.get().actor) == (alice, "alice")


def test_without_as_the_entry_names_the_os_user(monkeypatch):
    llama()
    monkeypatch.setattr("base.commands.getpass.getuser", lambda: "ops-person")
    run("gpus", "llama-3.1-8b", "2")
    assert AuditEntry.objects.get().actor == "ops-person"


def test_a_dry_run_prints_what_would_change_and_writes_nothing():
    p = llama(gpus=1)
    before = state(p)
    out = run("gpus", "llama-3.1-8b", "2", "--dry-run")
    assert out.startswith("would change llama-3.1-8b/h100 (vllm on h100-80g): 1 → 2 card(s)")
    assert state(p) == before


@pytest.mark.parametrize(
    "args, code, says",
    [
        (("gpus", "llama-3.1-8b", "3"), "heads", "8 KV heads"),
        (("gpus", "llama-3.1-8b", "1"), "unchanged", "already uses 1 card"),
        (("gpus", "llama-3.1-8b", "0"), "gpus_range", "1 to 64 cards"),
        (("gpus", "llama-3.1-8b", "16"), "too_few_cards", "the most one has is 8"),
        (("gpus", "llama-3.1-8b", "2", "--profile", "nope"), "no_profile", "no profile 'nope'"),
        (("gpus", "no-such-model", "2"), "not_found", "No model 'no-such-model'"),
        (("context", "llama-3.1-8b", "200000"), "context_range", "1 to 131072 tokens"),
        (("context", "llama-3.1-8b", "32768"), "unchanged", "already serves a context of 32768 tokens"),
        (("gpus", "llama-3.1-8b", "3", "--dry-run"), "heads", "8 KV heads"),
    ],
)
def test_a_refusal_prints_the_sentence_and_exits_1_and_saves_nothing(args, code, says):
    p = llama(gpus=1)
    before = state(p)
    err = refused(*args, "--as", "ops-bot")
    assert err.returncode == 1
    assert says in str(err) and str(err).endswith(f"[{code}]")
    assert state(p) == before


def test_context_prints_the_change_in_tokens_and_is_audited_as_set_context():
    p = llama(gpus=1)
    out = run("context", "llama-3.1-8b", "65536", "--as", "ops-bot")
    assert out.splitlines()[:2] == [
        "changed llama-3.1-8b/h100 (vllm on h100-80g): 32768 → 65536 tokens",
        "  args: --max-model-len 65536",
    ]
    assert state(p)[2:] == (["--max-model-len", "65536"], 2, 1)
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.via, entry.action) == ("ops-bot", "cli", "set_context")


def test_context_dry_run_writes_nothing():
    p = llama(gpus=1)
    before = state(p)
    assert run("context", "llama-3.1-8b", "8192", "--dry-run").startswith("would change")
    assert state(p) == before


def test_profile_and_in_place_reach_the_service():
    n = b.node("gpu-1", cards=4)
    m = b.llama_8b()
    short = b.profile(m, "short", gpus=2, args=["--max-model-len", "8192"])
    b.profile(m, "long", gpus=1)  # two profiles on cards: --profile is needed
    b.replica(short, n, [0, 1])

    assert str(refused("gpus", "llama-3.1-8b", "4")).endswith("[ambiguous_profile]")

    beside = refused("gpus", "llama-3.1-8b", "4", "--profile", "short")
    assert str(beside).endswith("[no_room_beside]")
    out = run("gpus", "llama-3.1-8b", "4", "--profile", "short", "--in-place", "--no-wait")
    assert "restart: in place" in out
    assert "restarting 1 replica(s)" in out
    assert state(short)[:2] == (4, 4)


def test_a_card_count_that_is_not_a_number_is_refused_by_the_parser():
    llama()
    with pytest.raises(CommandError, match="invalid int value"):
        run("gpus", "llama-3.1-8b", "two")
    assert AuditEntry.objects.count() == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_manage_py_exits_0_on_a_change_and_1_on_a_refusal_with_the_sentence_on_stderr():
    p = llama(gpus=1)
    env = {**os.environ, "DATABASE_URL": database_url()}  # as the application's role, as the tests are

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(MANAGE), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    ok = manage("gpus", "llama-3.1-8b", "2", "--as", "ops-bot")
    assert ok.returncode == 0, ok.stderr
    assert "changed llama-3.1-8b/h100" in ok.stdout
    no = manage("gpus", "llama-3.1-8b", "3", "--as", "ops-bot")
    assert no.returncode == 1
    assert "tensor parallel cannot spread over 3 cards" in no.stderr and "[heads]" in no.stderr
    assert state(p) == (2, 2, ["--max-model-len", "32768"], 2, 1)
    assert AuditEntry.objects.get().actor == "ops-bot"
