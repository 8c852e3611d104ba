"""A reward model given by its folder reads text encoded with the folder's own tokenizer (as TRL and
`rlhfkit judge` do), on every entry point: GRPO's `reward_funcs` paths (and so `rlhfkit grpo
--reward_model_name_or_path`), `rlhfkit rloo --reward_model_path`, `rlhfkit ppo --reward`. One without a
tokenizer reads the policy's token ids, and one whose vocabulary is too small for them is refused when the
scorer is built, naming both sizes."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from rlhfkit.rewards.reward_models import folder_tokenizer, load_reward_model
from rlhfkit.rewards.scoring import RewardScorer
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer
from rlhfkit.testing.tokenizer import EOS_TOKEN, PAD_TOKEN, corpus_text

SMALL_VOCAB = 300


def _small_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=SMALL_VOCAB, special_tokens=[PAD_TOKEN, EOS_TOKEN], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    backend.train_from_iterator(corpus_text().splitlines(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, padding_side="right",
        model_input_names=["input_ids", "attention_mask"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def small_reward(tmp_path_factory):
    """(folder with its own ~300-token tokenizer, the same model's folder without a tokenizer)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tokenizer = _small_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, num_labels=1,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    root = tmp_path_factory.mktemp("small_reward")
    with_tokenizer, bare = root / "with_tokenizer", root / "bare"
    LlamaForSequenceClassification(config).save_pretrained(with_tokenizer)
    shutil.copytree(with_tokenizer, bare)
    tokenizer.save_pretrained(with_tokenizer)
    return with_tokenizer, bare


def test_the_small_reward_model_really_has_a_smaller_vocabulary(small_reward):
    with_tokenizer, bare = small_reward
    assert len(folder_tokenizer(with_tokenizer)) < len(tiny_tokenizer())
    assert folder_tokenizer(bare) is None


def test_grpo_reward_model_path_reads_its_own_tokenizer(tmp_path, small_reward):
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=5, max_steps=1, save_strategy="no", disable_tqdm=True,
        seed=3, logging_steps=1,
    )  # fmt: skip
    trainer = GRPOTrainer(
        tiny_model("llama"), [str(small_reward[0])], args=args, train_dataset=toy_prompt_dataset(n=16),
        processing_class=tiny_tokenizer(padding_side="left"),
    )  # fmt: skip
    assert len(trainer.scorer.tokenizers[0]) == len(folder_tokenizer(small_reward[0]))
    trainer.train()  # today: IndexError in the reward model's embedding
    logs = trainer.state.log_history[0]
    assert torch.isfinite(torch.tensor(logs["reward"]))


def test_grpo_reward_model_name_in_the_hub_cache_reads_its_own_tokenizer(tmp_path, small_reward, monkeypatch):
    """`reward_funcs="org/name"` (TRL's tests name hub reward models so): the model and its tokenizer both
    come from the local hub cache; before, the name's tokenizer was never looked up and the small
    reward model was refused for the policy's larger vocabulary."""
    from huggingface_hub import constants

    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    repo = tmp_path / "hub" / "models--Org--small-reward"
    shutil.copytree(small_reward[0], repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert len(folder_tokenizer("Org/small-reward")) == SMALL_VOCAB
    assert folder_tokenizer("Org/not-cached") is None
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=4,
        num_generations=4, max_completion_length=5, max_steps=1, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    trainer = GRPOTrainer(
        tiny_model("llama"), "Org/small-reward", args=args, train_dataset=toy_prompt_dataset(n=8),
        processing_class=tiny_tokenizer(padding_side="left"),
    )  # fmt: skip
    assert len(trainer.scorer.tokenizers[0]) == SMALL_VOCAB


def test_grpo_reward_model_path_without_tokenizer_and_a_smaller_vocabulary(tmp_path, small_reward):
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, max_steps=1, max_completion_length=5
    )
    with pytest.raises(
        ValueError, match=rf"vocabulary of {SMALL_VOCAB} tokens.*policy tokenizer's {len(tiny_tokenizer())}"
    ):
        GRPOTrainer(
            tiny_model("llama"), [str(small_reward[1])], args=args, train_dataset=toy_prompt_dataset(n=16),
            processing_class=tiny_tokenizer(padding_side="left"),
        )  # fmt: skip


def test_reward_scorer_refuses_a_reward_model_that_cannot_read_the_policy_ids(small_reward):
    model, tokenizer = load_reward_model(small_reward[1])
    assert tokenizer is None
    policy_tokenizer = tiny_tokenizer()
    with pytest.raises(
        ValueError, match=rf"vocabulary of {SMALL_VOCAB} tokens.*tokenizer's {len(policy_tokenizer)}"
    ):
        RewardScorer(model, policy_tokenizer)
    # with its own tokenizer it reads text and scores
    model, tokenizer = load_reward_model(small_reward[0])
    scorer = RewardScorer(model, policy_tokenizer, tokenizer)
    scores, _ = scorer.score_texts(["the movie was"], [" great"])
    assert scores.shape == (1,) and torch.isfinite(scores).all()
    # a reward model with the policy's vocabulary reads its ids, as before
    RewardScorer(tiny_model("llama-reward"), policy_tokenizer)


def test_ppo_command_reward_model_uses_its_own_tokenizer_or_the_policy_ids(small_reward):
    from rlhfkit.commands.ppo import reward_scorer

    policy_tokenizer = tiny_tokenizer()
    scorer = reward_scorer(SimpleNamespace(reward=str(small_reward[0])), None, policy_tokenizer, "cpu")
    assert len(scorer.tokenizers[0]) == len(folder_tokenizer(small_reward[0]))
    queries = [torch.tensor(policy_tokenizer.encode("the movie was"))]
    responses = [torch.tensor(policy_tokenizer.encode(" great fun"))]
    scores, _ = scorer.score_responses(queries, responses)
    assert torch.isfinite(scores).all()
    with pytest.raises(
        ValueError, match=rf"vocabulary of {SMALL_VOCAB} tokens"
    ):  # today: OSError, no tokenizer
        reward_scorer(SimpleNamespace(reward=str(small_reward[1])), None, policy_tokenizer, "cpu")


def test_rloo_command_reward_model_with_its_own_tokenizer(tmp_path, small_reward, capsys):
    from rlhfkit.commands.rloo import main

    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"Say something about item {i}:"}) + "\n" for i in range(8))
    )
    policy = str(tiny_model_path("llama"))
    code = main([
        "--dataset_name", str(data), "--dataset_train_split", "train", "--model_name_or_path", policy,
        "--sft_model_path", policy, "--reward_model_path", str(small_reward[0]),
        "--output_dir", str(tmp_path / "run"), "--num_sample_generations", "0",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--total_episodes", "4",
        "--response_length", "4", "--num_ppo_epochs", "1", "--report_to", "none", "--use_cpu",
        "--logging_steps", "1", "--save_strategy", "no", "--disable_tqdm", "true",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err[-2000:]
    assert "1 updates" in capsys.readouterr().out
