#!/usr/bin/env python3
"""A stand-in for an LLM engine (vLLM, SGLang, FreeToken, ...), standard library
only, so that the whole restart path runs on a machine without a GPU.

    python agent/standin_engine.py --port 8101 --served-model-name qwen-7b [real engine flags...]

It speaks just enough of an engine's HTTP API for the agent and a gateway:

- ``GET /health``: 200 ``{"status": "loading"}`` while it "loads" (as FreeToken
  does), then 200 ``{"status": "ok"}``;
- ``GET /v1/models``: ``{"object": "list", "data": [{"id": NAME, "object":
  "model", ...}], "standin": {"pid", "cuda_visible_devices", "argv", ...}}``;
  the model is listed only once loaded;
- ``POST /v1/chat/completions`` and ``POST /v1/completions``: an OpenAI-shaped
  answer echoing the last user message (the prompt), with usage counts; 503
  while loading; a body's ``standin_seconds`` (a number, at most 600) makes that
  request take so long, to have one in flight;
- ``GET /metrics``: vLLM's ``vllm:num_requests_running`` and
  ``vllm:num_requests_waiting`` gauges (Prometheus text), counting requests in
  flight (vllm/v1/metrics/loggers.py names them; docs/restarts.md);
- with ``VLLM_API_KEY`` set, ``/v1/*`` answer 401 without ``Authorization:
  Bearer <key>`` (as vLLM's ``--api-key`` does; ``/health`` and ``/metrics`` stay open);
- on SIGTERM it drains, as vLLM >= 0.18 with ``--shutdown-timeout`` does: new
  requests (and ``/health``) answer 503, the requests in flight finish, then it
  exits.

Arguments it does not know are ignored, so real engine flags pass through.
Behaviour comes (standin_args.py) from flags or, so that a profile's environment can drive it,
from variables (a flag wins):

  --port / LLMGW_REPLICA_PORT                 where to listen (127.0.0.1 unless --host)
  --served-model-name, --alias / LLMGW_SERVED_MODEL   the served name
  --load-seconds / STANDIN_LOAD_SECONDS       time spent "loading" (default 2), counted from the
                                              process's start (its interpreter's own start and
                                              imports are part of the load, as a real engine's are)
  --never-ready / STANDIN_NEVER_READY=1       stay loading forever
  --exit-at-start CODE / STANDIN_EXIT_AT_START   log a few lines, exit CODE before listening
  --crash-after SECONDS / STANDIN_CRASH_AFTER    exit 137 that long after starting
  --ignore-sigterm / STANDIN_IGNORE_SIGTERM=1    only SIGKILL stops it
  --generation-fails / STANDIN_GENERATION_FAILS=1  /health and /v1/models answer, every
                                                 completion fails (500): dead generation
  --play ENGINE [--play-release RELEASE]      print ENGINE's start-up memory lines at RELEASE
      (vllm, sglang, llamacpp, freetoken; a default release each) with figures that follow that
      engine's accounting for its cards and model ($STANDIN_GPU_DIR's cards.json and models.json),
      and hold that memory in the stand-in nvidia-smi (agent/standin_memory.py)
  STANDIN_MEMORY="weights=14.96,non_torch=0.35,activation=1.26,kv_cache=53.29,cuda_graph=0.64,
                  total=79.22,fraction=0.9,context=8192,sequences=13.3"
      print vLLM's start-up memory lines with these figures (GiB; the lines of
      vllm/worker/worker.py and model_runner.py, 0.6 to 0.8), so that the agent
      reads them as it reads a real engine's; without it, none are printed
  --nnodes N --node-rank R --master-addr A --master-port P [--headless]
      play rank R of a replica across N nodes (vLLM's rank flags, agent/standin_ranks.py):
      rank 0 waits at A:P for the others (STANDIN_JOIN_SECONDS, default 60) before it loads and
      serves; a rank > 0 joins it and serves nothing; a rank lost takes the group down
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time

import standin_http  # beside this file
from standin_args import Args, parse_args  # beside this file

# Not typing's own: importing typing costs a stand-in's start 2 ms of its CPU (mypy reads the name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CRASH_EXIT_CODE = 137


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"{stamp} standin[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def process_started() -> float:
    """When this process started, on ``time.monotonic``'s clock: its start time since boot
    (/proc/self/stat, in clock ticks) against CLOCK_BOOTTIME; now where /proc is not there."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()
    return time.monotonic() - max(age, 0.0)


