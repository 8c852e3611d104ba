"""The TRL-suite harness (scripts/trl_suite): its `trl` shim fails loudly on names rlhfkit lacks, its
stand-ins have the hub's columns and classes, and its counts follow the documented denominator."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

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
