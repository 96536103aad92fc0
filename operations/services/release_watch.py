"""The release watch: each engine's newest release on the package index beside the fleet's default.

The package index is asked through its simple API in its JSON form (PEP 691: ``GET
<index>/<package>/`` with ``Accept: application/vnd.pypi.simple.v1+json``), PyPI's by default
(``LLMGW_PACKAGE_INDEX_URL``, a fleet's own index in its place). A release is read from the answer's
``versions`` (PEP 700) or, where an index gives none, from its files' names; pre-releases and
releases whose every file is yanked are not offered. An engine the registry names no package for
(llama.cpp, published as GitHub builds) is said not to be watched; an engine without a fleet default
is said so, never counted newer.

``manage.py engine_releases`` asks now and prints; the workers' daily task ``watch_releases``
(operations/tasks.py) records each answer (``ReleaseCheck``), which the releases page and /metrics
show.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import httpx
from django.conf import settings

from catalog.selectors import engine_defaults
from operations.models import ReleaseCheck
from planning import registry
from planning.releases import newer, parse_version

ACCEPT = "application/vnd.pypi.simple.v1+json"
TIMEOUT = 20.0
_FINAL = 4  # planning.releases: the kind of a final release (not dev, alpha, beta or candidate)
_SDIST = re.compile(r"^(?P<name>.+?)-(?P<version>\d[^-]*?)(?:\.tar\.gz|\.zip)$")


def _versions(package: str, body: Any) -> list[str]:
    """The releases an index's answer offers: PEP 700's ``versions`` where given, else those of the
    wheels' and source archives' file names; a release whose every file is yanked is left out."""
    if not isinstance(body, dict):
        raise ValueError("the answer is not a JSON object")
    by_file: dict[str, bool] = {}  # release -> has a file not yanked
    for f in body.get("files") or []:
        name = f.get("filename", "") if isinstance(f, dict) else ""
        version = ""
        if name.endswith(".whl"):
            parts = name.split("-")
            version = parts[1] if len(parts) >= 5 else ""
        elif (m := _SDIST.match(name)) is not None:
            version = m["version"]
        if version:
            by_file[version] = by_file.get(version, False) or not f.get("yanked")
    listed = body.get("versions")
    versions = [v for v in listed if isinstance(v, str)] if isinstance(listed, list) else list(by_file)
    return [v for v in versions if by_file.get(v, True)]


def newest_release(client: httpx.Client, index_url: str, package: str) -> str:
    """The newest final release of ``package`` on the index; raises ``ValueError`` saying why not."""
    url = f"{index_url.rstrip('/')}/{quote(package)}/"
    try:
        response = client.get(url, headers={"Accept": ACCEPT})
    except httpx.HTTPError as exc:
        raise ValueError(f"{url} did not answer ({exc.__class__.__name__}: {exc})") from None
    if response.status_code == 404:
        raise ValueError(f"the index has no package {package} ({url} answered 404)")
    if response.status_code != 200:
        raise ValueError(f"{url} answered {response.status_code}")
    try:
        versions = _versions(package, response.json())
    except ValueError as exc:
        raise ValueError(f"{url} did not answer in the simple API's JSON form: {exc}") from None
    finals = [v for v in versions if (key := parse_version(v)) is not None and key[1] == _FINAL]
    if not finals:
        raise ValueError(f"the index lists no final release of {package}")
    return max(finals, key=lambda v: parse_version(v) or ((), 0, 0, 0))


def check_releases(index_url: str | None = None) -> list[dict[str, Any]]:
    """Each engine of the registry: its package, the fleet's default, the index's newest final
    release, whether that is newer, and what went wrong (``error``) where the index did not say."""
    index_url = index_url or settings.LLMGW_PACKAGE_INDEX_URL
    defaults = engine_defaults()
    results = []
    with httpx.Client(timeout=TIMEOUT, follow_redirects=True) as client:
        for name, eng in sorted(registry().items()):
            entry: dict[str, Any] = {
                "engine": name,
                "package": eng.package,
                "default": defaults.get(name, ""),
                "newest": "",
                "newer": False,
                "error": "",
            }
            if not eng.package:
                entry["error"] = "not published on the package index: not watched"
            else:
                try:
                    entry["newest"] = newest_release(client, index_url, eng.package)
                except ValueError as exc:
                    entry["error"] = str(exc)
                entry["newer"] = bool(entry["default"]) and newer(entry["newest"], entry["default"])
            results.append(entry)
    return results


def record_check(index_url: str | None = None) -> ReleaseCheck:
    """Ask the index (``check_releases``) and keep the answer."""
    index_url = index_url or settings.LLMGW_PACKAGE_INDEX_URL
    return ReleaseCheck.objects.create(index_url=index_url, results=check_releases(index_url))


def latest_check() -> ReleaseCheck | None:
    return ReleaseCheck.objects.order_by("-checked_at", "-pk").first()


def describe(entry: dict[str, Any]) -> str:
    """One line for an engine's answer, as the command prints it."""
    name = entry["engine"]
    if entry["newer"]:
        return f"{name}: {entry['newest']} is out; the fleet's default is {entry['default']}"
    if entry["error"]:
        return f"{name}: {entry['error']}"
    if not entry["default"]:
        return f"{name}: newest {entry['newest']}; the fleet has no default release of it to compare"
    return f"{name}: {entry['default']} is the newest ({entry['newest']} on the index)"
