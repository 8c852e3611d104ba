"""Seed 003 (a Chinese walkthrough of PPO in TRL): its code, with only `trl` -> `rlhfkit`.

The seed leaves `model = ...`, `model_ref = ...`, `tokenizer = ...`, `dataset`, `generation_kwargs` and
`get_reward` to the reader; here they are the tiny GPT-2 (policy and a separately loaded frozen copy),
a few local prompts and a toy reward. Sizes are shrunk (batch_size=256 -> 4). Recorded seed bugs: the
loop reads `config.epochs`, which PPOConfig does not have (TRL neither: it is `ppo_epochs`), and the
line that builds `texts_for_reward` is commented out, so the reward line raises NameError.
Unlike TRL, `step()` also takes the seed's `rewards` as one (B,) tensor (TRL wants a list of tensors).
"""

from __future__ import annotations

import pytest
import torch

PROMPTS = ["the film was", "a story about a dog", "it rained all day and", "my favourite actor", "the end"]


def get_reward(text: str) -> float:
    """The seed's undefined `get_reward`: a toy score, the number of 'good' words."""
    return float(text.count("good"))


def seed_setup():
    """`model = ...`, `model_ref = ...`, `tokenizer = ...`, `dataset`: local stand-ins."""
    from datasets import Dataset

    from rlhfkit.testing import tiny_tokenizer, tiny_value_head_model

    tokenizer = tiny_tokenizer()
    model = tiny_value_head_model("gpt2", summary_dropout_prob=0.0)
    model_ref = tiny_value_head_model("gpt2")  # a frozen copy of the original pretrained model
    dataset = Dataset.from_dict({"query": PROMPTS}).map(lambda s: {"input_ids": tokenizer.encode(s["query"])})
    return model, model_ref, tokenizer, dataset


def make_trainer():
    from rlhfkit import PPOConfig, PPOTrainer

    # 1. 配置 PPO 参数
    config = PPOConfig(
        model_name="gpt2",
        learning_rate=1.41e-5,
        batch_size=4,  # the seed's 256, shrunk
        kl_penalty="kl",  # 指定使用 KL 散度惩罚
        adap_kl_ctrl=True,  # 动态调整 KL 惩罚系数 β
        mini_batch_size=2,
        ppo_epochs=1,  # shrunk
    )
    # 2. 加载模型和分词器
    model, model_ref, tokenizer, dataset = seed_setup()
    # 3. 初始化 PPOTrainer
    ppo_trainer = PPOTrainer(
        config=config, model=model, ref_model=model_ref, tokenizer=tokenizer, dataset=dataset
    )
    return config, ppo_trainer, tokenizer


def test_seed_loop_reads_config_epochs_which_does_not_exist():
    config, ppo_trainer, _ = make_trainer()
    with pytest.raises(AttributeError, match="epochs"):  # the seed's bug, as in TRL
        for epoch in range(config.epochs):  # noqa: B007
            pass
    assert config.ppo_epochs == 1  # the field the seed meant


def test_seed_reward_line_needs_the_commented_out_texts():
    source = "torch.tensor([get_reward(text) for text in texts_for_reward])"
    with pytest.raises(NameError, match="texts_for_reward"):  # the seed comments out its definition
        eval(source, {"torch": torch, "get_reward": get_reward})


def test_working_loop_updates_the_policy_not_the_reference():
    config, ppo_trainer, tokenizer = make_trainer()
    generation_kwargs = {"do_sample": True, "top_k": 0, "max_new_tokens": 6}  # undefined in the seed
    ref_before = {n: p.clone() for n, p in ppo_trainer.ref_model.named_parameters()}
    policy_before = {n: p.clone() for n, p in ppo_trainer.model.named_parameters()}
    all_stats = []
    for _ in range(2):  # two passes over the data, so the second step sees a policy that moved
        for epoch in range(config.ppo_epochs):  # noqa: B007  (the seed's `config.epochs`)
            for batch in ppo_trainer.dataloader:
                # 1. 获取一批 prompt
                query_tensors = batch["input_ids"]
                # 2. 生成 (Rollout)
                response_tensors = ppo_trainer.generate(
                    query_tensors, return_prompt=False, **generation_kwargs
                )
                batch["response"] = tokenizer.batch_decode(response_tensors)
                # 3. 评估 (Evaluation)
                texts_for_reward = [q + r for q, r in zip(batch["query"], batch["response"])]
                rewards = torch.tensor([get_reward(text) for text in texts_for_reward])
                # 4. 更新 (Optimization) - PPO 核心步骤
                stats = ppo_trainer.step(query_tensors, response_tensors, rewards)
                # 打印统计信息
                logs = ppo_trainer.log_stats(stats, batch, rewards)
                all_stats.append(stats)
    assert len(all_stats) == 2 and logs["env/reward_dist"].shape == (4,)
    # the frozen reference never moves; the policy (actor and value head) does
    assert all(torch.equal(p, ref_before[n]) for n, p in ppo_trainer.ref_model.named_parameters())
    assert any(not torch.equal(p, policy_before[n]) for n, p in ppo_trainer.model.named_parameters())
    # the seed's total reward r - β·KL: the KL part of the reward is -β times the summed KL
    for stats in all_stats:
        expected = -stats["objective/kl_coef"] * stats["objective/kl"]
        assert stats["ppo/mean_non_score_reward"] == pytest.approx(expected, abs=1e-6)
    assert all_stats[0]["objective/kl"] == pytest.approx(0.0, abs=1e-5)  # same weights as the reference
    # adap_kl_ctrl=True: β moved after the first step (KL 0 is below the target, so it shrinks)
    assert all_stats[1]["objective/kl_coef"] < all_stats[0]["objective/kl_coef"]
