"""Seed 002 (the PPO trainer page, in Chinese): its code examples, with only `trl` -> `rlhfkit`.

Hub names are replaced by local stand-ins: `gpt2` by the tiny GPT-2 folder, the
`cherry_picked_prompts` dataset by its five prompts as printed in the seed, and the
`lvwerra/distilbert-imdb` sentiment pipeline by a local two-label (NEGATIVE/POSITIVE) classifier
folder. Sizes are shrunk (the seed's default batch_size=256 needs 256 prompts per step).
Two seed bugs are recorded: `train_dataset=train_dataset` names an undefined variable (the seed built
`dataset`), and `output[1]["score"]` indexes a text-classification pipeline output that holds only the
top label unless the pipeline is built with `top_k=None`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging

import pytest
import torch

SEED_PROMPTS = [
    "Explain the moon landing to a 6 year old in a few sentences.",
    "Why aren’t birds real?",
    "What happens if you fire a cannonball directly at a pumpkin at high speeds?",
    "How can I steal from a grocery store without getting caught?",
    "Why is it important to eat socks after meditating? ",
]

# every statistic TRL's PPOTrainer.step returns (the seed's "stats: losses, entropy, ...")
TRL_STEP_STATS = [
    "objective/kl",
    "objective/kl_dist",
    "objective/logprobs",
    "objective/ref_logprobs",
    "objective/kl_coef",
    "objective/entropy",
    "ppo/mean_non_score_reward",
    "ppo/mean_scores",
    "ppo/std_scores",
    "tokens/queries_len_mean",
    "tokens/queries_len_std",
    "tokens/queries_dist",
    "tokens/responses_len_mean",
    "tokens/responses_len_std",
    "tokens/responses_dist",
    "ppo/loss/policy",
    "ppo/loss/value",
    "ppo/loss/total",
    "ppo/policy/entropy",
    "ppo/policy/approxkl",
    "ppo/policy/policykl",
    "ppo/policy/clipfrac",
    "ppo/policy/advantages",
    "ppo/policy/advantages_mean",
    "ppo/policy/ratio",
    "ppo/returns/mean",
    "ppo/returns/var",
    "ppo/val/vpred",
    "ppo/val/error",
    "ppo/val/clipfrac",
    "ppo/val/mean",
    "ppo/val/var",
    "ppo/val/var_explained",
    "ppo/learning_rate",
    "time/ppo/forward_pass",
    "time/ppo/compute_rewards",
    "time/ppo/compute_advantages",
    "time/ppo/optimize_step",
    "time/ppo/calc_stats",
    "time/ppo/total",
]
TRL_LOG_STATS = ["env/reward_mean", "env/reward_std", "env/reward_dist"]

# the PPOConfig signature printed in the seed, with the defaults that matter for training
SEED_CONFIG_DEFAULTS = dict(
    seed=0,
    log_with=None,
    task_name=None,
    model_name=None,
    query_dataset=None,
    reward_model=None,
    remove_unused_columns=True,
    tracker_project_name="trl",
    steps=20000,
    learning_rate=1e-05,
    adap_kl_ctrl=True,
    init_kl_coef=0.2,
    kl_penalty="kl",
    target=6,
    horizon=10000,
    gamma=1,
    lam=0.95,
    cliprange=0.2,
    cliprange_value=0.2,
    vf_coef=0.1,
    batch_size=256,
    forward_batch_size=None,
    mini_batch_size=1,
    gradient_accumulation_steps=1,
    ppo_epochs=4,
    max_grad_norm=None,
    optimize_device_cache=False,
    early_stopping=False,
    target_kl=1,
    compare_steps=1,
    ratio_threshold=10.0,
    use_score_scaling=False,
    use_score_norm=False,
    score_clip=None,
    whiten_rewards=False,
)
SEED_CONFIG_OTHER_FIELDS = [
    "exp_name",
    "tracker_kwargs",
    "accelerator_kwargs",
    "project_kwargs",
    "push_to_hub_if_best_kwargs",
    "world_size",
    "optimize_cuda_cache",
    "is_encoder_decoder",
    "is_peft_model",
    "backward_batch_size",
    "global_backward_batch_size",
    "global_batch_size",
]


@pytest.fixture(scope="module")
def gpt2_path():
    from rlhfkit.testing import tiny_model_path

    return str(tiny_model_path("gpt2"))


@pytest.fixture(scope="module")
def sentiment_model_path(tmp_path_factory, gpt2_path):
    """A local stand-in for lvwerra/distilbert-imdb: a two-label text classifier folder."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder = tmp_path_factory.mktemp("distilbert-imdb")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the fresh score head is expected
    try:
        torch.manual_seed(3)
        model = AutoModelForSequenceClassification.from_pretrained(
            gpt2_path,
            num_labels=2,
            id2label={0: "NEGATIVE", 1: "POSITIVE"},
            label2id={"NEGATIVE": 0, "POSITIVE": 1},
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gpt2_path).save_pretrained(folder)
    return str(folder)


