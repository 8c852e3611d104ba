"""The trainers' `use_vllm` fields in server mode, against a real engine: one `rlhfkit vllm-serve` (from
.venv-vllm, `make vllm-env`) on the saved tiny Llama serves the whole module.

GRPO trains through it and the engine follows the policy (one sync before each generation after an
update), also with tools (multi-turn episodes); RLOO in both forms, PPO's `generate` and the win-rate
sampler sample through it; the command line reaches it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from rlhfkit import GRPOConfig, GRPOTrainer, PPOConfig, PPOTrainer, RLOOConfig, RLOOTrainer
from rlhfkit.judges import RuleJudge
from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout import SamplingParams, pad_left
from rlhfkit.rollout.vllm_client import VLLMServerBackend
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer, tiny_value_head_model
from rlhfkit.testing.chat_templates import tool_chat_tokenizer
from rlhfkit.testing.vllm_server import vllm_server
from rlhfkit.trainers.common.win_rate import WinRateCallback

SERVER = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "rlhfkit"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SERVER.exists(), reason="no .venv-vllm: run `make vllm-env`"),
]


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with vllm_server(SERVER, tiny_model_path("llama"), log) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


@pytest.fixture
def syncs(monkeypatch):
    """How many times a trainer pushed its weights to the engine."""
    calls = []
    push = VLLMServerBackend.sync_weights
    monkeypatch.setattr(
        VLLMServerBackend, "sync_weights", lambda self, m=None: (calls.append(1), push(self, m))
    )
    return calls


def _server_fields(url: str) -> dict:
    return dict(use_vllm=True, vllm_mode="server", vllm_server_base_url=url, vllm_server_timeout=30)


def _group_config(config_cls, tmp_path, url, **kwargs):
    defaults = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=5, max_steps=3, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-2,
    )  # fmt: skip
    return config_cls(**{**defaults, **_server_fields(url), **kwargs})


def _engine_and_trainer_logprobs(engine, model):
    """(engine's, trainer model's) logprobs of the tokens the engine samples for two fixed prompts."""
    query_ids, query_mask = pad_left([torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10])], 1)
    torch.manual_seed(0)
    out = engine.generate(
        query_ids,
        query_mask,
        SamplingParams(max_new_tokens=6, temperature=1.0, top_k=0),
        logprob_temperature=1.0,
    )
    ours = torch.zeros_like(out.logprobs)
    with torch.no_grad():
        for i in range(2):
            prompt, completion = query_ids[i][query_mask[i].bool()], out.responses[i][out.response_mask[i]]
            logits = model(torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1 : -1]
            ours[i, : len(completion)] = logits.log_softmax(-1).gather(-1, completion[:, None])[:, 0]
    return out.logprobs[out.response_mask], ours[out.response_mask]


def test_grpo_trains_on_the_server_and_the_engine_follows_the_policy(tmp_path, url, tokenizer, syncs):
    trainer = GRPOTrainer(
        tiny_model("llama"), count_e, args=_group_config(GRPOConfig, tmp_path, url),
        train_dataset=toy_prompt_dataset(n=16), processing_class=tokenizer,
    )  # fmt: skip
    assert trainer.args.sampler_correction_active()  # use_vllm turns TRL's default correction on
    trainer.train()
    # before each of the 3 generations: the policy had changed each time (at the first: unknown)
    assert len(syncs) == 3
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 3 and all("sampling/importance_sampling_ratio/mean" in h for h in logged)
    model = trainer.model
    engine, ours = _engine_and_trainer_logprobs(trainer._engine, model)
    assert (engine - ours).abs().max() > 1e-3  # the last update came after the last sampling
    sampler = trainer._sampler()  # the next sampling: the engine is given the new weights first
    assert sampler is trainer._engine and len(syncs) == 4
    torch.testing.assert_close(*_engine_and_trainer_logprobs(sampler, model), rtol=0, atol=2e-4)
    # without the syncs the engine would still serve the initial weights, which differ from the trained ones
    engine, initial = _engine_and_trainer_logprobs(sampler, tiny_model("llama"))
    assert (engine - initial).abs().max() > 1e-2
    sampler.sync_weights(tiny_model("llama"))  # the next tests start from the saved weights


def test_rloo_current_form_takes_its_old_logprobs_from_the_training_pass(tmp_path, url, tokenizer, syncs):
    trainer = RLOOTrainer(
        model=tiny_model("llama"), reward_funcs=count_e, train_dataset=toy_prompt_dataset(n=16),
        args=_group_config(RLOOConfig, tmp_path, url, max_steps=1, top_k=5, num_iterations=2),
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    assert len(syncs) == 1 and trainer.state.global_step == 1
    # top-k: the engine's logprobs are of the truncated distribution, so the old policy is a training pass
    batch = trainer._buffer
    assert batch.old_logprobs is not None
    mask = batch.response_mask
    assert (batch.old_logprobs - batch.logprobs)[mask].abs().max() > 1e-3  # truncation raised the engine's
    assert (batch.logprobs[mask] >= batch.old_logprobs[mask] - 1e-4).all()
    # that gap is the truncation, not an engine mismatch: the health alarm stays silent, and would name
    # no field RLOO lacks
    logged = next(h for h in trainer.state.log_history if "loss" in h)
    assert logged["sampling/sampling_logp_difference/mean"] > 0.05  # the alarm's limit
    assert logged["sampling/logprobs_processed"] == 1.0
    assert "health/logprob_mismatch" not in logged and logged["health/alarms"] == 0


def test_a_processor_given_only_in_generation_kwargs_makes_grpo_take_a_training_pass(
    tmp_path, url, tokenizer, syncs
):
    # min_new_tokens has no GRPO field: only the backend, resolving what it sends, sees that it blocks
    # the stop token; with the correction off the old policy must still come from the training pass
    config = _group_config(
        GRPOConfig, tmp_path, url, max_steps=1, num_iterations=2, vllm_importance_sampling_correction=False,
        generation_kwargs={"min_new_tokens": 3},
    )  # fmt: skip
    trainer = GRPOTrainer(
        tiny_model("llama"), count_e, args=config, train_dataset=toy_prompt_dataset(n=16),
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    batch = trainer._buffer
    assert batch.old_logprobs is not None and (batch.response_mask.sum(1) >= 3).all()
    assert not torch.equal(batch.old_logprobs[batch.response_mask], batch.logprobs[batch.response_mask])


def test_grpo_trains_only_on_completions_the_regex_matches(tmp_path, url, tokenizer, syncs):
    seen = []

    def matches(completions, **kwargs):
        seen.extend(completions)
        return [float(c.startswith("yes")) for c in completions]

    config = _group_config(
        GRPOConfig, tmp_path, url, max_steps=2, max_completion_length=10,
        vllm_structured_outputs_regex=r"(yes|no) [0-9]{1,3}",
    )  # fmt: skip
    trainer = GRPOTrainer(
        tiny_model("llama"), matches, args=config, train_dataset=toy_prompt_dataset(n=16),
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    assert len(seen) == 16 and all(re.fullmatch(r"(yes|no) [0-9]{1,3}", c) for c in seen), seen
    # the engine's logprobs are of the masked distribution: the old policy comes from the training pass
    assert trainer._buffer.old_logprobs is not None
    assert all(h["sampling/logprobs_processed"] == 1.0 for h in trainer.state.log_history if "loss" in h)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def test_grpo_runs_tool_calling_episodes_on_the_engine(tmp_path, url, syncs):
    # the tiny model never writes a tool call by itself: the regex makes the engine write one or the answer
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>'
    conversations = []

    def says_12(completions, **kwargs):
        conversations.extend(completions)
        return [float(c[-1]["content"] == "12") for c in completions]

    config = _group_config(
        GRPOConfig, tmp_path, url, max_steps=2, max_completion_length=96, max_tool_calling_iterations=1,
        vllm_structured_outputs_regex=re.escape(call) + "|12|7",
    )  # fmt: skip
    prompts = [[{"role": "user", "content": f"what is 3 times 4? ({i})"}] for i in range(4)]
    trainer = GRPOTrainer(
        tiny_model("llama"), says_12, args=config, train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tool_chat_tokenizer("gpt2"), tools=[multiply],
    )  # fmt: skip
    trainer.train()
    assert len(syncs) == 2 and len(conversations) == 16
    called = [c for c in conversations if c[0].get("tool_calls")]
    assert called and len(called) < 16, conversations  # the engine chose a call for some episodes only
    for conversation in called:  # the engine's call, run by us, then the engine's next turn
        assert conversation[0]["tool_calls"][0]["function"] == {
            "name": "multiply",
            "arguments": {"a": 3, "b": 4},
        }
        assert conversation[1] == {"role": "tool", "name": "multiply", "content": "12"}
        assert conversation[2]["role"] == "assistant"
    batch = trainer._buffer
    inserted = batch.response_mask & ~batch.loss_mask
    calls_in_batch = sum(1 for c in conversations[-8:] if c[0].get("tool_calls"))
    assert int(inserted.any(1).sum()) == calls_in_batch  # tool tokens: in the sequence, out of the loss
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert sum(h["tools/call_frequency"] for h in logged) == pytest.approx(len(called) / 8)
    assert all(h["sampling/logprobs_processed"] == 1.0 for h in logged)  # the regex masks the distribution
    trainer._engine.sync_weights(tiny_model("llama"))  # the next tests start from the saved weights


def test_rloo_classic_form_samples_on_the_server(tmp_path, url, tokenizer, syncs):
    config = RLOOConfig(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=4,
        rloo_k=2, num_ppo_epochs=1, response_length=5, total_episodes=4, logging_steps=1, save_strategy="no",
        num_sample_generations=0, disable_tqdm=True, seed=3, **_server_fields(url),
    )  # fmt: skip
    trainer = RLOOTrainer(
        config,
        tokenizer,
        tiny_model("llama"),
        tiny_model("llama"),
        KeywordReward("e"),
        toy_prompt_dataset(n=8),
    )
    trainer.train()
    assert len(syncs) == 1 and trainer.state.global_step == 1
    assert torch.isfinite(torch.tensor(trainer.state.log_history[0]["loss/policy_avg"]))


def test_ppo_generates_on_the_server_and_step_computes_the_values(url, tokenizer, syncs):
    config = PPOConfig(batch_size=2, mini_batch_size=2, learning_rate=1e-2, **_server_fields(url))
    trainer = PPOTrainer(
        config, tiny_value_head_model("llama", summary_dropout_prob=0.0), tokenizer=tokenizer
    )
    assert len(syncs) == 1  # connected and synced at construction
    queries = [torch.tensor(tokenizer.encode(t)) for t in ["the film", "a story about"]]
    responses = trainer.generate(queries, return_prompt=False, max_new_tokens=4, do_sample=True, top_k=0)
    assert len(responses) == 2 and all(1 <= len(r) <= 4 for r in responses)
    assert len(trainer.rollouts) == 0  # no values from the engine: step() runs the forward pass
    stats = trainer.step(queries, responses, [torch.tensor(1.0), torch.tensor(0.0)])
    assert torch.isfinite(torch.tensor(stats["ppo/loss/value"]))
    trainer.generate(queries, return_prompt=False, max_new_tokens=4, do_sample=True, top_k=0)
    assert len(syncs) == 2  # the optimizer step changed the policy: synced before sampling again

    # the win-rate sampler samples the policy through the trainer's engine
    sampled = []
    generate = VLLMServerBackend.generate
    callback = WinRateCallback(
        RuleJudge.of_texts(KeywordReward("e")), ["the film was", "a story"], trainer=trainer, every_n_steps=1
    )
    trainer._engine.generate = lambda *a, **k: (sampled.append(1), generate(trainer._engine, *a, **k))[1]
    metrics = callback.on_ppo_step(trainer, step=1)
    assert sampled == [1] and 0 <= metrics["eval/win_rate"] <= 1
    trainer._engine.sync_weights(tiny_model("llama"))


def test_the_grpo_command_trains_on_the_server(tmp_path, url, monkeypatch, capsys):
    from rlhfkit.commands.grpo import main

    (tmp_path / "cli_rewards.py").write_text(  # fails the run unless the regex held
        "import re\n"
        "def has_e(prompts, completions, **columns):\n"
        "    assert all(re.fullmatch('[a-e]{1,3}', c) for c in completions), completions\n"
        "    return [float('e' in c) for c in completions]\n"
    )
    Dataset.from_dict({"prompt": ["the film was", "a story about"] * 4}).to_json(str(tmp_path / "data.jsonl"))
    monkeypatch.chdir(tmp_path)
    code = main([
        "--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", str(tmp_path / "data.jsonl"),
        "--output_dir", str(tmp_path / "out"), "--reward_funcs", "cli_rewards.has_e",
        "--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_base_url", url,
        "--vllm_structured_outputs_regex", "[a-e]{1,3}",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
        "--max_steps", "1", "--report_to", "none", "--use_cpu", "--logging_steps", "1",
        "--save_strategy", "no", "--disable_tqdm", "true",
    ])  # fmt: skip
    assert code == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["updates"] == 1
