"""The engine registry: its data, its checks, refusals and the launch line.

The refusals and the launch line come from the launch policy
(agent/llmgw_policy); tests/policy/test_launch_policy.py tests it on its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from base.errors import DomainError
from planning.engines import (
    RegistryError,
    context_arg,
    engine,
    int_value,
    launch_args,
    load_registry,
    parse_capability,
    refused,
    registry,
    spelling_of,
    with_context,
)


@pytest.mark.parametrize(
    ("name", "spread", "tp_flag", "context_flag", "capability", "budget_flag", "experts_on_card"),
    [
        (
            "vllm",
            "tensor",
            "--tensor-parallel-size",
            "--max-model-len",
            "7.0",
            "--gpu-memory-utilization",
            True,
        ),
        ("sglang", "tensor", "--tp-size", "--context-length", "7.5", "--mem-fraction-static", True),
        (
            "trtllm",
            "tensor",
            "--tp_size",
            "--max_seq_len",
            "8.0",
            "--kv_cache_free_gpu_memory_fraction",
            True,
        ),
        ("llamacpp", "layers", None, "--ctx-size", "5.0", None, True),
        ("freetoken", "single", None, "--max-seq-len-override", "8.0", None, False),
    ],
)
def test_the_registry_holds_each_engine(
    name, spread, tp_flag, context_flag, capability, budget_flag, experts_on_card
):
    eng = engine(name)
    assert eng.spread == spread
    assert eng.tp_flag == tp_flag
    assert eng.context_flags[0] == context_flag
    assert eng.min_capability == capability
    assert eng.memory.budget_flag == budget_flag
    assert eng.memory.version and eng.memory.sources["weights"] and eng.memory.sources["kv"]
    assert eng.experts_on_card is experts_on_card


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("vllm", {"--tensor-parallel-size", "-tp"}),
        ("sglang", {"--tp-size", "--tensor-parallel-size", "--tp"}),
        ("trtllm", {"--tp_size", "--tensor_parallel_size"}),
        ("llamacpp", {"--tensor-split", "-ts"}),
    ],
)
def test_each_engine_lists_its_tp_spellings(name, flags):
    assert flags <= set(engine(name).tp_flags)


def test_llamacpp_reads_both_context_spellings():
    assert set(engine("llamacpp").context_flags) == {"--ctx-size", "-c"}


def test_an_unknown_engine_is_refused_naming_the_known_ones():
    with pytest.raises(DomainError) as caught:
        engine("tgi")
    assert caught.value.code == "unknown_engine"
    assert caught.value.status == 400
    for name in ("vllm", "sglang", "trtllm", "llamacpp", "freetoken"):
        assert name in caught.value.message


def test_registry_is_loaded_once():
    assert registry() is registry()


# -- refusals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args", "refused_flag"),
    [
        ("vllm", ["--trust-remote-code"], "--trust-remote-code"),
        ("vllm", ["--chat-template", "/etc/t.jinja"], "--chat-template"),
        ("vllm", ["--chat-template=/etc/t.jinja"], "--chat-template"),
        ("vllm", ["--download-dir", "/data"], "--download-dir"),
        ("vllm", ["--tokenizer", "/other"], "--tokenizer"),
        ("vllm", ["--config", "x.yaml"], "--config"),
        # vLLM folds "_" into "-", and argparse takes an unambiguous prefix
        ("vllm", ["--trust_remote_code"], "--trust_remote_code"),
        ("vllm", ["--trust-remote"], "--trust-remote"),
        ("sglang", ["--chat-template", "x"], "--chat-template"),
        ("sglang", ["--trust-remote-code"], "--trust-remote-code"),
        ("sglang", ["--download-dir=/d"], "--download-dir"),
        ("trtllm", ["--trust_remote_code"], "--trust_remote_code"),
        ("trtllm", ["--extra_llm_api_options", "x.yaml"], "--extra_llm_api_options"),
        ("llamacpp", ["--model-url", "https://x"], "--model-url"),
        ("llamacpp", ["-mu", "https://x"], "-mu"),
        ("llamacpp", ["-hf", "org/repo"], "-hf"),
        ("llamacpp", ["--hf-repo=org/repo"], "--hf-repo"),
        ("llamacpp", ["-hff", "f.gguf"], "-hff"),
        ("llamacpp", ["--hf-file", "f.gguf"], "--hf-file"),
        ("llamacpp", ["--chat-template-file", "t.jinja"], "--chat-template-file"),
        ("llamacpp", ["--lora", "a.gguf"], "--lora"),
        ("freetoken", ["--model-source", "modelscope"], "--model-source"),
    ],
)
def test_refused_names_each_refused_argument(name, args, refused_flag):
    # The allowlist refuses "--port-ish" too (it is on no engine's list): one
    # sentence each, the refused flag's naming why it is dangerous.
    sentences = refused(engine(name), ["--port-ish", "1", *args], {})
    assert len(sentences) == 2
    assert sentences[0].startswith(f"--port-ish is refused for {name}")
    assert "not on" in sentences[0]
    assert sentences[1].startswith(f"{refused_flag} is refused for {name}")
    assert any(
        words in sentences[1]
        for words in (
            "reads",
            "fetches",
            "runs",
            "imports",
            "names",
            "loads",
            "offloads",
            "downloads",
            "read as",
        )
    ), sentences[1]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        (
            "vllm",
            ["--max-model-len", "8192", "--no-trust-remote-code", "--chat-template-content-format", "auto"],
        ),
        ("vllm", ["--tokenizer-mode", "slow", "--config-format", "hf"]),
        ("llamacpp", ["-c", "4096", "-ngl", "99"]),
        ("freetoken", ["--max-seq-len-override", "65536"]),
    ],
)
def test_refused_passes_ordinary_arguments(name, args):
    assert refused(engine(name), args, {}) == []


@pytest.mark.parametrize(
    ("name", "args", "flag", "not_read_as"),
    [
        # llama.cpp does not take abbreviations: "--lo" is not "--lora" (it is on no list either)
        ("llamacpp", ["-c", "4096", "--lo", "x", "-ngl", "99"], "--lo", "--lora"),
        # trtllm-serve (click) does not fold "-" into "_"
        ("trtllm", ["--trust-remote-code-ish"], "--trust-remote-code-ish", "--trust_remote_code"),
    ],
)
def test_a_flag_on_no_list_is_refused_as_unlisted_not_misread(name, args, flag, not_read_as):
    (sentence,) = refused(engine(name), args, {})
    assert sentence.startswith(f"{flag} is refused for {name}: it is not on {name}'s list")
    assert not_read_as not in sentence


@pytest.mark.parametrize(
    ("name", "env", "refused_var"),
    [
        ("llamacpp", {"LLAMA_ARG_MODEL_URL": "https://x"}, "LLAMA_ARG_MODEL_URL"),
        ("llamacpp", {"LLAMA_ARG_HF_REPO": "org/r"}, "LLAMA_ARG_HF_REPO"),
        ("llamacpp", {"LLAMA_ARG_HF_FILE": "f"}, "LLAMA_ARG_HF_FILE"),
        ("llamacpp", {"LLAMA_ARG_CHAT_TEMPLATE_FILE": "t"}, "LLAMA_ARG_CHAT_TEMPLATE_FILE"),
        ("vllm", {"VLLM_PLUGINS": "evil"}, "VLLM_PLUGINS"),
        ("freetoken", {"FREETOKEN_CACHE_DIR": "/c"}, "FREETOKEN_CACHE_DIR"),
        ("freetoken", {"FREETOKEN_MODEL_PATH": "/m"}, "FREETOKEN_MODEL_PATH"),
        ("freetoken", {"FREETOKEN_CONFIG": "/c"}, "FREETOKEN_CONFIG"),
        # by prefix
        ("freetoken", {"FREETOKEN_KERNEL_CACHE_DIR": "/k"}, "FREETOKEN_KERNEL_CACHE_DIR"),
        # for every engine
        ("trtllm", {"LD_PRELOAD": "/x.so"}, "LD_PRELOAD"),
        ("llamacpp", {"PYTHONPATH": "/x"}, "PYTHONPATH"),
    ],
)
def test_refused_names_each_refused_variable(name, env, refused_var):
    (sentence,) = refused(engine(name), [], {"HF_HUB_OFFLINE": "1", **env})
    assert sentence.startswith(f"The environment variable {refused_var} is refused for {name}: ")
    assert any(words in sentence for words in ("names", "fetches", "reads", "loads", "loader", "imports")), (
        sentence
    )


def test_the_freetoken_key_is_not_refused():
    assert refused(engine("freetoken"), [], {"FREETOKEN_API_KEY": "k"}) == []


def test_the_cards_the_agent_assigns_cannot_be_set_by_a_profile():
    (sentence,) = refused(engine("vllm"), [], [("CUDA_VISIBLE_DEVICES", "0,1")])
    assert "cards" in sentence
    assert sentence.startswith("CUDA_VISIBLE_DEVICES is set by the node agent")


def test_refused_says_each_flag_once():
    assert len(refused(engine("vllm"), ["--trust-remote-code", "--trust-remote-code"], {})) == 1


# -- spellings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "token", "flags", "expected"),
    [
        ("vllm", "--max_model_len", ("--max-model-len",), "--max-model-len"),
        ("vllm", "--max-model", ("--max-model-len",), "--max-model-len"),
        ("vllm", "-tp", ("--tensor-parallel-size", "-tp"), "-tp"),
        ("sglang", "--context", ("--context-length",), "--context-length"),
        ("sglang", "--context_length", ("--context-length",), None),
        ("trtllm", "--max-seq-len", ("--max_seq_len",), None),
        ("llamacpp", "--ctx", ("--ctx-size", "-c"), None),
        ("llamacpp", "-c", ("--ctx-size", "-c"), "-c"),
        # a longer flag is never read as a shorter one
        ("sglang", "--tp-size-x", ("--tp",), None),
    ],
)
def test_spelling_of_follows_the_engine_parser(name, token, flags, expected):
    assert spelling_of(engine(name), token, flags) == expected


def test_with_context_drops_every_spelling_and_writes_the_first():
    eng = engine("llamacpp")
    args = ["-c", "1024", "--threads", "8", "--ctx-size=2048", "-cb"]
    assert with_context(eng, args, 4096) == ["--threads", "8", "-cb", "--ctx-size", "4096"]


def test_int_value_reads_the_engine_spellings():
    assert int_value(engine("vllm"), ["--max_model_len=4096"], engine("vllm").context_flags) == 4096


@pytest.mark.parametrize(
    ("name", "args", "written"),
    [
        ("vllm", ["--max-model-len", "8192"], "8192"),
        ("vllm", ["--max_model_len=4096"], "4096"),
        ("vllm", ["--max-model", "4096"], "4096"),  # argparse's abbreviation
        ("llamacpp", ["-c", "4096", "--ctx-size=8192"], "8192"),  # the last, whatever its form
        ("llamacpp", ["-c", "04096"], "04096"),  # as written: the guard compares the text
        ("vllm", ["--context-length", "2048"], None),  # another engine's flag
        ("vllm", ["--max-model-len", "--enforce-eager"], ""),
    ],
)
def test_the_context_flag_is_read_in_every_spelling_and_as_written(name, args, written):
    # The one reading of the context flag: the planner's context and the catalog's guard (only
    # the context operation writes it) both take it, so a respelling hides it from neither.
    assert context_arg(engine(name), args) == written


@pytest.mark.parametrize(
    ("text", "parsed"), [("8.0", (8, 0)), ("12.0", (12, 0)), (" 7.5 ", (7, 5)), ("8", None)]
)
def test_parse_capability_orders_by_number_not_text(text, parsed):
    assert parse_capability(text) == parsed


def test_capability_twelve_is_newer_than_nine():
    assert parse_capability("12.0") > parse_capability("9.0")


# -- launching ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("vllm", ["org/m", "--port", "8001", "--served-model-name", "m", "--tensor-parallel-size", "4"]),
        ("sglang", ["--model-path", "org/m", "--port", "8001", "--served-model-name", "m", "--tp-size", "4"]),
        ("trtllm", ["org/m", "--port", "8001", "--served_model_name", "m", "--tp_size", "4"]),
        # llama.cpp and FreeToken have no TP width to write
        ("llamacpp", ["-m", "org/m", "--port", "8001", "--alias", "m"]),
        ("freetoken", ["--model", "org/m", "--port", "8001", "--served-model-name", "m"]),
    ],
)
def test_launch_args_are_the_template_the_width_then_the_profile(name, expected):
    # The program is the agent's own (its [engines.NAME] command); the registry names none.
    line = launch_args(engine(name), source="org/m", port=8001, model="m", tp=4, args=["--x", "1"])
    assert line == [*expected, "--x", "1"]


def test_a_pinned_revision_goes_to_the_engines_revision_flag():
    line = launch_args(engine("vllm"), source="org/m@v2", port=8001, model="m", tp=1, args=[])
    assert line[:1] == ["org/m"]
    assert line[5:7] == ["--revision", "v2"]


def test_launch_args_substitutes_placeholders_once():
    line = launch_args(engine("vllm"), source="/models/{port}", port=1, model="{model}", tp=1, args=[])
    assert line[:5] == ["/models/{port}", "--port", "1", "--served-model-name", "{model}"]


# -- loading a registry file ----------------------------------------------------------

GOOD = """
[eng]
spread = "tensor"
min_capability = "8.0"
experts_on_card = true