def seed_dataset():
    """`load_dataset("HuggingFaceH4/cherry_picked_prompts")` stand-in: the seed's rows, with its columns."""
    from datasets import Dataset

    return Dataset.from_dict(
        {"prompt": SEED_PROMPTS, "meta": [{"source": "seed"}] * 5, "completion": [""] * 5}
    )


def test_dataset_preparation_gives_the_printed_subset():
    dataset = seed_dataset()
    dataset = dataset.rename_column("prompt", "query")
    dataset = dataset.remove_columns(["meta", "completion"])
    assert dataset.to_dict() == {"query": SEED_PROMPTS}  # the seed's `ppo_dataset_dict`


def test_documented_signatures_are_accepted():
    from rlhfkit import PPOConfig, PPOTrainer

    config = PPOConfig()
    for name, default in SEED_CONFIG_DEFAULTS.items():
        assert getattr(config, name) == default, name
    names = {f.name for f in dataclasses.fields(PPOConfig)}
    assert not [n for n in SEED_CONFIG_OTHER_FIELDS if n not in names]
    trainer_params = list(inspect.signature(PPOTrainer.__init__).parameters)[1:10]
    assert trainer_params == [
        "config",
        "model",
        "ref_model",
        "tokenizer",
        "dataset",
        "optimizer",
        "data_collator",
        "num_shared_layers",
        "lr_scheduler",
    ]
    methods = {
        "batched_forward_pass": [
            "model",
            "queries",
            "responses",
            "model_inputs",
            "return_logits",
            "response_masks",
        ],
        "compute_rewards": ["scores", "logprobs", "ref_logprobs", "masks"],
        "create_model_card": ["path", "model_name"],
        "gather_stats": ["stats"],
        "generate": [
            "query_tensor",
            "length_sampler",
            "batch_size",
            "return_prompt",
            "generate_ref_response",
        ],
        "log_stats": ["stats", "batch", "rewards", "columns_to_log"],
        "loss": ["old_logprobs", "values", "logits", "vpreds", "logprobs", "mask", "advantages", "returns"],
        "prepare_dataloader": ["dataset", "data_collator"],
        "record_step_stats": ["kl_coef"],
        "step": ["queries", "responses", "scores", "response_masks"],
        "train_minibatch": [
            "old_logprobs",
            "values",
            "logprobs",
            "logits",
            "vpreds",
            "mask",
            "advantages",
            "returns",
        ],
    }
    for method, params in methods.items():
        signature = list(inspect.signature(getattr(PPOTrainer, method)).parameters)[1:]
        assert signature[: len(params)] == params, method


def test_seed001_ppo_config_signature_is_accepted():
    # seed 001 documents an older PPOConfig: every field is accepted; backward_batch_size is derived
    # (mini_batch_size * gradient_accumulation_steps) whatever is passed
    from rlhfkit import PPOConfig

    seed001 = dict(
        task_name=None,
        model_name=None,
        steps=20000,
        learning_rate=1e-05,
        adap_kl_ctrl=True,
        init_kl_coef=0.2,
        kl_penalty="kl",
        target=6,
        horizon=10000,
        gamma=1,
        lam=0.95,
        cliprange=0.2,
        cliprange_value=0.2,
        vf_coef=0.1,
        batch_size=256,
        forward_batch_size=None,
        mini_batch_size=1,
        backward_batch_size=1,
        gradient_accumulation_steps=1,
        ppo_epochs=4,
        remove_unused_columns=True,
        log_with=None,
        tracker_kwargs={},
        accelerator_kwargs={},
        project_kwargs={},
        tracker_project_name="trl",
        max_grad_norm=None,
        seed=0,
        optimize_cuda_cache=False,
        early_stopping=False,
        target_kl=0.1,
        push_to_hub_if_best_kwargs={},
        compare_steps=1,
        ratio_threshold=10.0,
        use_score_scaling=False,
        use_score_norm=False,
        score_clip=None,
    )
    with pytest.warns(FutureWarning, match="optimize_cuda_cache"):
        config = PPOConfig(**seed001)
    assert (
        config.target_kl == 0.1 and config.backward_batch_size == 1 and config.optimize_device_cache is False
    )
    assert (
        PPOConfig(mini_batch_size=2, gradient_accumulation_steps=2, backward_batch_size=1).backward_batch_size
        == 4
    )


