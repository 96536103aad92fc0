"""Readiness: whether an engine on 127.0.0.1 answers, and whether it serves its model yet."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

from .record import LOADING, READY, STARTING

PROBE_TIMEOUT = 2.0

# Readiness probes go straight to 127.0.0.1, never through a proxy from the
# agent's environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe(port: int, model: str, timeout: float = PROBE_TIMEOUT) -> tuple[str, str]:
    """The state an engine on 127.0.0.1:``port`` is in, and why.

    starting: /health does not answer. loading: /health answers but not 200,
    or says it is loading (a JSON body whose ``status`` is "loading" or
    "starting"), or /v1/models does not list ``model`` yet. ready: otherwise.
    """
    base = f"http://127.0.0.1:{port}"
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
        status, body = _get(f"{base}/v1/models", timeout)
    except (OSError, http.client.HTTPException):
        return LOADING, "/v1/models is not answering yet"
    if status != 200:
        return LOADING, f"/v1/models answered {status}"
    if model not in _model_ids(body):
        return LOADING, f"/v1/models does not list {model} yet"
    return READY, "ready"


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return response.status, response.read(1 << 20)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(1 << 20)


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