class Engine:
    """What the HTTP handler needs to know about the running stand-in."""

    def __init__(self, args: Args, argv: list[str]):
        self.args = args
        self.argv = argv
        self.model = args.served_model_name
        # The load counts from the process's start, as a real engine's does (vLLM's imports and
        # its interpreter's start are part of its time to ready), not from this object's: a stand-in
        # started beside fifteen others on a busy machine would otherwise load for its interpreter's
        # start-up (0.1-0.5 s of CPU contention) more than it was told.
        self.started = process_started()
        self.api_key = os.environ.get("VLLM_API_KEY", "")
        self.flight = InFlight()

    @property
    def loaded(self) -> bool:
        return not self.args.never_ready and time.monotonic() - self.started >= self.args.load_seconds


class StandinHandler(standin_http.Handler):
    server_version = "llmgw-standin/0.1"
    engine: Engine  # set on the subclass made in main()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._metrics()
            return
        if path.startswith("/v1/") and not self._authorized():
            return
        if path == "/health" and self.engine.flight.draining:
            self._json(503, {"status": "shutting down"})
        elif path == "/health":
            self._json(200, {"status": "ok" if self.engine.loaded else "loading"})
        elif path == "/v1/models":
            data = (
                [{"id": self.engine.model, "object": "model", "owned_by": "llmgw-standin"}]
                if self.engine.loaded
                else []
            )
            self._json(200, {"object": "list", "data": data, "standin": self._facts()})
        else:
            self._json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        if not self._authorized():
            return
        if not self.engine.flight.enter():
            self._json(503, {"error": {"message": "the server is shutting down", "type": "unavailable"}})
            return
        try:
            self._complete(path, raw)
        finally:
            self.engine.flight.leave()

    def _complete(self, path: str, raw: bytes) -> None:
        if not self.engine.loaded:
            self._json(503, {"error": {"message": "the model is still loading", "type": "unavailable"}})
            return
        try:
            body = json.loads(raw or b"{}")
            if path == "/v1/completions":
                body["messages"] = [{"role": "user", "content": _text(body.get("prompt", ""))}]
            messages = body.get("messages", [])
            assert isinstance(messages, list)
        except (ValueError, AssertionError, AttributeError, TypeError):
            self._json(
                400,
                {
                    "error": {
                        "message": "body must be JSON with a messages list (a prompt for /v1/completions)",
                        "type": "invalid_request_error",
                    }
                },
            )
            return
        if body.get("model") not in (None, self.engine.model):
            self._json(
                404,
                {
                    "error": {
                        "message": f"model {body.get('model')!r} is not served here",
                        "type": "not_found",
                    }
                },
            )
            return
        prompt = " ".join(_text(m.get("content")) for m in messages if isinstance(m, dict))
        last_user = next(
            (
                _text(m.get("content"))
                for m in reversed(messages)
                if isinstance(m, dict) and m.get("role") == "user"
            ),
            "",
        )
        if self.engine.args.generation_fails:
            self._json(500, {"error": {"message": GENERATION_FAILURE, "type": "internal_server_error"}})
            return
        take_time(body.get("standin_seconds"))
        answer = f"echo: {last_user}"
        prompt_tokens, completion_tokens = len(prompt.split()), len(answer.split())
        finish = "stop"
        limit = body.get("max_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < completion_tokens:
            answer, completion_tokens, finish = " ".join(answer.split()[:limit]), limit, "length"
        choice: dict[str, Any] = (
            {"index": 0, "text": answer, "finish_reason": finish}
            if path == "/v1/completions"
            else {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": finish}
        )
        import uuid  # here, not at the start: a stand-in's start is part of its load

        self._json(
            200,
            {
                "id": f"{'cmpl' if path == '/v1/completions' else 'chatcmpl'}-{uuid.uuid4().hex[:24]}",
                "object": "text_completion" if path == "/v1/completions" else "chat.completion",
                "created": int(time.time()),
                "model": self.engine.model,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            },
        )

    def _authorized(self) -> bool:
        """With a key (VLLM_API_KEY), as vLLM's --api-key: a request without it answers 401."""
        key = self.engine.api_key
        if not key or self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    def _metrics(self) -> None:
        payload = metrics_text(self.engine.model, self.engine.flight.running).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _facts(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "argv": self.engine.argv,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "replica_id": os.environ.get("LLMGW_REPLICA_ID"),
            "loaded": self.engine.loaded,
        }

    def _json(self, status: int, body: Any) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


# -- readiness by generation and stops that drain (issue 23) ---------------------------------------

GENERATION_FAILURE = (
    "stand-in told to fail generation (STANDIN_GENERATION_FAILS): CUDA error: an illegal memory access"
)
MAX_REQUEST_SECONDS = 600.0


class InFlight:
    """The requests being answered, and whether the stand-in is draining (refusing new ones)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.running = 0
        self.draining = False

    def enter(self) -> bool:
        """Count a request in; False (refuse it) once draining."""
        with self._cond:
            if self.draining:
                return False
            self.running += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self.running -= 1
            self._cond.notify_all()

    def drain(self) -> int:
        """Refuse new requests and wait until those in flight are answered; how many there were."""
        with self._cond:
            self.draining = True
            had = self.running
            while self.running:
                self._cond.wait()
            return had


def take_time(seconds: Any) -> None:
    """A request that asked for ``standin_seconds`` takes that long (bounded), to be in flight."""
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
        time.sleep(min(float(seconds), MAX_REQUEST_SECONDS))


def metrics_text(model: str, running: int) -> str:
    """vLLM's scheduler gauges, as its /metrics serves them (Prometheus text format)."""
    label = json.dumps(model)
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name={label}}} {float(running)}\n'
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name={label}}} 0.0\n'
    )


