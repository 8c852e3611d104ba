"""The colocate backend's checks against a real engine, run by test_vllm_colocate.py in .venv-vllm.

`python colocate_cases.py REPORT MODEL [CASE ...]` runs the cases (default: all) on one engine built from
tiny model MODEL, in this one process, and writes REPORT, a JSON object: case name -> "ok" or the
failure's traceback. Each case asserts what it checks.
vLLM needs the entry point guarded (`if __name__ == "__main__"`), hence a script and not a test module.
"""

from __future__ import annotations

import json
import sys
import traceback

import torch

PAD = 1


def case_completions_are_right_padded_and_end_at_the_first_stop_token(model, backend):
    from engine_checks import assert_stops_and_padding

    assert_stops_and_padding(backend, PAD)


def case_a_seeded_call_samples_the_same_again_and_repeated_prompts_differ(model, backend):
    from engine_checks import assert_seeded_and_varied

    assert_seeded_and_varied(backend, PAD)


def case_the_output_says_when_its_logprobs_are_of_a_processed_distribution(model, backend):
    from engine_checks import assert_processed_logprobs_reported

    assert_processed_logprobs_reported(backend, model, PAD)


def case_a_batch_past_the_engines_step_budget_is_sampled(model, backend):
    from engine_checks import assert_a_batch_past_the_step_budget_is_sampled

    assert_a_batch_past_the_step_budget_is_sampled(backend, PAD)


def case_every_completion_matches_the_structured_outputs_regex(model, backend):
    from engine_checks import REGEX, assert_completions_match_the_regex

    from rlhfkit.testing import tiny_tokenizer

    backend.structured_outputs_regex = REGEX  # the engine has the tokenizer (see `main`)
    try:
        assert_completions_match_the_regex(backend, tiny_tokenizer(), PAD)
    finally:
        backend.structured_outputs_regex = None


def case_engine_logprobs_equal_the_trainers_and_follow_a_weight_sync(model, backend):
    from engine_checks import assert_engine_matches, logprob_gap

    assert_engine_matches(backend, model, PAD)
    with torch.no_grad():  # an optimizer step, as far as the engine can tell
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    # the engine still has the old weights: it copied them, not shared
    assert logprob_gap(backend, model, PAD) > 1e-2
    backend.sync_weights()
    assert_engine_matches(backend, model, PAD)


def case_a_lora_policy_is_synced_merged(model, backend):
    from engine_checks import assert_engine_matches, logprob_gap
    from peft import LoraConfig, get_peft_model

    from rlhfkit.testing import tiny_model

    model = get_peft_model(
        tiny_model("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn_like(param) * 0.2)
    backend.sync_weights(model)  # the same architecture: one engine serves both
    assert_engine_matches(backend, model, PAD)
    with model.disable_adapter():  # the merged update is in the engine, not only the base weights
        assert logprob_gap(backend, model, PAD) > 1e-2


def case_on_cpu_the_kv_cache_takes_1_gib_not_a_share_of_all_ram(model, backend):
    cache = backend.llm.llm_engine.vllm_config.cache_config
    assert cache.gpu_memory_utilization == 0.3  # the default, which on CPU would mean 30% of all RAM
    assert cache.kv_cache_memory_bytes == 2**30
    # prompts prefilled whole (see the step-budget case)
    assert not backend.llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill


def _grpo_sampler_gaps(engine, sync: bool) -> list[float]:
    """Per step, the largest |sampler - trainer| logprob gap of a 3-step GRPO run sampling on `engine`.

    One engine serves both runs: vLLM keeps process-wide state, and a second engine in one process
    breaks when the first is collected. It is pointed at each run's fresh model first.
    """
    from transformers import TrainerCallback

    from rlhfkit.rewards import KeywordReward
    from rlhfkit.tasks import toy_prompt_dataset
    from rlhfkit.testing import tiny_model, tiny_tokenizer
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    tokenizer, model = tiny_tokenizer(padding_side="left"), tiny_model("llama")
    engine.model, engine.pad_token_id = model, tokenizer.pad_token_id
    engine.sync_weights()

    class SyncAfterEachStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            engine.sync_weights()

    config = GRPOConfig(
        output_dir="grpo-colocate", report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=6, max_steps=3, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-2,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model,
        lambda completions, **kwargs: KeywordReward("e")(completions),
        args=config,
        train_dataset=toy_prompt_dataset(n=24),
        processing_class=tokenizer,
        callbacks=[SyncAfterEachStep()] if sync else None,
    )
    trainer._sampler = lambda chunk_size=None: engine  # what make_generation_backend hands out for it
    trainer.train()
    key = "sampling/sampling_logp_difference/max"
    return [h[key] for h in trainer.state.log_history if key in h]


def case_grpo_samples_from_the_trained_weights_when_synced_after_each_step(model, backend):
    synced, stale = _grpo_sampler_gaps(backend, sync=True), _grpo_sampler_gaps(backend, sync=False)
    print("grpo sampler gaps: synced", synced, "stale", stale)
    assert len(synced) == len(stale) == 3
    assert max(synced) < 1e-3  # every step samples from the weights it trains
    assert stale[0] < 1e-3 and min(stale[1:]) > 1e-2  # unsynced, the engine keeps the first weights


CASES = {name.removeprefix("case_"): fn for name, fn in globals().items() if name.startswith("case_")}


def main(report: str, model_name: str, names: list[str]) -> None:
    from rlhfkit.rollout.vllm_colocate import VLLMColocateBackend
    from rlhfkit.testing import tiny_model, tiny_tokenizer

    model = tiny_model(model_name)
    # with the tokenizer, for the structured-outputs case: one engine per process serves every case
    backend = VLLMColocateBackend(model, PAD, tokenizer=tiny_tokenizer())
    results = {}
    for name in names or list(CASES):
        try:
            CASES[name](model, backend)
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    with open(report, "w") as file:
        json.dump(results, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
