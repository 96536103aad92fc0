"""What the agent reports of its node (GET /v1/node): the engines installed with their releases, the
driver and the CUDA version nvidia-smi reports, and the machine's architecture.

- An engine's release: the configuration's ``version`` when it declares one (the stand-in, an engine
  installed where the agent cannot look); else, for an engine published as a Python package (vLLM,
  SGLang, TensorRT-LLM, FreeToken), the installed package's metadata read by the engine's own Python
  (``importlib.metadata.version``; the Python is the configuration's ``python``, the engine's command
  when it is a Python, or the interpreter its script's ``#!`` line names); for llama.cpp, what
  ``llama-server --version`` prints (``version: 5000 (abc1234)``: build b5000). What cannot be read is
  left out, with why in ``facts_errors``: never guessed.
- Driver and CUDA: ``nvidia-smi --version`` (driver 550 and later print ``DRIVER version`` and
  ``CUDA Version``, the latter the newest CUDA the driver supports). Left empty when it does not answer.
- Architecture: the configuration's ``arch`` when it declares one (a stand-in node), else
  ``platform.machine()``.

Answers are kept for ``TTL`` seconds: an upgrade shows within a minute, and a poll stays cheap.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from .config import AgentConfig, EngineConfig

TTL = 60.0
TIMEOUT = 20.0
# Each engine's package on the package index, where it is published as one (the control plane's
# registry, planning/engines.toml, names the same). llama.cpp is not: its binary says its build.
PACKAGES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt-llm", "freetoken": "freetoken"}
BINARY_VERSION = {"llamacpp"}
_METADATA = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
_LLAMA_VERSION = re.compile(r"version:\s*(\d+)")
_SMI_DRIVER = re.compile(r"^\s*DRIVER version\s*:\s*(\S+)", re.IGNORECASE | re.MULTILINE)
_SMI_CUDA = re.compile(r"^\s*CUDA Version\s*:\s*(\S+)", re.IGNORECASE | re.MULTILINE)


class NodeFacts:
    """The node's facts, worked out at most once every ``TTL`` seconds."""

    def __init__(self, config: AgentConfig):
        self.config = config
        self._lock = threading.Lock()
        self._at = 0.0
        self._answer: dict[str, Any] = {}

    def get(self) -> dict[str, Any]:
        with self._lock:
            if not self._answer or time.monotonic() - self._at > TTL:
                self._answer = gather(self.config)
                self._at = time.monotonic()
            return dict(self._answer)


def gather(config: AgentConfig) -> dict[str, Any]:
    errors: list[str] = []
    engines: dict[str, str] = {}
    for name, engine in sorted(config.engines.items()):
        version, problem = engine_version(name, engine)
        if version:
            engines[name] = version
        elif problem:
            errors.append(f"{name}: {problem}")
    driver, cuda, problem = driver_and_cuda()
    if problem:
        errors.append(f"nvidia-smi: {problem}")
    return {
        "driver_version": driver,
        "cuda_version": cuda,
        "arch": config.arch or platform.machine(),
        "engines": engines,
        "facts_errors": errors,
    }


def _run(command: list[str]) -> tuple[str, str]:
    """What ``command`` printed (stdout and stderr together), or why it did not run ("", reason)."""
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"{command[0]} did not run ({exc})"
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return "", f"{Path(command[0]).name} exited with {done.returncode}: {said[-1][:200] if said else ''}"
    return done.stdout + done.stderr, ""


def engine_version(name: str, engine: EngineConfig) -> tuple[str, str]:
    """The engine's installed release, or ("", why it is not known)."""
    if engine.version:
        return engine.version, ""
    if name in BINARY_VERSION:
        binary = shutil.which(engine.command[0])
        if binary is None:
            return "", f"{engine.command[0]} is not on the PATH"
        out, problem = _run([binary, "--version"])
        match = _LLAMA_VERSION.search(out)
        if problem or match is None:
            return "", problem or f"{engine.command[0]} --version did not say its build"
        return f"b{match[1]}", ""
    package = engine.package or PACKAGES.get(name, "")
    if not package:
        return "", "no package to read the release of: set version or package in its [engines] table"
    python = engine.python or _python_of(engine.command[0])
    if not python:
        return "", f"cannot tell which Python runs {engine.command[0]}: set python in its [engines] table"
    out, problem = _run([python, "-c", _METADATA, package])
    if problem:
        return "", f"package {package} is not installed for {python} ({problem})"
    return out.strip().splitlines()[-1].strip() if out.strip() else "", ""


def _python_of(program: str) -> str:
    """The Python that runs ``program``: itself when it is one, else its script's ``#!`` interpreter."""
    path = shutil.which(program)
    if path is None:
        return ""
    if Path(path).name.startswith("python"):
        return path
    try:
        with open(path, "rb") as fh:
            first = fh.readline(500).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    if not first.startswith("#!"):
        return ""
    parts = first[2:].split()
    if parts and Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1]) or ""
    return parts[0] if parts and os.access(parts[0], os.X_OK) else ""


def driver_and_cuda() -> tuple[str, str, str]:
    """(driver, CUDA, problem) from ``nvidia-smi --version``."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return "", "", "not on the PATH"
    out, problem = _run([binary, "--version"])
    if problem:
        return "", "", problem
    driver, cuda = _SMI_DRIVER.search(out), _SMI_CUDA.search(out)
    if driver is None:
        return "", "", "--version printed no DRIVER version line (a driver older than 550?)"
    return driver[1], cuda[1] if cuda else "", ""