def say_when_loaded(engine: Engine) -> None:
    """A line in the log the moment the model is loaded, as an engine's server logs its start once
    it serves (the agent probes a replica as soon as its log grows)."""
    left = engine.args.load_seconds - (time.monotonic() - engine.started)
    timer = threading.Timer(max(left, 0.0) + 0.001, log, (f"loaded: serving {engine.model}",))
    timer.daemon = True
    timer.start()


def drain_then_shutdown(engine: Engine, server: standin_http.Server) -> None:
    """On SIGTERM: refuse new requests, let those in flight finish, then stop serving."""
    had = engine.flight.running
    if had:
        log(f"draining: {had} request(s) in flight; new requests are refused")
    engine.flight.drain()
    if had:
        log("drained: every request in flight was answered")
    server.shutdown()


def _held_file(directory: str, entry: dict[str, Any]) -> str:
    """Write what this process holds where the stand-in nvidia-smi reads it; the file's path."""
    path = os.path.join(directory, f"proc-{os.getpid()}.json")
    with open(path, "w") as held:
        held.write(json.dumps(entry))
    return path


def hold_card_memory(unknown: list[str]) -> str | None:
    """Where the stand-in nvidia-smi runs (``$STANDIN_GPU_DIR``), say which cards this process holds
    memory on, as vLLM would: its ``--gpu-memory-utilization`` of each (0.9, vLLM's default)."""
    directory = os.environ.get("STANDIN_GPU_DIR", "").strip()
    cards = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not directory or not cards:
        return None
    fraction = 0.9
    for i, arg in enumerate(unknown):
        value = arg.split("=", 1)[1] if arg.startswith("--gpu-memory-utilization=") else None
        if arg == "--gpu-memory-utilization" and i + 1 < len(unknown):
            value = unknown[i + 1]
        if value is not None:
            with contextlib.suppress(ValueError):
                fraction = float(value)
    entry = {"pid": os.getpid(), "cards": [int(c) for c in cards.split(",") if c.strip().isdigit()]}
    return _held_file(directory, {**entry, "fraction": fraction, "name": "python3 standin_engine.py"})


def play_startup(args: Args, unknown: list[str]) -> str | None:
    """The start-up memory lines of the engine and release it plays, and that memory held on its
    cards for the stand-in nvidia-smi; as ``hold_card_memory`` when it knows too little to play.
    Without stand-in cards (no $STANDIN_GPU_DIR, or no card given) there is nothing to play, and
    standin_memory is not imported: its import is 14 ms of a stand-in's start."""
    if (
        not os.environ.get("STANDIN_GPU_DIR", "").strip()
        or not os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    ):
        return None
    import standin_memory  # beside this file

    release = args.play_release or standin_memory.DEFAULT_RELEASES.get(args.play, "")
    played = standin_memory.startup(args.play, release, unknown, os.getpid())
    if not played.held_mib:
        return hold_card_memory(unknown)
    log(f"playing {args.play} {release}".rstrip())
    for line in played.lines:
        log(line)
    entry = {
        "pid": os.getpid(),
        "cards": sorted(played.held_mib),
        "used_mib": {str(card): mib for card, mib in played.held_mib.items()},
        "name": f"python3 standin_engine.py ({args.play})",
    }
    return _held_file(os.environ["STANDIN_GPU_DIR"].strip(), entry)


