"""Readiness: whether an engine on 127.0.0.1 answers, serves its model, and generates, and when to
ask (``ProbeSchedule``); and, for a stop that drains, how many requests it has in flight (its own
metrics)."""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from .record import LOADING, READY, STARTING

PROBE_TIMEOUT = 2.0
# The one-token completion may be an engine's first request (a warm-up, a compile): given longer.
GENERATE_TIMEOUT = 20.0
GENERATE_PROMPT = "Hello"

# Until a replica is ready its watcher looks at its log's size this often, and probes it when the
# log has grown (at most every PROBE_GAP_SECONDS: an engine writing all the time while it loads
# is probed ten times a second, no more); it probes every ready_poll_seconds besides.
LOG_LOOK_SECONDS = 0.02
PROBE_GAP_SECONDS = 0.1

# Readiness probes go straight to 127.0.0.1, never through a proxy from the
# agent's environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe(
    port: int,
    model: str,
    timeout: float = PROBE_TIMEOUT,
    *,
    api_key: str = "",
    generate_timeout: float = GENERATE_TIMEOUT,
) -> tuple[str, str]:
    """The state an engine on 127.0.0.1:``port`` is in, and why.

    starting: /health does not answer. loading: /health answers but not 200,
    or says it is loading (a JSON body whose ``status`` is "loading" or
    "starting"), or /v1/models does not list ``model`` yet, or a one-token
    completion of ``model`` (POST /v1/completions, max_tokens 1) does not
    answer 200 with a choice: an engine can answer the first two with its
    generation dead. ready: otherwise. ``api_key`` (the replica's own, from its
    spec) is sent as a bearer token to /v1/*, as a client would.
    """
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        status, body = _get(f"{base}/health", timeout)
    except (OSError, http.client.HTTPException):
        return STARTING, "/health is not answering yet"
    if status != 200:
        return LOADING, f"/health answered {status}"
    said = _json_status(body)
    if said in {"loading", "starting"}:
        return LOADING, f"/health says {said}"
    try:
        status, body = _get(f"{base}/v1/models", timeout, auth)
    except (OSError, http.client.HTTPException):
        return LOADING, "/v1/models is not answering yet"
    if status != 200:
        return LOADING, f"/v1/models answered {status}"
    if model not in _model_ids(body):
        return LOADING, f"/v1/models does not list {model} yet"
    return generates(base, model, auth, generate_timeout)


def generates(base: str, model: str, auth: dict[str, str], timeout: float) -> tuple[str, str]:
    """(ready, "ready") when a one-token completion of ``model`` answers 200 with a choice; else
    (loading, what it answered)."""
    body = json.dumps({"model": model, "prompt": GENERATE_PROMPT, "max_tokens": 1, "temperature": 0})
    headers = {"Content-Type": "application/json", **auth}
    what = "/health and /v1/models answer, but a one-token completion"
    try:
        status, raw = _send(f"{base}/v1/completions", timeout, headers, body.encode())
    except (OSError, http.client.HTTPException) as exc:
        return LOADING, f"{what} did not answer within {timeout:g}s: {exc}"
    if status != 200:
        return LOADING, f"{what} answered {status}: {_error_text(raw)}"
    try:
        choices = json.loads(raw).get("choices")
    except (ValueError, AttributeError):
        choices = None
    if not isinstance(choices, list) or not choices:
        return LOADING, f"{what} answered 200 without a choice"
    return READY, "ready"


class ProbeSchedule:
    """When a starting replica is probed: every ``poll`` seconds, and as soon as its engine has
    written to its log (an engine's server logs its start once it serves, so the replica's
    readiness is seen then, whatever the engine's words), at most every ``PROBE_GAP_SECONDS``.
    Its watcher wakes every ``look`` seconds to ask ``due``."""

    def __init__(self, log_path: Path, poll: float):
        self.log_path, self.poll = log_path, poll
        self.look = min(poll, LOG_LOOK_SECONDS)
        # The log's size at the last probe (the agent's header line, to begin with), and when.
        self._seen, self._probed = _size(log_path), time.monotonic()

    def due(self) -> bool:
        """Whether to probe now: a poll is due, or the log grew since the last probe (not too
        soon after it). A True counts as the probe made."""
        now, size = time.monotonic(), _size(self.log_path)
        since = now - self._probed
        if since < self.poll and (size == self._seen or since < PROBE_GAP_SECONDS):
            return False
        self._seen, self._probed = size, now
        return True


def _size(path: Path) -> int:
    """The size of a replica's log, -1 when it cannot be read (a probe is then never asked early)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


# -- requests in flight, for a stop that drains --------------------------------------------------

# The engines' own gauges of requests being served and queued: vLLM (vllm/v1/metrics/loggers.py;
# docs/source/design/v1/metrics.md lists them for V0 and V1) and SGLang
# (python/sglang/srt/metrics/collector.py; served with --enable-metrics). docs/restarts.md.
IN_FLIGHT_GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def in_flight(port: int, timeout: float = PROBE_TIMEOUT) -> int | None:
    """How many requests the engine on 127.0.0.1:``port`` is serving or has queued, from its
    /metrics (the gauges above, summed over their labels); None when it does not say (no /metrics,
    or none of those gauges)."""
    try:
        status, raw = _get(f"http://127.0.0.1:{port}/metrics", timeout)
    except (OSError, http.client.HTTPException):
        return None
    if status != 200:
        return None
    total, seen = 0.0, False
    for line in raw.decode("utf-8", "replace").splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) not in IN_FLIGHT_GAUGES:
            continue
        try:
            total += float(match.group(3))
        except ValueError:
            continue
        seen = True
    return round(total) if seen else None


def _get(url: str, timeout: float, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    return _send(url, timeout, headers or {}, None)


def _send(url: str, timeout: float, headers: dict[str, str], data: bytes | None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read(1 << 20)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(1 << 20)


def _error_text(raw: bytes) -> str:
    """What an engine's error body says, in a line: OpenAI's ``error.message``, or the text cut."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str):
        message = raw.decode("utf-8", "replace")
    message = " ".join(message.split())
    return message[:300] or "(no body)"


def _json_status(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    status = data.get("status") if isinstance(data, dict) else None
    return status.strip().lower() if isinstance(status, str) else ""


def _model_ids(body: bytes) -> set[str]:
    try:
        data = json.loads(body)
    except ValueError:
        return set()
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return set()
    return {entry["id"] for entry in entries if isinstance(entry, dict) and isinstance(entry.get("id"), str)}
