"""The API's limits hold across processes and against hostile bodies: the rate's counts are shared by
every web process (two gunicorn processes on one database allow the rate once between them), JSON
nested a thousand levels deep is a 400 and a body over the limit a 413, both in the one error shape,
changing nothing."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.core.cache import caches
from rest_framework.test import APIClient

from audit.models import AuditEntry
from catalog.models import ServedModel
from tests.support import builders as b
from tests.support.restart import database_url, port_block

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def admin_api(db) -> APIClient:
    api = APIClient(raise_request_exception=False)
    api.force_authenticate(b.user("root", roles=("admin",)))
    return api


MODEL = {
    "name": "tiny",
    "source": "org/tiny",
    "context_length": 4096,
    "layers": 2,
    "attention_heads": 4,
    "kv_heads": 4,
    "head_dim": 64,
    "dtype": "bfloat16",
    "attention": "mha",
    "weight_bytes": 1000,
}


@pytest.mark.parametrize("levels", [1000, 33])
def test_json_nested_too_deep_is_a_400_in_the_error_shape_and_changes_nothing(admin_api, levels):
    body = json.dumps(MODEL)[:-1] + ', "extra": ' + "[" * levels + "]" * levels + "}"
    response = admin_api.post("/api/models/", data=body, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert response["Content-Type"] == "application/json"
    answer = response.json()
    assert answer["code"] == "parse_error"
    assert "nested more than 32 levels deep" in answer["detail"]
    assert not ServedModel.objects.exists() and not AuditEntry.objects.exists()


def test_json_nested_within_the_bound_is_read_as_before(admin_api):
    # Thirty levels is within the bound: the body is parsed, and refused (or not) for what it says.
    body = dict(MODEL, extra=json.loads("[" * 30 + "]" * 30))
    response = admin_api.post("/api/models/", data=body, format="json")
    assert response.status_code in (201, 400)
    assert response.json().get("code") != "parse_error"


def test_a_body_over_the_limit_is_a_413_in_the_error_shape_and_changes_nothing(admin_api):
    body = json.dumps(dict(MODEL, source="org/" + "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE))
    response = admin_api.post("/api/models/", data=body, content_type="application/json")
    assert response.status_code == 413, response.content[:300]
    assert response["Content-Type"] == "application/json"
    answer = response.json()
    assert answer["code"] == "too_large"
    assert "over the 2.5 MiB the API takes" in answer["detail"]
    assert not ServedModel.objects.exists() and not AuditEntry.objects.exists()


@contextlib.contextmanager
def web_process(port: int, log: Path, env: dict[str, str]) -> Iterator[str]:
    """One gunicorn process (one worker) on 127.0.0.1:``port``, as ``make serve`` runs it."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "llmgw_web.wsgi",
                "--workers",
                "1",
                "--bind",
                f"127.0.0.1:{port}",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/accounts/login/", timeout=2)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_web_processes_allow_the_rate_once_between_them(tmp_path):
    secret = b.token(b.user("bot", roles=("viewer",)))
    env = {key: value for key, value in os.environ.items() if not key.startswith("LLMGW_")}
    env.update(
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="llmgw_web.settings",
        ALLOWED_HOSTS="127.0.0.1",
        SECURE_SSL_REDIRECT="0",
        LLMGW_API_RATE_USER="6",
    )
    base = port_block(4)
    try:
        with (
            web_process(base, tmp_path / "web-1.log", env) as one,
            web_process(base + 1, tmp_path / "web-2.log", env) as two,
        ):
            headers = {"Authorization": f"Token {secret}"}
            statuses = [
                httpx.get(f"{url}/api/whoami/", headers=headers, timeout=10).status_code
                for url in [one, two] * 5
            ]
    finally:
        caches["throttle"].clear()  # its table is not emptied between tests as the models' are
    # Counted per process, each would allow its 6 (ten 200s); shared, the seventh call is refused.
    assert statuses == [200] * 6 + [429] * 4


# The only API a stranger reaches is the documentation, when LLMGW_API_DOCS_PUBLIC opens it: anything
# else answers 401 before any rate is counted.
def docs_as_anonymous(remote: str, forwarded_for: str) -> int:
    client = APIClient(REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded_for)
    return client.get("/api/docs/").status_code


def test_the_anonymous_rate_counts_the_connection_not_a_forwarded_for_header_the_client_wrote(db, settings):
    settings.LLMGW_API_DOCS_PUBLIC = True
    settings.LLMGW_API_RATE_ANONYMOUS = 3
    statuses = [docs_as_anonymous("198.51.100.7", f"203.0.113.{n}") for n in range(5)]
    assert statuses == [200, 200, 200, 429, 429]


def test_behind_the_proxy_the_anonymous_rate_counts_the_address_the_proxy_wrote(db, settings):
    settings.LLMGW_API_DOCS_PUBLIC = True
    settings.LLMGW_BEHIND_PROXY = True
    settings.LLMGW_API_RATE_ANONYMOUS = 3
    # The proxy (10.0.0.2) appends the address it was connected from; what the client wrote stays left.
    statuses = [docs_as_anonymous("10.0.0.2", f"192.0.2.{n}, 203.0.113.5") for n in range(4)]
    assert statuses == [200, 200, 200, 429]
    assert docs_as_anonymous("10.0.0.2", "203.0.113.6") == 200  # another client, its own count
