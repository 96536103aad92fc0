"""Engine releases: their numbers compared, the ranges the registry keys data by, and the floors a
release puts on a node (compute capability, driver, CUDA, architecture), checked against what the
node's agent reports of itself.

A release is compared by its numbers (``0.19.1``, llama.cpp's build ``b5000`` as 5000), a
pre-release (``1.0.0rc4``, ``0.11.0.dev3``) before its final release and a post-release
(``0.5.10.post1``) after it: the subset of PEP 440 the engines' own numbers use. A range is a
comma-separated list of ``>=``, ``>``, ``<=``, ``<``, ``==`` bounds, every one of which must hold
(``">=0.11, <0.20"``), or ``"*"`` for every release.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from base.errors import DomainError

_VERSION = re.compile(
    r"^\s*[vb]?(?P<nums>\d+(?:\.\d+)*)(?:[.-]?(?P<pre>a|alpha|b|beta|rc|dev)\.?(?P<pren>\d*))?"
    r"(?:[.-]?post\.?(?P<post>\d*))?(?:\+[\w.]+)?\s*$",
    re.IGNORECASE,
)
# The order of a release's kinds: a dev release, then alpha, beta, release candidate, the release.
_PRE = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "rc": 3}
_FINAL = 4
_BOUND = re.compile(r"^\s*(>=|<=|==|>|<)\s*(\S+)\s*$")
FLOORS = ("capability", "driver", "cuda", "arch")
# The names the machines' architectures go by, as platform.machine() and the vendors write them.
_ARCH = {"x86-64": "x86_64", "amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8": "aarch64"}

VersionKey = tuple[tuple[int, ...], int, int, int]


def parse_version(text: str) -> VersionKey | None:
    """A release as a key that sorts as the releases do; None when it is not a release number."""
    match = _VERSION.match(text or "") if isinstance(text, str) else None
    if match is None:
        return None
    nums = tuple(int(n) for n in match["nums"].split("."))
    while len(nums) > 1 and nums[-1] == 0:  # 13 == 13.0 == 13.0.0
        nums = nums[:-1]
    pre = _PRE[match["pre"].lower()] if match["pre"] else _FINAL
    pre_n = int(match["pren"] or 0)
    post = int(match["post"] or 0) + 1 if match["post"] is not None else 0
    return nums, pre, pre_n, post


def newer(a: str, b: str) -> bool:
    """``a`` is a later release than ``b`` (False when either is not a release number)."""
    ka, kb = parse_version(a), parse_version(b)
    return ka is not None and kb is not None and ka > kb


def release_in(version: str, spec: str) -> bool:
    """Whether ``version`` is in the range ``spec`` (see the module's words); an unreadable version
    is in ``"*"`` only."""
    if spec.strip() == "*":
        return True
    key = parse_version(version)
    if key is None:
        return False
    for part in spec.split(","):
        op, bound = _bound(part)
        other = parse_version(bound)
        assert other is not None  # _bound checked it
        if not {
            ">=": key >= other,
            ">": key > other,
            "<=": key <= other,
            "<": key < other,
            "==": key == other,
        }[op]:
            return False
    return True


def check_range(spec: object) -> str | None:
    """What is wrong with a range from the registry; None when it reads."""
    if not isinstance(spec, str) or not spec.strip():
        return f'must be a range such as ">=0.11, <0.20" or "*", not {spec!r}'
    if spec.strip() == "*":
        return None
    for part in spec.split(","):
        try:
            _bound(part)
        except ValueError as exc:
            return str(exc)
    return None


def _bound(part: str) -> tuple[str, str]:
    match = _BOUND.match(part)
    if match is None or parse_version(match[2]) is None:
        raise ValueError(f"{part.strip()!r} is not a bound such as >=0.11 or <0.20")
    return match[1], match[2]


def arch_name(text: str) -> str:
    """The architecture's one name: ``x86_64`` for x86-64 and amd64, ``aarch64`` for arm64."""
    low = (text or "").strip().lower()
    return _ARCH.get(low, low)


@dataclass(frozen=True)
class Floor:
    """What a node must have to run the engine's releases in ``releases``: each an empty string
    (or empty tuple) where the registry sets no floor. ``source`` is where the figures come from."""

    releases: str
    capability: str = ""
    driver: str = ""
    cuda: str = ""
    arch: tuple[str, ...] = ()
    source: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "releases": self.releases,
            "capability": self.capability,
            "driver": self.driver,
            "cuda": self.cuda,
            "arch": list(self.arch),
            "source": self.source,
        }