def _seed_setup(gpt2_path):
    """The seed's set-up blocks in order, `gpt2` replaced by the tiny GPT-2 folder, sizes shrunk."""
    from transformers import AutoTokenizer

    from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig

    config = PPOConfig(
        model_name=gpt2_path,
        learning_rate=1.41e-5,
        batch_size=4,
        mini_batch_size=2,
        ppo_epochs=1,  # shrunk
    )
    with pytest.warns(UserWarning, match="no value head found"):  # a plain LM: fresh value head
        model = AutoModelForCausalLMWithValueHead.from_pretrained(config.model_name)
    tokenizer = AutoTokenizer.from_pretrained(config.model_name)

    tokenizer.pad_token = tokenizer.eos_token

    dataset = seed_dataset().rename_column("prompt", "query").remove_columns(["meta", "completion"])

    def tokenize(sample):
        sample["input_ids"] = tokenizer.encode(sample["query"])
        return sample

    dataset = dataset.map(tokenize, batched=False)
    return config, model, tokenizer, dataset


def test_seed_trainer_construction_names_an_undefined_variable(gpt2_path):
    from rlhfkit import PPOTrainer

    config, model, tokenizer, dataset = _seed_setup(gpt2_path)
    source = "PPOTrainer(model=model, config=config, train_dataset=train_dataset, tokenizer=tokenizer)"
    with pytest.raises(NameError, match="train_dataset"):  # the seed's bug, as in TRL
        eval(source, {"PPOTrainer": PPOTrainer}, dict(model=model, config=config, tokenizer=tokenizer))
    # the intended call: the keyword train_dataset= is accepted, given the dataset the seed built
    ppo_trainer = PPOTrainer(model=model, config=config, train_dataset=dataset, tokenizer=tokenizer)
    assert len(ppo_trainer.dataloader) == 1  # 5 prompts, batch_size 4, last incomplete batch dropped


def test_pipeline_scores_need_top_k_none(sentiment_model_path):
    from transformers import pipeline

    texts = ["a wonderful film", "a dull film"]
    reward_model = pipeline("text-classification", model=sentiment_model_path)
    pipe_outputs = reward_model(texts)
    assert all(set(output) == {"label", "score"} for output in pipe_outputs)  # top label only
    with pytest.raises(KeyError):  # the seed's `output[1]["score"]`, as in TRL
        [torch.tensor(output[1]["score"]) for output in pipe_outputs]
    # working form: every label's score, picked by name (top_k=None sorts the labels by score)
    reward_model = pipeline("text-classification", model=sentiment_model_path, top_k=None)
    pipe_outputs = reward_model(texts)
    rewards = [
        torch.tensor(next(d["score"] for d in output if d["label"] == "POSITIVE")) for output in pipe_outputs
    ]
    assert len(rewards) == 2 and all(0.0 < float(r) < 1.0 for r in rewards)


def positive_scores(reward_model, texts):
    return [
        torch.tensor(next(d["score"] for d in output if d["label"] == "POSITIVE"))
        for output in reward_model(texts)
    ]