def crash_later(args: Args) -> None:
    """With --crash-after: exit 137 that long from now, as an engine that hit a CUDA error."""
    if args.crash_after is None:
        return

    def crash() -> None:
        log(f"fatal: simulated crash after {args.crash_after:g}s (CUDA error: an illegal memory access)")
        os._exit(CRASH_EXIT_CODE)

    timer = threading.Timer(args.crash_after, crash)
    timer.daemon = True
    timer.start()


def run_headless(args: Args, unknown: list[str]) -> int:
    """A rank > 0 that joined its group: it serves nothing and binds no port; it holds its
    cards until SIGTERM (or its group breaks up: standin_ranks ends the process then)."""
    stop = threading.Event()
    if not args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    crash_later(args)
    held = play_startup(args, unknown)
    log("headless: serving nothing; holding this rank's cards until stopped")
    with contextlib.suppress(KeyboardInterrupt):
        while not stop.wait(0.5):
            pass
    if held is not None:
        with contextlib.suppress(OSError):
            os.unlink(held)
    log("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, unknown = parse_args(argv)
    log(
        f"starting: argv={json.dumps([sys.argv[0], *argv])} "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')} "
        f"model={args.served_model_name} port={args.port}"
    )
    if unknown:
        log(f"ignoring engine arguments: {' '.join(unknown)}")

    if args.exit_at_start is not None:
        log("loading weights ...")
        log("error: stand-in told to fail at start (STANDIN_EXIT_AT_START)")
        log(f"exiting with code {args.exit_at_start}")
        return args.exit_at_start

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: log("SIGTERM received and ignored"))

    if any(arg == "--nnodes" or arg.startswith("--nnodes=") for arg in unknown):
        # Imported only for a replica across nodes: an engine's start is a stand-in's load
        # time, and a fleet's benchmark starts many of them on the machine that it measures.
        import standin_ranks  # beside this file

        try:
            group = standin_ranks.group_of(unknown)
            link = (
                None if group is None else standin_ranks.rendezvous(group, standin_ranks.join_seconds(), log)
            )
        except (ValueError, standin_ranks.RendezvousFailed) as exc:
            log(f"error: {exc}")
            return standin_ranks.EXIT_CODE
        if link is not None:
            link.watch(log)
            if link.group.headless:
                return run_headless(args, unknown)

    engine = Engine(args, [sys.argv[0], *argv])
    handler = type("Handler", (StandinHandler,), {"engine": engine})
    try:
        server = standin_http.Server((args.host, args.port), handler)
    except OSError as exc:
        log(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return 1

    if not args.ignore_sigterm:

        def on_sigterm(*_: Any) -> None:
            log("SIGTERM received; shutting down")
            threading.Thread(target=drain_then_shutdown, args=(engine, server), daemon=True).start()

        signal.signal(signal.SIGTERM, on_sigterm)

    crash_later(args)

    if os.environ.get("HF_TOKEN"):
        # As an engine that logs its settings, secrets and all, would: what the agent must redact,
        # as it is and as an engine may print it (a header base64'd, upper-cased, wrapped).
        token = os.environ["HF_TOKEN"]
        log(f"logging in to the Hugging Face Hub with token {token}")
        import base64  # here: only this path needs it

        header = base64.b64encode(f"Authorization: Bearer {token}".encode()).decode()
        log(f"request headers (base64): {header}")
        log(f"TOKEN IN CAPITALS: {token.upper()}")
        half = len(token) // 2
        log(f"a wrapped line: {token[:half]}")
        log(f"{token[half:]} (its end)")
    memory = os.environ.get("STANDIN_MEMORY", "").strip()
    if memory:
        import standin_memory  # beside this file

        for line in standin_memory.given_lines(memory):
            log(line)
        held = hold_card_memory(unknown)
    else:
        held = play_startup(args, unknown)
    if not args.never_ready:
        say_when_loaded(engine)
    state = "never ready" if args.never_ready else f"ready in {args.load_seconds:g}s"
    if args.generation_fails:
        state += ", every completion failing"
    log(f"listening on {args.host}:{args.port}, serving {args.served_model_name} ({state})")
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    server.server_close()
    if held is not None:
        with contextlib.suppress(OSError):
            os.unlink(held)
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
