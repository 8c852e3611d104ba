"""The TRL-suite harness (scripts/trl_suite): its `trl` shim fails loudly on names rlhfkit lacks, its
stand-ins have the hub's columns and classes, and its counts follow the documented denominator."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HARNESS = Path(__file__).resolve().parent.parent / "scripts" / "trl_suite"


def _harness(name: str, monkeypatch):
    """A harness module loaded from its file under a name of its own: another `run` or `causes` module
    imported earlier in this process must not stand in for it."""
    monkeypatch.syspath_prepend(str(HARNESS))  # for the harness's imports of its own modules
    spec = importlib.util.spec_from_file_location(f"trl_suite_{name}", HARNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def _resolve_module():
    """The shim's resolver, loaded under its own name so no `trl` package enters this process."""
    spec = importlib.util.spec_from_file_location(
        "trl_suite_resolve", HARNESS / "shim" / "trl" / "_resolve.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shim_maps_trl_names_to_rlhfkit_and_fails_on_missing_ones():
    import rlhfkit

    resolve = _resolve_module()
    assert resolve.resolve("trl", "DPOConfig") is rlhfkit.DPOConfig
    assert resolve.resolve("trl.trainer.sft_trainer", "SFTTrainer") is rlhfkit.SFTTrainer
    from rlhfkit.rollout.respond import respond_to_batch

    assert resolve.resolve("trl.core", "respond_to_batch") is respond_to_batch
    missing = resolve.resolve("trl", "NashMDTrainer")
    with pytest.raises(resolve.RlhfkitLacks, match=r"rlhfkit has no trl\.NashMDTrainer"):
        missing(model="x")
    with pytest.raises(resolve.RlhfkitLacks, match="NashMDTrainer"):
        missing.some_attribute  # noqa: B018
    with pytest.raises(AttributeError):  # dunder probes (import machinery, copy, pickle) stay ordinary
        resolve.resolve("trl", "__path__")


def test_zen_stand_in_has_the_hub_columns(monkeypatch):
    datasets = _harness("hub_datasets", monkeypatch)
    expected = {
        "standard_language_modeling": ["text"],
        "standard_prompt_only": ["prompt"],
        "standard_preference": ["prompt", "chosen", "rejected"],
        "standard_implicit_prompt_preference": ["chosen", "rejected"],
        "standard_unpaired_preference": ["prompt", "completion", "label"],
        "conversational_language_modeling": ["messages"],
        "conversational_prompt_completion": ["prompt", "completion"],
    }
    for name, columns in expected.items():
        rows = datasets.zen_split(name, datasets.TRAIN)
        assert len(rows) == 17 and list(rows[0]) == columns, name
    row = datasets.zen_split("conversational_preference", datasets.TRAIN)[0]
    assert row["prompt"][0]["role"] == "user" and row["chosen"][0]["role"] == "assistant"
    assert row["chosen"] != row["rejected"]
    with pytest.raises(datasets.HarnessUnmapped, match="zen 'standard_no_such_config'"):
        datasets.zen_split("standard_no_such_config", datasets.TRAIN)


def test_model_ids_name_transformers_classes_and_multimodal_ones_are_refused(monkeypatch):
    hub_models = _harness("hub_models", monkeypatch)
    assert (
        hub_models.model_class("trl-internal-testing/tiny-Qwen2ForCausalLM-2.5").__name__
        == "Qwen2ForCausalLM"
    )
    cls = hub_models.model_class("trl-internal-testing/tiny-random-GPTNeoXForCausalLM-safetensors-sharded")
    assert cls.__name__ == "GPTNeoXForCausalLM"
    assert (
        hub_models.model_class("trl-internal-testing/dummy-GPT2-correct-vocab").__name__ == "GPT2LMHeadModel"
    )
    with pytest.raises(hub_models.HarnessUnmapped, match="multimodal"):
        hub_models.model_class("trl-internal-testing/tiny-LlavaForConditionalGeneration")
    with pytest.raises(hub_models.HarnessUnmapped, match="RemoteForCausalLM"):
        hub_models.model_class("trl-internal-testing/tiny-RemoteForCausalLM")
    assert hub_models.is_hub_id("trl-internal-testing/zen") and hub_models.is_hub_id("gpt2")
    assert not hub_models.is_hub_id("/tmp") and not hub_models.is_hub_id("./out/model")


def test_remote_code_stand_in_loads_only_when_its_code_is_trusted(monkeypatch):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    hub_models = _harness("hub_models", monkeypatch)
    folder = str(hub_models.local_model_dir("trl-internal-testing/tiny-RemoteForCausalLM"))
    with pytest.raises(ValueError, match="custom code"):
        AutoModelForCausalLM.from_pretrained(folder)
    assert type(AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)).__name__ == (
        "RemoteForCausalLM"
    )
    scorer = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True, num_labels=1)
    assert type(scorer).__name__ == "RemoteForSequenceClassification"
    assert scorer(input_ids=torch.tensor([[5, 6, 7]])).logits.shape == (1, 1)