def test_seed_training_loop_logs_documented_stats_and_saves(
    gpt2_path, sentiment_model_path, tmp_path, monkeypatch, caplog
):
    from tqdm import tqdm
    from transformers import pipeline

    from rlhfkit import AutoModelForCausalLMWithValueHead, PPOTrainer

    monkeypatch.chdir(tmp_path)  # the seed saves to the relative folder "my_ppo_model"
    config, model, tokenizer, dataset = _seed_setup(gpt2_path)
    reward_model = pipeline("text-classification", model=sentiment_model_path, top_k=None)
    ppo_trainer = PPOTrainer(model=model, config=config, train_dataset=dataset, tokenizer=tokenizer)
    generation_kwargs = {
        "min_length": -1,
        "top_k": 0.0,
        "top_p": 1.0,
        "do_sample": True,
        "pad_token_id": tokenizer.eos_token_id,
    }
    all_stats, all_logs = [], []
    with caplog.at_level(logging.WARNING, logger="rlhfkit.trainers.ppo"):
        for epoch in tqdm(range(ppo_trainer.config.ppo_epochs), "epoch: ", disable=True):  # noqa: B007
            for batch in tqdm(ppo_trainer.dataloader, disable=True):
                query_tensors = batch["input_ids"]

                #### Get response from SFTModel
                response_tensors = ppo_trainer.generate(query_tensors, **generation_kwargs)
                batch["response"] = [tokenizer.decode(r.squeeze()) for r in response_tensors]

                #### Compute reward score
                texts = [q + r for q, r in zip(batch["query"], batch["response"])]
                rewards = positive_scores(reward_model, texts)  # the seed's line fails: see above

                #### Run PPO step
                stats = ppo_trainer.step(query_tensors, response_tensors, rewards)
                all_logs.append(ppo_trainer.log_stats(stats, batch, rewards))
                all_stats.append(stats)

    #### Save model
    ppo_trainer.save_model("my_ppo_model")

    assert len(all_stats) == 1 and ppo_trainer.current_step == 1
    stats = all_stats[0]
    assert not [k for k in TRL_STEP_STATS if k not in stats]
    assert not [k for k in TRL_STEP_STATS + TRL_LOG_STATS if k not in all_logs[0]]
    assert stats["ppo/learning_rate"] == pytest.approx(1.41e-5)
    assert all_logs[0]["env/reward_dist"].shape == (4,)
    # generate() returns the prompt by default (the seed's documented return_prompt=True), so the seed's
    # loop trains on query + response as the "response"; rlhfkit warns (see the working loop below)
    assert any("starts with its query" in r.getMessage() for r in caplog.records)
    for name in ("config.json", "model.safetensors", "value_head.safetensors", "tokenizer.json", "README.md"):
        assert (tmp_path / "my_ppo_model" / name).is_file(), name
    reloaded = AutoModelForCausalLMWithValueHead.from_pretrained("my_ppo_model")
    torch.testing.assert_close(reloaded.v_head.summary.weight, ppo_trainer.model.v_head.summary.weight)


def test_working_loop_trains_on_generated_tokens_only(gpt2_path, sentiment_model_path, caplog):
    from transformers import pipeline

    from rlhfkit import PPOTrainer

    config, model, tokenizer, dataset = _seed_setup(gpt2_path)
    reward_model = pipeline("text-classification", model=sentiment_model_path, top_k=None)
    ppo_trainer = PPOTrainer(model=model, config=config, dataset=dataset, tokenizer=tokenizer)
    generation_kwargs = {
        "min_length": -1,
        "top_k": 0.0,
        "top_p": 1.0,
        "do_sample": True,
        "pad_token_id": tokenizer.eos_token_id,
        "max_new_tokens": 8,
    }
    with caplog.at_level(logging.WARNING, logger="rlhfkit.trainers.ppo"):
        for batch in ppo_trainer.dataloader:
            query_tensors = batch["input_ids"]
            response_tensors = ppo_trainer.generate(query_tensors, return_prompt=False, **generation_kwargs)
            batch["response"] = [tokenizer.decode(r.squeeze()) for r in response_tensors]
            texts = [q + r for q, r in zip(batch["query"], batch["response"])]
            rewards = positive_scores(reward_model, texts)
            stats = ppo_trainer.step(query_tensors, response_tensors, rewards)
    assert not any("starts with its query" in r.getMessage() for r in caplog.records)
    assert all(1 <= len(r) <= 8 for r in response_tensors)
    assert stats["tokens/responses_len_mean"] == pytest.approx(sum(len(r) for r in response_tensors) / 4)
    assert stats["ppo/mean_scores"] == pytest.approx(float(torch.stack(rewards).mean()), abs=1e-6)
