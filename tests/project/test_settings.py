"""Settings come from the environment and fail loudly on a bad value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from llmgw_web.env import env_bool, env_int, env_list

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_", "ALLOWED_", "CSRF_", "SECURE_"))
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("helper", "value"), [(env_bool, "maybe"), (env_int, "ten"), (env_list, "a,,b")])
def test_a_bad_value_is_refused_naming_the_variable(monkeypatch, helper, value):
    monkeypatch.setenv("LLMGW_X", value)
    with pytest.raises(ImproperlyConfigured, match="LLMGW_X"):
        helper("LLMGW_X", *([0] if helper is env_int else []))


def test_production_refuses_to_start_without_a_secret_key():
    result = manage("check")
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY is not set" in result.stderr


def test_check_deploy_reports_nothing_with_production_settings(tmp_path):
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DJANGO_SECRET_KEY="k3-9fQ_zp7Lw2mXc8vRt5yBn1aHs4dJg6eUo0iKl_QwErTyUi-7Zx2Vb",
        ALLOWED_HOSTS="llmgw.example.org",
        CSRF_TRUSTED_ORIGINS="https://llmgw.example.org",
        DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3",
        LLMGW_AUDIT_KEY="audit-key-for-this-test-only-0123456789abcdef",
    )
    assert result.returncode == 0, result.stderr
    # SQLite: said, as information, what append-only does not hold against there.
    assert "audit.I001" in result.stderr and "WARNING" not in result.stderr


def test_a_csrf_origin_without_a_scheme_is_refused():
    result = manage("check", DJANGO_DEBUG="1", CSRF_TRUSTED_ORIGINS="llmgw.example.org")
    assert result.returncode != 0 and "needs a scheme" in result.stderr


def test_a_database_url_selects_postgresql():
    result = manage(
        "shell",
        "--no-imports",
        "-c",
        "from django.db import connection; print(connection.vendor)",
        DJANGO_DEBUG="1",
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres",
    )
    assert result.stdout.strip().splitlines()[-1] == "postgresql", result.stderr


def test_database_connections_are_kept_and_checked_by_default():
    result = manage(
        "shell",
        "--no-imports",
        "-c",
        "from django.conf import settings; d = settings.DATABASES['default']; "
        "print(d['CONN_MAX_AGE'], d['CONN_HEALTH_CHECKS'])",
        DJANGO_DEBUG="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["600", "True"]
    closed = manage(
        "shell",
        "--no-imports",
        "-c",
        "from django.conf import settings; print(settings.DATABASES['default']['CONN_MAX_AGE'])",
        DJANGO_DEBUG="1",
        DATABASE_CONN_MAX_AGE="0",
    )
    assert closed.stdout.split() == ["0"]
    bad = manage("check", DJANGO_DEBUG="1", DATABASE_CONN_MAX_AGE="-1")
    assert bad.returncode != 0 and "DATABASE_CONN_MAX_AGE=-1 is below the minimum of 0" in bad.stderr


def test_a_long_poll_longer_than_the_agent_waits_is_refused():
    bad = manage("check", DJANGO_DEBUG="1", LLMGW_AGENT_WAIT_SECONDS="31")
    assert bad.returncode != 0 and "LLMGW_AGENT_WAIT_SECONDS must be at most 30" in bad.stderr


def test_a_stale_threshold_not_above_the_longest_agent_call_is_refused():
    # A stop waits up to LLMGW_AGENT_STOP_SECONDS (25 s by default) after its drain
    # (LLMGW_STOP_DRAIN_SECONDS, 30 s): 20 s would let a worker be taken over while it still waits
    # for an agent.
    bad = manage("check", DJANGO_DEBUG="1", LLMGW_OPERATION_STALE_SECONDS="20")
    assert bad.returncode != 0, bad.stdout
    assert "LLMGW_OPERATION_STALE_SECONDS (20) must be above the longest agent call" in bad.stderr
    assert "(55 s:" in bad.stderr
    # The drain counts: a 5 s stop after a 20 s drain needs more than 20 s.
    bad = manage(
        "check",
        DJANGO_DEBUG="1",
        LLMGW_OPERATION_STALE_SECONDS="20",
        LLMGW_AGENT_STOP_SECONDS="5",
        LLMGW_STOP_DRAIN_SECONDS="20",
    )
    assert bad.returncode != 0 and "(25 s:" in bad.stderr
    # The long poll counts too: a 10 s timeout and a 10 s wait need more than 20 s.
    bad = manage(
        "check",
        DJANGO_DEBUG="1",
        LLMGW_OPERATION_STALE_SECONDS="20",
        LLMGW_AGENT_STOP_SECONDS="5",
        LLMGW_STOP_DRAIN_SECONDS="0",
        LLMGW_AGENT_TIMEOUT_SECONDS="10",
        LLMGW_AGENT_WAIT_SECONDS="10",
    )
    assert bad.returncode != 0 and "(20 s:" in bad.stderr
    # The shortest allowed: 2 s, with calls that end sooner.
    good = manage(
        "check",
        DJANGO_DEBUG="1",
        LLMGW_OPERATION_STALE_SECONDS="2",
        LLMGW_OPERATION_HEARTBEAT_SECONDS="0.5",
        LLMGW_AGENT_STOP_SECONDS="1.5",
        LLMGW_STOP_DRAIN_SECONDS="0.2",
        LLMGW_AGENT_TIMEOUT_SECONDS="1",
        LLMGW_AGENT_WAIT_SECONDS="0.5",
    )
    assert good.returncode == 0, good.stderr


def show(expression: str, **env: str) -> str:
    """``expression`` evaluated in the production settings of ``env``."""
    result = manage(
        "shell",
        "-c",
        f"from django.conf import settings; print({expression})",
        DJANGO_SECRET_KEY="k3-9fQ_zp7Lw2mXc8vRt5yBn1aHs4dJg6eUo0iKl_QwErTyUi-7Zx2Vb",
        ALLOWED_HOSTS="llmgw.example.org",
        **env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_a_request_may_claim_https_only_when_a_setting_says_a_proxy_sets_the_header():
    assert show("getattr(settings, 'SECURE_PROXY_SSL_HEADER', None)") == "None"
    assert (
        show("settings.SECURE_PROXY_SSL_HEADER", LLMGW_BEHIND_PROXY="1")
        == "('HTTP_X_FORWARDED_PROTO', 'https')"
    )


def test_every_response_carries_a_content_security_policy_without_inline_scripts(client):
    policy = client.get("/accounts/login/")["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
    assert directives["script-src"] == "'self'"
    assert "unsafe-inline" not in directives["script-src"] and "unsafe-eval" not in policy
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"


def test_the_lockout_setting_that_is_gone_stops_the_process_naming_what_replaced_it():
    result = manage("check", DJANGO_DEBUG="1", LLMGW_SIGNIN_LOCKOUT_MINUTES="15")
    assert result.returncode != 0
    assert "LLMGW_SIGNIN_LOCKOUT_MINUTES is gone" in result.stderr
    assert "LLMGW_SIGNIN_LONGEST_WAIT_MINUTES" in result.stderr
