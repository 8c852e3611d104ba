"""PPO end to end: the seed 002 walkthrough and the README quickstart run as written, and the policy
learns."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout import pad_left, pad_right
from rlhfkit.tasks import toy_prompts
from rlhfkit.testing import tiny_model_path, tiny_tokenizer, tiny_value_head_model

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_quickstart_runs_as_written(capsys):
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quickstart: the classic PPO loop", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "README quickstart", "exec"), namespace)
    stats = namespace["stats"]
    assert {"objective/kl", "ppo/mean_scores", "ppo/loss/total"} <= set(stats)
    assert capsys.readouterr().out.strip()  # it printed the two statistics


def test_seed_002_walkthrough_with_rlhfkit_imports(tmp_path, monkeypatch):
    """The seed's loop, with `trl` swapped for `rlhfkit`, a local model and a reward function."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    monkeypatch.chdir(tmp_path)
    config = PPOConfig(
        model_name=str(tiny_model_path("llama")),
        learning_rate=1.41e-5,
        batch_size=4,
        mini_batch_size=2,
        ppo_epochs=1,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLMWithValueHead.from_pretrained(config.model_name)
    tokenizer = AutoTokenizer.from_pretrained(config.model_name)
    tokenizer.pad_token = tokenizer.eos_token

    keyword = KeywordReward("the")

    def reward_model(texts):  # shaped like a text-classification pipeline's output
        return [[{"label": "NEG", "score": -s}, {"label": "POS", "score": s}] for s in keyword(texts)]

    dataset = Dataset.from_dict({"prompt": toy_prompts("train", n=8), "meta": list(range(8))})
    dataset = dataset.rename_column("prompt", "query").remove_columns(["meta"])

    def tokenize(sample):
        sample["input_ids"] = tokenizer.encode(sample["query"])
        return sample

    dataset = dataset.map(tokenize, batched=False)
    ppo_trainer = PPOTrainer(model=model, config=config, train_dataset=dataset, tokenizer=tokenizer)
    generation_kwargs = {
        "min_length": -1,
        "top_k": 0.0,
        "top_p": 1.0,
        "do_sample": True,
        "pad_token_id": tokenizer.eos_token_id,
        "max_new_tokens": 6,
    }
    all_stats = []
    for _epoch in range(ppo_trainer.config.ppo_epochs):
        for batch in ppo_trainer.dataloader:
            query_tensors = batch["input_ids"]
            response_tensors = ppo_trainer.generate(query_tensors, **generation_kwargs)
            batch["response"] = [tokenizer.decode(r.squeeze()) for r in response_tensors]
            texts = [q + r for q, r in zip(batch["query"], batch["response"])]
            pipe_outputs = reward_model(texts)
            rewards = [torch.tensor(output[1]["score"]) for output in pipe_outputs]
            stats = ppo_trainer.step(query_tensors, response_tensors, rewards)
            ppo_trainer.log_stats(stats, batch, rewards)
            all_stats.append(stats)
    ppo_trainer.save_model("my_ppo_model")
    assert len(all_stats) == 2  # 8 prompts / batch_size 4
    assert (tmp_path / "my_ppo_model" / "value_head.safetensors").is_file()


@pytest.mark.slow
def test_mean_score_rises_on_a_learnable_task():
    """Reward: fraction of response tokens among the 20 tokens the initial model likes best on average.

    The tiny random model gives them ~3% of its probability; PPO must concentrate the policy on them.
    """
    tokenizer = tiny_tokenizer()
    model = tiny_value_head_model("llama", summary_dropout_prob=0.0)
    config = PPOConfig(
        batch_size=32, mini_batch_size=16, ppo_epochs=4, learning_rate=1e-3, init_kl_coef=0.05, seed=0
    )
    trainer = PPOTrainer(config, model, tokenizer=tokenizer)
    queries = [torch.tensor(tokenizer.encode(p)) for p in toy_prompts("train", n=64)]
    ids, mask = pad_left(queries, tokenizer.pad_token_id)
    with torch.no_grad():
        next_token_probs = trainer.policy(input_ids=ids, attention_mask=mask)[0][:, -1].softmax(-1).mean(0)
    favourites = next_token_probs.topk(20).indices

    scores_per_step = []
    for step in range(25):
        batch = [queries[(step * 32 + i) % len(queries)] for i in range(32)]
        responses = trainer.generate(
            batch, return_prompt=False, max_new_tokens=2, do_sample=True, top_k=0, batch_size=32
        )
        response_ids, response_mask = pad_right(responses, tokenizer.pad_token_id)
        hits = (torch.isin(response_ids, favourites) & response_mask).sum(1).float()
        scores = hits / response_mask.sum(1)
        stats = trainer.step(batch, responses, list(scores))
        scores_per_step.append(stats["ppo/mean_scores"])
    start, end = sum(scores_per_step[:5]) / 5, sum(scores_per_step[-3:]) / 3
    print(f"mean score: first 5 steps {start:.3f}, last 3 steps {end:.3f}")
    assert end > 0.3 and end > start + 0.2, scores_per_step