def floor_of(floors: tuple[Floor, ...], release: str) -> Floor | None:
    """The floor of ``release``: the first whose range holds it. A release not known (blank) takes
    the last one, the newest releases' (the registry lists them oldest first): the strictest a fleet
    is likely to meet, and the answer says the release was not known."""
    if not floors:
        return None
    if not release:
        return floors[-1]
    return next((f for f in floors if release_in(release, f.releases)), None)


@dataclass(frozen=True)
class NodeFacts:
    """What a node's agent reported of itself; ``known`` is False while it never has (then the other
    fields are empty and nothing is checked against them)."""

    node: str
    known: bool = False
    driver: str = ""
    cuda: str = ""
    arch: str = ""
    engines: Mapping[str, str] = field(default_factory=dict)


def node_refusal(
    engine: str, release: str, floor: Floor | None, facts: NodeFacts, *, capability: str = ""
) -> DomainError | None:
    """Why ``facts.node`` cannot run ``engine`` at ``release``: the first floor its facts fail
    (``capability``, ``driver``, ``cuda``, ``arch``, with the figures), or ``release_missing``
    (the release the profile runs is not installed there, naming both); None when it can, or when
    its facts are not known (``unknown_facts`` says so). ``capability`` is its cards'."""
    what = f"{engine} {release}" if release else engine
    if floor is not None and floor.capability and capability:
        have, need = parse_version(capability), parse_version(floor.capability)
        if have is not None and need is not None and have < need:
            return DomainError(
                "capability",
                f"{what} needs cards of compute capability {floor.capability} or newer; {facts.node}'s are "
                f"{capability}.",
                status=409,
            )
    if not facts.known:
        return None
    if floor is not None:
        if floor.driver and _below(facts.driver, floor.driver):
            return DomainError(
                "driver",
                f"{what} needs NVIDIA driver {floor.driver} or newer; {facts.node}'s agent reports driver "
                f"{facts.driver or 'none'}.",
                status=409,
            )
        if floor.cuda and _below(facts.cuda, floor.cuda):
            return DomainError(
                "cuda",
                f"{what} needs CUDA {floor.cuda} or newer; {facts.node}'s driver supports CUDA "
                f"{facts.cuda or 'none'}.",
                status=409,
            )
        if floor.arch and arch_name(facts.arch) not in {arch_name(a) for a in floor.arch}:
            return DomainError(
                "arch",
                f"{what} runs on {' or '.join(floor.arch)} machines only; {facts.node} is "
                f"{facts.arch or 'of an architecture its agent did not say'}.",
                status=409,
            )
    if release:
        installed = facts.engines.get(engine, "")
        if parse_version(installed) != parse_version(release) or not installed:
            there = f"has {engine} {installed} installed" if installed else f"has no {engine} installed"
            return DomainError(
                "release_missing",
                f"The profile runs {engine} {release}; {facts.node} {there}. Install it there, or choose the "
                "release the node has.",
                status=409,
            )
    return None


def unknown_facts(nodes: list[str]) -> str:
    """The note for nodes whose agents never reported their facts: their floors are not checked."""
    shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
    return (
        f"The driver, CUDA, architecture and installed engines of {shown} are not known (their agents have "
        "not reported them yet), so those floors and the release are not checked there."
    )


def _below(have: str, need: str) -> bool:
    """``have`` is older than ``need``, or not a version at all (a floor an unreadable figure
    cannot be shown to meet)."""
    a, b = parse_version(have), parse_version(need)
    return a is None or (b is not None and a < b)
