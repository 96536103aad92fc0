"""The launch policy (agent/llmgw_policy) on its own, and the two sides that
apply it: generated spellings of every refused flag, and a differential test
that the catalog's verdict and the agent's agree for every engine."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmgw_agent.spec import AgentError, parse_spec
from llmgw_policy import check_profile, check_spec, default_policy

from planning import engines

POLICY = default_policy()
ENGINES = sorted(POLICY.engines)


def _sample_value(rule) -> str:
    """A value the rule accepts."""
    if rule.kind == "int":
        return str(int(max(rule.minimum if rule.minimum is not None else 1, 1)))
    if rule.kind == "float":
        low = rule.minimum if rule.minimum is not None else 0.0
        high = rule.maximum if rule.maximum is not None else low + 1
        return str(round((low + high) / 2, 3))
    if rule.kind == "choice":
        return rule.choices[0]
    if rule.kind == "bool":
        return "1"
    if rule.kind == "token":
        return "tok-123456"
    if rule.kind == "json":
        key, kind = next(iter(rule.keys.items()))
        sample = {"int": 1, "float": 0.5, "bool": True, "name": "ngram", "int_list": [1, 2]}[kind]
        import json

        return json.dumps({key: sample})
    return "hermes"


def _allowed_pairs(eng) -> list[list[str]]:
    out = []
    for spelling, target in eng.aliases.items():
        rule = eng.args[target]
        out.append([spelling] if rule.kind == "switch" else [spelling, _sample_value(rule)])
    return out


def _danger(eng) -> list[str]:
    """Flags a profile may never name: the refused ones and the launcher's own
    (but the context flag, which the context operation writes)."""
    return [f for f in (*eng.refused, *eng.owned) if f not in eng.context_flags]


def _spellings(eng, flag: str) -> st.SearchStrategy[str]:
    """Spellings this engine's parser reads as ``flag``."""
    options = [st.just(flag)]
    body = flag[2:] if flag.startswith("--") else None
    if body and eng.underscores_as_dashes and "-" in body:
        # Any mix of "_" and "-" between the words (vLLM, llama.cpp).
        words = body.split("-")
        options.append(
            st.lists(st.sampled_from("-_"), min_size=len(words) - 1, max_size=len(words) - 1).map(
                lambda seps: "--" + "".join(w + s for w, s in zip(words, [*seps, ""], strict=True))
            )
        )
    if body and eng.abbreviations and len(body) > 2:
        known = {eng.canonical(f) for f in (*eng.aliases, *eng.owned, *eng.refused)}
        prefixes = [flag[:n] for n in range(4, len(flag)) if eng.canonical(flag[:n]) not in known]
        if prefixes:
            options.append(st.sampled_from(prefixes))
    return st.one_of(options)


def _refusal_names(eng, refusals, written: str) -> bool:
    return any(r.subject in (written, written.split("=", 1)[0]) for r in refusals)


@pytest.mark.parametrize("name", ENGINES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_spelling_the_engine_reads_as_a_refused_flag_is_refused(name, data):
    eng = POLICY.engines[name]
    flag = data.draw(st.sampled_from(_danger(eng)), label="flag")
    spelling = data.draw(_spellings(eng, flag), label="spelling")
    allowed = _allowed_pairs(eng)
    before = data.draw(st.lists(st.sampled_from(allowed), max_size=3), label="before") if allowed else []
    after = data.draw(st.lists(st.sampled_from(allowed), max_size=3), label="after") if allowed else []
    joined = eng.equals and data.draw(st.booleans(), label="joined")
    occurrence = [f"{spelling}=x1"] if joined else [spelling, "x1"]
    repeated = data.draw(st.booleans(), label="repeated")
    args = [*sum(before, []), *occurrence, *sum(after, []), *(occurrence if repeated else [])]

    refusals = check_profile(POLICY, name, args, {})

    written = occurrence[0]
    assert refusals, args
    assert _refusal_names(eng, refusals, written), (args, [r.sentence for r in refusals])


@pytest.mark.parametrize("name", ENGINES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_spellings_of_allowed_flags_the_engine_reads_pass(name, data):
    eng = POLICY.engines[name]
    pairs = _allowed_pairs(eng)
    if not pairs:
        return
    chosen = data.draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=6), label="pairs")
    args: list[str] = []
    for pair in chosen:
        flag = pair[0]
        if eng.underscores_as_dashes and flag.startswith("--") and data.draw(st.booleans()):
            flag = "--" + flag[2:].replace("-", "_")
        if len(pair) == 2 and eng.equals and data.draw(st.booleans()):
            args.append(f"{flag}={pair[1]}")
        else:
            args += [flag, *pair[1:]]
    assert check_profile(POLICY, name, args, {}) == [], args