def test_auto_classes_hand_the_custom_code_loader_the_local_folder(tmp_path):
    """Each AutoModelFor... class has its own from_pretrained: mapping only the base class left the
    custom-code loader looking for the hub id online (run in a subprocess: the map patches transformers)."""
    script = (
        "import plugin; plugin._install_model_map()\n"
        "from transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained('trl-internal-testing/tiny-RemoteForCausalLM',"
        " trust_remote_code=True)\n"
        "print(type(model).__name__)\n"
    )
    path = os.pathsep.join([str(HARNESS), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "RemoteForCausalLM"


def test_gpt2_stand_in_has_the_layers_the_value_head_tests_read(monkeypatch):
    hub_models = _harness("hub_models", monkeypatch)
    folder = hub_models.local_model_dir("trl-internal-testing/tiny-random-GPT2LMHeadModel")
    config = json.loads((folder / "config.json").read_text())
    assert config["n_layer"] == 5  # v0.11.4's test_independent_reference reads layer index 4
    from transformers import AutoTokenizer, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(hub_models.tokenizer_dir())
    assert hub_models._tiny_config(GPT2LMHeadModel, tokenizer).n_layer == 2  # other ids keep two


def test_toolcall_stand_in_has_tool_schemas_calls_and_results(monkeypatch):
    datasets = _harness("hub_datasets", monkeypatch)
    files = datasets.local_dataset_files("trl-internal-testing/toolcall", "language_modeling")
    from datasets import load_dataset

    rows = load_dataset("parquet", data_files=files, split="train")
    assert rows.column_names == ["messages", "tools"] and len(rows) == 6
    tools = json.loads(rows[0]["tools"])  # a JSON string, as the tests decode it
    assert tools[0]["function"]["name"] == "get_weather"
    roles = [message["role"] for message in rows[0]["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    call = rows[0]["messages"][1]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and call["arguments"]["city"] == "Paris"
    preference = datasets.local_dataset_files("trl-internal-testing/toolcall", "preference")
    pairs = load_dataset("parquet", data_files=preference, split="train")
    assert pairs.column_names == ["prompt", "chosen", "rejected", "tools"]
    assert pairs[0]["prompt"][-1]["role"] == "tool" and pairs[0]["chosen"] != pairs[0]["rejected"]
    with pytest.raises(datasets.HarnessUnmapped, match="toolcall 'vision'"):
        datasets.local_dataset_files("trl-internal-testing/toolcall", "vision")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_harness("hub_models", monkeypatch).tokenizer_dir())
    text = tokenizer.apply_chat_template(rows[0]["messages"], tools=tools, tokenize=False)
    assert '"name": "get_weather"' in text and "<tool_call>" in text and "sunny, 21 C" in text


def test_qwen3_template_stand_in_renders_tool_results_and_thinking(monkeypatch):
    from transformers import AutoTokenizer

    hub_models = _harness("hub_models", monkeypatch)
    tokenizer = AutoTokenizer.from_pretrained(hub_models.local_model_dir("Qwen/Qwen3-4B"))
    chat = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
        ]},
        {"role": "tool", "content": "snow"},
    ]  # fmt: skip
    text = tokenizer.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert text.startswith("<|im_start|>user\nWeather in Oslo?<|im_end|>\n")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nsnow\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # only the template differs from the harness tokenizer: a template-only stand-in
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(hub_models.tokenizer_dir()).get_vocab()


