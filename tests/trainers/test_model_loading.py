"""How the trainers load what TRL 1.x users hand them: a model path trains in float32 unless
`model_init_kwargs` says otherwise, and a model object loaded from a local folder brings its tokenizer."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model_path


def count_e(completions, **kwargs):
    return [float(c.count("e")) for c in completions]


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory):
    """The tiny Llama saved in bfloat16, with its tokenizer."""
    folder = tmp_path_factory.mktemp("bf16-llama")
    AutoModelForCausalLM.from_pretrained(tiny_model_path("llama"), dtype=torch.bfloat16).save_pretrained(
        folder
    )
    AutoTokenizer.from_pretrained(tiny_model_path("llama")).save_pretrained(folder)
    return str(folder)


def _grpo(tmp_path, model, **kwargs):
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=4, max_steps=1, save_strategy="no",
                      disable_tqdm=True, **kwargs)  # fmt: skip
    return GRPOTrainer(model=model, reward_funcs=count_e, args=args, train_dataset=toy_prompt_dataset(n=8))


def test_a_bfloat16_checkpoint_trains_in_float32_by_default(tmp_path, bf16_folder):
    trainer = _grpo(tmp_path, bf16_folder)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    kept = _grpo(tmp_path, bf16_folder, model_init_kwargs={"dtype": torch.bfloat16})
    assert {p.dtype for p in kept.model.parameters()} == {torch.bfloat16}
    sft = SFTTrainer(model=bf16_folder, args=SFTConfig(output_dir=str(tmp_path), report_to="none"),
                     train_dataset=Dataset.from_dict({"text": ["a b c"] * 4}),
                     processing_class=AutoTokenizer.from_pretrained(bf16_folder))  # fmt: skip
    assert {p.dtype for p in sft.model.parameters()} == {torch.float32}


def test_a_model_object_brings_the_tokenizer_of_its_folder(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path("llama"))
    trainer = _grpo(tmp_path, model)  # no processing_class
    assert trainer.processing_class is not None
    assert (
        trainer.processing_class.get_vocab()
        == AutoTokenizer.from_pretrained(tiny_model_path("llama")).get_vocab()
    )
    trainer.train()
    assert trainer.state.global_step == 1


def test_trust_remote_code_reaches_from_pretrained(tmp_path, monkeypatch):
    seen = []
    original = AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, path, *args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return original(cls, path, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    _grpo(tmp_path, str(tiny_model_path("llama")))
    _grpo(tmp_path, str(tiny_model_path("llama")), trust_remote_code=True)
    # model_init_kwargs, when they say it, win over the field
    _grpo(tmp_path, str(tiny_model_path("llama")), trust_remote_code=True,
          model_init_kwargs={"trust_remote_code": False})  # fmt: skip
    assert seen == [False, True, False]


def test_shuffle_dataset_false_draws_the_prompts_in_order(tmp_path):
    seen = []

    def spy(prompts, completions, **kwargs):
        seen.extend(prompts[::4])  # one per group of 4 completions
        return [0.0] * len(completions)

    dataset = toy_prompt_dataset(n=8)
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=3, max_steps=3, save_strategy="no",
                      disable_tqdm=True, shuffle_dataset=False)  # fmt: skip
    model = str(tiny_model_path("llama"))
    GRPOTrainer(model=model, reward_funcs=spy, args=args, train_dataset=dataset).train()
    assert seen == dataset["prompt"][:6]  # two prompts per update, in the dataset's order