# -- the differential: the catalog's verdict and the agent's ---------------------------------

_names = st.text(string.ascii_uppercase + "_", min_size=1, max_size=12)


def _vocabulary(eng) -> list[str]:
    words = [*eng.aliases, *eng.owned, *eng.refused, *eng.context_flags]
    words += [w.replace("-", "_") for w in words if w.startswith("--")]
    words += [w[: max(3, len(w) - 3)] for w in words if w.startswith("--")]
    words += [
        "1",
        "8",
        "-1",
        "0.5",
        "auto",
        "fp8",
        "hermes",
        "/etc/passwd",
        "http://x",
        "{}",
        '{"model": "x"}',
    ]
    return sorted(set(words))


def _env_vocabulary(eng) -> list[str]:
    names = [*POLICY.env, *eng.env, *eng.refused_env, *eng.owned_env, *POLICY.agent_env]
    names += [n.rstrip("*") + "X" for n in (*POLICY.refused_env, *eng.refused_env) if n.endswith("*")]
    names += [n for n in POLICY.refused_env if not n.endswith("*")]
    names += ["LLMGW_X", "FOO", "NOT A NAME", "1BAD"]
    return sorted(set(names))


@st.composite
def profiles(draw, name: str):
    eng = POLICY.engines[name]
    words = _vocabulary(eng)
    tokens = st.one_of(
        st.sampled_from(words),
        st.builds(lambda a, b: f"{a}={b}", st.sampled_from(words), st.sampled_from(words)),
        st.text(string.printable, max_size=8),
    )
    args = draw(st.lists(tokens, max_size=12))
    values = st.one_of(
        st.sampled_from(["1", "0", "true", "INFO", "8", "tok-123456", "/tmp", "a b", ""]),
        st.text(max_size=6),
    )
    env = draw(st.dictionaries(st.one_of(st.sampled_from(_env_vocabulary(eng)), _names), values, max_size=5))
    return args, env


def _catalog_verdict(name: str, args: list[str], env: dict[str, str]) -> list[str]:
    """What the control plane says when a profile is saved (validate_profile_spec's rule)."""
    return [r.subject for r in engines.refusals(engines.engine(name), args, env)]


def _agent_verdict(name: str, args: list[str], env: dict[str, str]) -> list[str]:
    """What the agent says of the spec the control plane would send (its own parse and check)."""
    body = {
        "engine": name,
        "model": "m",
        "args": engines.launch_args(
            engines.engine(name), source="org/m", port=8123, model="m", tp=1, args=args
        ),
        "env": env,
        "cards": [0],
        "port": 8123,
    }
    try:
        spec = parse_spec(body)
    except AgentError as exc:
        return [f"invalid_spec: {exc.detail}"]
    refusals = check_spec(POLICY, name, list(spec.args), list(spec.env), port=spec.port, model=spec.model)
    return [r.subject for r in refusals]


@pytest.mark.parametrize("name", ENGINES)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_catalog_and_the_agent_agree_on_every_generated_profile(name, data):
    args, env = data.draw(profiles(name))
    catalog = _catalog_verdict(name, args, env)
    agent = _agent_verdict(name, args, env)
    if agent and agent[0].startswith("invalid_spec"):
        # The spec's shape check (a NUL, a bad variable name) comes first at the agent:
        # the catalog refuses the same profile for the same variable or argument.
        assert catalog, (args, env, agent)
        return
    assert bool(catalog) == bool(agent), (args, env, catalog, agent)
    assert catalog == agent, (args, env)


# -- examples --------------------------------------------------------------------------------


def test_the_policy_has_a_source_for_every_allowed_entry():
    for eng in POLICY.engines.values():
        assert eng.version
        for flag, rule in eng.args.items():
            assert rule.source, (eng.name, flag)
        for var, rule in eng.env.items():
            assert rule.source, (eng.name, var)
    assert all(rule.source for rule in POLICY.env.values())