def test_harmony_stand_in_has_thinking_replies_and_the_gpt_oss_tokenizer_renders_them(monkeypatch):
    datasets = _harness("hub_datasets", monkeypatch)
    expected = {
        "language_modeling": ["messages"],
        "prompt_completion": ["prompt", "completion"],
        "preference": ["prompt", "chosen", "rejected"],
    }
    for name, columns in expected.items():
        rows = datasets.harmony_split(name, datasets.TRAIN)
        assert len(rows) == 17 and list(rows[0]) == columns, name
    row = datasets.harmony_split("prompt_completion", datasets.TRAIN)[0]
    assert [m["role"] for m in row["prompt"]] == ["developer", "user"]
    assert row["completion"][0]["thinking"] and row["completion"][0]["content"] == "rises in the east."
    with pytest.raises(datasets.HarnessUnmapped, match="harmony 'prompt_only'"):
        datasets.harmony_split("prompt_only", datasets.TRAIN)
    from transformers import AutoTokenizer

    hub_models = _harness("hub_models", monkeypatch)
    tokenizer = AutoTokenizer.from_pretrained(
        hub_models.local_model_dir("trl-internal-testing/tiny-GptOssForCausalLM")
    )
    assert tokenizer.eos_token == "<|return|>"
    prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
    assert full.startswith(prompt) and prompt.endswith(
        "<|start|>user<|message|>Finish the sentence: The sun<|end|><|start|>assistant"
    )
    completion = full[len(prompt) :]
    thinking = row["completion"][0]["thinking"]
    assert completion == (
        f"<|channel|>analysis<|message|>{thinking}<|end|>"
        "<|start|>assistant<|channel|>final<|message|>rises in the east.<|return|>"
    )
    # harmony's markers are single tokens
    for marker in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>"):
        assert tokenizer(marker, add_special_tokens=False)["input_ids"] == [
            tokenizer.convert_tokens_to_ids(marker)
        ]


def test_causes_group_failures_that_share_a_fix(monkeypatch):
    causes = _harness("causes", monkeypatch)
    assert (
        causes.cause_of("trl._resolve.RlhfkitLacks: rlhfkit has no trl.KTOTrainer")
        == "rlhfkit lacks trl.KTOTrainer"
    )
    reason = "TypeError: DPOConfig.__init__() got an unexpected keyword argument 'ld_alpha'"
    assert causes.cause_of(reason) == "DPOConfig has no argument/field 'ld_alpha'"
    assert causes.cause_of("AttributeError: 'DPOTrainer' object has no attribute 'aux_loss_enabled'") == (
        "DPOTrainer has no attribute 'aux_loss_enabled'"
    )


def test_pass_rate_counts_only_cpu_runnable_tests(monkeypatch):
    run = _harness("run", monkeypatch)
    results = {
        "a": {"outcome": "passed", "reason": ""},
        "b": {"outcome": "failed", "reason": "AssertionError: x"},
        "c": {
            "outcome": "failed",
            "reason": "hub_models.HarnessUnmapped: no local stand-in for hub model 'm'",
        },
        "d": {"outcome": "skipped", "reason": "not CPU-runnable: test of vllm"},
        "e": {"outcome": "skipped", "reason": "test requires jmespath"},
        "f": {"outcome": "xfailed", "reason": "upstream"},
    }
    total = run.summarise(results)
    # runnable = passed + failed + unmapped = 3; 1 of 3 passed, 1 of the 2 mapped ones
    assert total["cpu_runnable"] == 3 and total["passed"] == 1
    assert total["pass_rate"] == pytest.approx(1 / 3, abs=1e-4) and total["pass_rate_of_mapped"] == 0.5
    assert total["skipped_not_cpu"] == 1 and total["skipped_missing_package"] == 1 and total["xfailed"] == 1


def test_themes_gather_causes_and_trl_hardware_skips_leave_the_denominator(monkeypatch):
    causes = _harness("causes", monkeypatch)
    assert causes.theme_of("AttributeError: 'DPOTrainer' object has no attribute 'aux_loss_enabled'") == (
        causes.theme_of("AttributeError: 'SFTTrainer' object has no attribute 'aux_loss_enabled'")
    )
    streaming = "TypeError: IterableDataset.map() got an unexpected keyword argument 'num_proc'"
    assert causes.theme_of(streaming) == "IterableDataset (streaming) train/eval datasets"
    assert causes.theme_of("ZeroDivisionError: something new") == "other"
    run = _harness("run", monkeypatch)
    assert run.category({"outcome": "skipped", "reason": "test requires accelerator"}) == "skipped_not_cpu"
    assert run.category({"outcome": "skipped", "reason": "test requires vllm"}) == "skipped_not_cpu"
    optional = {"outcome": "skipped", "reason": "test requires jmespath"}
    assert run.category(optional) == "skipped_missing_package"


def test_recorded_command_names_the_extra_packages_folder(monkeypatch):
    run = _harness("run", monkeypatch)
    argv = ["--trl-tests", "/t/main", "--out", "r.json"]
    assert run._command(argv, "/deps") == (
        "TRL_SUITE_DEPS=/deps PYTHONPATH=src python scripts/trl_suite/run.py --trl-tests /t/main --out r.json"
    )
    assert run._command([*argv, "--deps", "/deps"], "/deps").startswith("PYTHONPATH=src python")