[eng.memory]
version = "eng 1.0"
runtime_gib = 1.25
[eng.memory.sources]
weights = "w"
kv = "k"
runtime = "r"
"""

POLICY = """
[limits]
max_args = 8
max_arg_bytes = 64
max_args_bytes = 256
max_env = 4
max_env_value_bytes = 64
max_env_bytes = 256
max_context = 1000000

[engines.eng]
launch = ["{source}", "--port", "{port}"]
tp_flag = "--tp"
tp_flags = ["--tp"]
context_flags = ["--ctx"]
underscores_as_dashes = false
equals = true
abbreviations = false
sources = { parser = "eng's parser, version 1" }
owned = { "--tp" = "the profile's tp", "--ctx" = "the context operation" }
refused = { "--evil" = "it loads code" }
args = { "--fine" = { value = "int", src = "parser" } }
"""


def _write(tmp_path: Path, text: str, name: str = "engines.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _policy(tmp_path: Path, text: str = POLICY):
    from llmgw_policy import load_policy

    return load_policy(_write(tmp_path, text, "policy.toml"))


def test_load_registry_reads_a_file(tmp_path):
    (eng,) = load_registry(_write(tmp_path, GOOD), _policy(tmp_path)).values()
    assert eng.name == "eng"
    assert eng.memory.runtime_gib == 1.25
    assert (eng.tp_flag, eng.tp_flags, eng.context_flags) == ("--tp", ("--tp",), ("--ctx",))


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('spread = "tensor"', 'spread = "pipeline"', "spread"),
        # a tensor-parallel engine needs the policy's tp_flag; others have none
        ('spread = "tensor"', 'spread = "single"', "spread"),
        ('min_capability = "8.0"', "min_capability = 8.0", "min_capability"),
        ("runtime_gib = 1.25", "runtime_gib = -1", "memory.runtime_gib"),
        ("runtime_gib = 1.25", "runtime_gib = true", "memory.runtime_gib"),
        ('runtime = "r"', "", "memory.sources.runtime"),
        ('version = "eng 1.0"', "", "memory.version"),
        ("experts_on_card = true", 'experts_on_card = "yes"', "experts_on_card"),
        ("experts_on_card = true", "experts_on_card = true\ncolour = 1", "colour"),
        ("[eng.memory]", "[eng.memoir]", "memoir"),
        # launch keys moved to the policy: the registry no longer takes them
        ("experts_on_card = true", 'experts_on_card = true\nrefused_args = ["--x"]', "refused_args"),
        ("[eng", "[other", "spread"),
    ],
)
def test_load_registry_fails_naming_the_engine_and_the_key(tmp_path, old, new, key):
    assert old in GOOD
    with pytest.raises(RegistryError) as caught:
        load_registry(_write(tmp_path, GOOD.replace(old, new)), _policy(tmp_path))
    assert "engine '" in str(caught.value)
    assert f"key {key!r}" in str(caught.value)


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ('tp_flag = "--tp"', 'tp_flag = "--width"', "tp_flag"),
        ('context_flags = ["--ctx"]', 'context_flags = ["--nope"]', "context_flags"),
        ('launch = ["{source}", "--port", "{port}"]', 'launch = ["--port", "{port}"]', "launch"),
        ('launch = ["{source}", "--port", "{port}"]', 'launch = ["{source}", "{host}"]', "launch"),
        ('value = "int"', 'value = "anything"', "value"),
        ('src = "parser"', 'src = "nowhere"', "src"),
        ('"--evil" = "it loads code"', '"--fine" = "it loads code"', "--fine"),
        ("max_env = 4", "max_env = 0", "max_env"),
        ("equals = true", 'equals = "yes"', "equals"),
    ],
)
def test_load_policy_fails_naming_the_table_and_the_key(tmp_path, old, new, says):
    from llmgw_policy import PolicyError

    assert old in POLICY
    with pytest.raises(PolicyError) as caught:
        _policy(tmp_path, POLICY.replace(old, new))
    assert "policy.toml" in str(caught.value)
    assert says in str(caught.value)


def test_load_registry_refuses_an_unknown_top_level_key(tmp_path):
    with pytest.raises(RegistryError, match="top level, key 'colour'"):
        load_registry(_write(tmp_path, "colour = 1\n" + GOOD), _policy(tmp_path))


def test_load_registry_refuses_a_file_that_is_not_toml(tmp_path):
    with pytest.raises(RegistryError, match="not valid TOML"):
        load_registry(_write(tmp_path, "[eng\n"), _policy(tmp_path))


def test_the_shipped_registry_loads_cleanly():
    assert set(load_registry()) >= {"vllm", "sglang", "trtllm", "llamacpp", "freetoken"}