@pytest.mark.parametrize(
    ("name", "args"),
    [
        # what operators commonly tune, as the demo and the tests' profiles do
        ("vllm", ["--max-num-seqs", "64", "--gpu-memory-utilization", "0.9", "--kv-cache-dtype", "fp8"]),
        ("vllm", ["--enable-prefix-caching", "--enable-chunked-prefill", "--enforce-eager", "-q", "awq"]),
        (
            "vllm",
            ["--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3"],
        ),
        ("vllm", ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']),
        ("vllm", ["--max_num_batched_tokens=8192", "--uvicorn-log-level", "warning"]),
        (
            "sglang",
            ["--mem-fraction-static", "0.85", "--chunked-prefill-size", "-1", "--disable-radix-cache"],
        ),
        (
            "sglang",
            ["--tool-call-parser", "qwen25", "--reasoning-parser", "deepseek-r1", "--log-level", "info"],
        ),
        (
            "trtllm",
            ["--backend", "pytorch", "--max_batch_size", "64", "--kv_cache_free_gpu_memory_fraction", "0.9"],
        ),
        ("llamacpp", ["-ngl", "99", "-fa", "on", "-ctk", "q8_0", "--parallel", "4", "--jinja", "--metrics"]),
        ("llamacpp", ["--n_gpu_layers", "99", "--cont-batching", "--cache_type_v", "q8_0"]),
        ("freetoken", ["--max-seq-len-override", "8192"]),
    ],
)
def test_ordinary_tuning_passes(name, args):
    assert check_profile(POLICY, name, args, {"HF_HUB_OFFLINE": "1", "NCCL_DEBUG": "WARN"}) == []


def test_the_context_flag_is_allowed_once_up_to_the_models_length():
    ok = check_profile(POLICY, "vllm", ["--max-model-len", "8192"], {}, context_max=131072)
    twice = check_profile(POLICY, "vllm", ["--max-model-len", "8192", "--max_model_len", "4096"], {})
    above = check_profile(POLICY, "vllm", ["--max-model-len", "262144"], {}, context_max=131072)
    launcher_only = check_profile(POLICY, "vllm", ["--max-model-len", "8192"], {}, context=False)
    assert ok == []
    assert "twice" in twice[0].sentence
    assert "above the model's context length, 131072" in above[0].sentence
    assert "context operation" in launcher_only[0].sentence


@pytest.mark.parametrize(
    "args",
    [["-fa", "on"], ["-fa", "off"], ["-fa", "auto"], ["--flash-attn", "off"], ["--flash_attn", "auto"]],
)
def test_llamacpp_flash_attention_takes_on_off_or_auto(args):
    # common/arg.cpp at ggml-org/llama.cpp 145b6280: -fa, --flash-attn [on|off|auto] (sources.flash_attn).
    assert check_profile(POLICY, "llamacpp", args, {}) == []


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["-fa"], "-fa is refused for llamacpp: it needs a value (one of on, off, auto), and none follows."),
        (
            ["-fa", "--jinja"],
            "-fa is refused for llamacpp: its value '--jinja' looks like a flag; "
            "give it a value (one of on, off, auto).",
        ),
        (["-fa", "maybe"], "-fa is refused for llamacpp: its value 'maybe' must be one of on, off, auto."),
        (
            ["--flash-attn=off"],
            "--flash-attn=off is refused for llamacpp: its parser does not split --flag=value "
            "(it would read the whole token as a flag); write --flash-attn and its value as two arguments.",
        ),
    ],
)
def test_llamacpp_flash_attention_without_one_of_its_values_is_refused(args, sentence):
    # A bare -fa would take the next argument as its value on a current build, and
    # common_params_parse_ex looks "--flash-attn=off" up whole ("invalid argument").
    assert [r.sentence for r in check_profile(POLICY, "llamacpp", args, {})] == [sentence]


def test_a_secret_value_is_never_echoed_in_a_refusal():
    (refusal,) = check_profile(POLICY, "vllm", [], {"VLLM_API_KEY": "sk secret with spaces"})
    assert "sk secret" not in refusal.sentence and "(secret)" in refusal.sentence


def test_docs_engine_policy_lists_exactly_what_the_policy_file_says():
    from pathlib import Path

    from llmgw_policy.__main__ import markdown

    page = (Path(__file__).resolve().parents[2] / "docs" / "engine-policy.md").read_text()
    assert page.endswith(markdown(POLICY)), "regenerate the tables: cd agent && python3 -m llmgw_policy"
