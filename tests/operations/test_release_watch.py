"""The release watch against a package index served here, on 127.0.0.1 (never the internet): the
command's answer and exit code, what it keeps, the daily task, /metrics."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from catalog.models import EngineDefault
from operations.models import ReleaseCheck
from operations.services.release_watch import check_releases

pytestmark = pytest.mark.django_db


class Index:
    """A package index's simple API (PEP 691 JSON) for the packages in ``packages``: name -> the
    answer's body; what it was asked is kept in ``asked`` (path, Accept header)."""

    def __init__(self, packages: dict[str, dict[str, Any]]):
        self.packages = packages
        self.asked: list[tuple[str, str]] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the base class's name
                index.asked.append((self.path, self.headers.get("Accept", "")))
                name = self.path.strip("/").split("/")[-1]
                body = index.packages.get(name)
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"


def pep700(*versions: str, yanked: tuple[str, ...] = ()) -> dict[str, Any]:
    files = [
        {"filename": f"pkg-{v}-py3-none-any.whl", "url": f"pkg-{v}.whl", "hashes": {}, "yanked": v in yanked}
        for v in versions
    ]
    return {"meta": {"api-version": "1.1"}, "name": "pkg", "versions": list(versions), "files": files}


def files_only(*versions: str) -> dict[str, Any]:
    """An index without PEP 700's versions list: the releases read from the files' names."""
    return {
        "meta": {"api-version": "1.0"},
        "name": "pkg",
        "files": [{"filename": f"pkg-{v}.tar.gz", "url": "x", "hashes": {}} for v in versions],
    }


@pytest.fixture
def index() -> Iterator[Index]:
    served = Index(
        {
            "vllm": pep700("0.11.0", "0.19.0", "0.19.1", "0.20.0rc1"),
            "sglang": files_only("0.5.9", "0.5.10"),
            "tensorrt-llm": pep700("1.0.0", "1.1.0", yanked=("1.1.0",)),
            "freetoken": pep700("0.2.1"),
        }
    )
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


def defaults(**versions: str) -> None:
    for engine, version in versions.items():
        EngineDefault.objects.create(engine=engine, version=version)


def test_a_newer_release_on_the_index_exits_1_naming_it(index):
    defaults(vllm="0.19.0", sglang="0.5.10", trtllm="1.0.0", freetoken="0.2.1")
    out = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("engine_releases", "--index-url", index.url, stdout=out, stderr=StringIO())
    assert caught.value.returncode == 1
    # The newest final release: not the candidate 0.20.0rc1.
    assert out.getvalue().splitlines() == ["vllm: 0.19.1 is out; the fleet's default is 0.19.0"]
    assert "vllm 0.19.1" in str(caught.value)
    # Asked in the simple API's JSON form.
    assert ("/simple/vllm/", "application/vnd.pypi.simple.v1+json") in index.asked
    check = ReleaseCheck.objects.get()
    assert check.index_url == index.url
    assert [e["engine"] for e in check.results if e["newer"]] == ["vllm"]


def test_no_newer_release_exits_0(index):
    # trtllm's 1.1.0 is yanked: not offered. sglang's come from its files' names.
    defaults(vllm="0.19.1", sglang="0.5.10", trtllm="1.0.0", freetoken="0.2.1")
    out = StringIO()
    call_command("engine_releases", "--index-url", index.url, stdout=out, stderr=StringIO())
    assert (
        out.getvalue()
        .strip()
        .endswith(f"No engine has a release newer than the fleet's default ({index.url}).")
    )


def test_what_the_index_did_not_say_and_what_has_no_default_are_said_and_not_counted_newer(index):
    del index.packages["freetoken"]
    defaults(vllm="0.19.1")
    results = {e["engine"]: e for e in check_releases(index.url)}
    assert "no package freetoken" in results["freetoken"]["error"] and not results["freetoken"]["newer"]
    assert results["sglang"]["newest"] == "0.5.10" and results["sglang"]["default"] == ""
    assert not results["sglang"]["newer"]
    assert "not watched" in results["llamacpp"]["error"]
    assert results["trtllm"]["newest"] == "1.0.0"


def test_the_daily_task_records_the_answer_and_metrics_show_it(index, settings, client):
    from operations.tasks import watch_releases

    settings.LLMGW_PACKAGE_INDEX_URL = index.url
    settings.LLMGW_METRICS_TOKEN = "metrics-token-of-the-tests-0123456789"
    defaults(vllm="0.19.0")
    watch_releases.call()
    assert ReleaseCheck.objects.count() == 1
    response = client.get("/metrics", headers={"Authorization": f"Bearer {settings.LLMGW_METRICS_TOKEN}"})
    text = response.content.decode()
    assert 'llmgw_engine_release_newer{default="0.19.0",engine="vllm",newest="0.19.1"} 1.0' in text
    assert 'llmgw_engine_release_newer{default="",engine="sglang",newest="0.5.10"} 0.0' in text
    assert "llmgw_engine_release_check_timestamp_seconds " in text
