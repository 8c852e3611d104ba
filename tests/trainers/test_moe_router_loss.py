"""TRL 1.x's `router_aux_loss_coef` (`trainers.common.moe`): a mixture-of-experts policy's load-balancing
loss, added to SFT's, DPO's, KTO's, GRPO's and RLOO's losses with the resolved coefficient, and logged.

The policy is a tiny Qwen3-MoE built here from its config (2 layers, 4 experts, 2 per token, hidden 32).
"""

from __future__ import annotations

import copy

import datasets
import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.common.moe import RouterAuxLoss
from rlhfkit.trainers.dpo import DPOConfig, DPOTrainer
from rlhfkit.trainers.grpo import GRPOConfig, GRPOTrainer
from rlhfkit.trainers.kto import KTOConfig, KTOTrainer
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

DOCS = ["the cat sat on the mat", "a dog ran", "hello there friend", "birds sing in the morning"]
PAIRS = [
    {"prompt": "Q: hi ", "chosen": "fine thanks", "rejected": "no"},
    {"prompt": "Q: name ", "chosen": "bob", "rejected": "who knows"},
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def tiny_moe(tok, coef: float = 0.01, seed: int = 0) -> Qwen3MoeForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
        num_experts_per_tok=2, router_aux_loss_coef=coef, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    return Qwen3MoeForCausalLM(config).float()


def _sft(tmp_path, tok, model, **config):
    args = few_step_args(SFTConfig, tmp_path / "sft", per_device_train_batch_size=2, **config)
    rows = datasets.Dataset.from_list([{"text": t} for t in DOCS])
    return SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tok)


def _router_weights(model):
    return [m.weight for name, m in model.named_modules() if name.endswith("mlp.gate")]


# --- the coefficient --------------------------------------------------------------------------------------


def test_coefficient_resolves_from_the_config_and_zero_turns_it_off(tok):
    moe = tiny_moe(tok, coef=0.02)
    assert RouterAuxLoss.resolve(moe, None, "T") == RouterAuxLoss(0.02, True, True)
    assert RouterAuxLoss.resolve(moe, 0.5, "T") == RouterAuxLoss(0.5, True, True)
    assert RouterAuxLoss.resolve(moe, 0.0, "T").enabled is False
    assert RouterAuxLoss.resolve(tiny_model("llama"), None, "T").enabled is False


def test_a_coefficient_for_a_model_without_routers_is_an_error(tmp_path, tok):
    with pytest.raises(ValueError, match="router_aux_loss_coef=0.1.*not a mixture-of-experts"):
        _sft(tmp_path, tok, tiny_model("llama"), router_aux_loss_coef=0.1)
    with pytest.raises(ValueError, match="router_aux_loss_coef must be a number >= 0"):
        SFTConfig(output_dir=str(tmp_path), router_aux_loss_coef=-1.0)


def test_kto_config_accepts_a_coefficient():
    assert KTOConfig(output_dir="x", router_aux_loss_coef=0.3).router_aux_loss_coef == 0.3


# --- SFT: the loss by hand --------------------------------------------------------------------------------


def test_sft_loss_is_cross_entropy_plus_coef_times_the_models_balancing_loss(tmp_path, tok):
    model = tiny_moe(tok, coef=0.001)  # the model's own coefficient must not be the one added
    trainer = _sft(tmp_path, tok, model, router_aux_loss_coef=0.5)
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.5
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(2)]))
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, batch)

    forward = {k: v for k, v in batch.items() if k != "labels"}
    out = model(**forward, output_router_logits=True)
    labels = batch["labels"][:, 1:]
    cross_entropy = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert out.aux_loss > 0
    torch.testing.assert_close(loss, cross_entropy + 0.5 * out.aux_loss)

    # the balancing term reaches the routers: their gradient differs from the plain loss's by 0.5 x aux's
    def router_grads(value):
        model.zero_grad()
        value.backward(retain_graph=True)
        return [w.grad.clone() for w in _router_weights(model)]

    with_aux, plain, aux_only = router_grads(loss), router_grads(cross_entropy), router_grads(out.aux_loss)
    for a, p, x in zip(with_aux, plain, aux_only):
        assert x.abs().sum() > 0
        torch.testing.assert_close(a - p, 0.5 * x, atol=1e-6, rtol=1e-4)


def test_sft_chunked_path_adds_the_same_term(tmp_path, tok, monkeypatch):
    from rlhfkit.trainers.sft import trainer as sft_module

    model = tiny_moe(tok)
    trainer = _sft(tmp_path, tok, model, router_aux_loss_coef=0.5)
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(2)]))
    full = trainer.compute_loss(trainer.model, batch)
    monkeypatch.setattr(sft_module, "prefers_chunked_head", lambda *a, **k: True)
    chunked = trainer.compute_loss(trainer.model, batch)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)


def test_sft_training_logs_aux_loss_and_zero_turns_it_off(tmp_path, tok):
    on = _sft(tmp_path, tok, tiny_moe(tok), router_aux_loss_coef=0.1)
    on.train()
    logged = [h["aux_loss"] for h in on.state.log_history if "aux_loss" in h]
    assert len(logged) == 2 and all(v > 0 for v in logged)

    model = tiny_moe(tok)
    model.config.output_router_logits = True  # the trainer tells the model not to, when off
    off = _sft(tmp_path, tok, model, router_aux_loss_coef=0.0)
    assert not off.aux_loss_enabled
    batch = off._prepare_inputs(off.data_collator([off.train_dataset[i] for i in range(2)]))
    loss = off.compute_loss(off.model, batch)
    plain = model(**batch, output_router_logits=False).loss
    torch.testing.assert_close(loss, plain)
    off.train()
    assert not any("aux_loss" in h for h in off.state.log_history)


# --- DPO and KTO: the term is the only difference --------------------------------------------------------


def _difference_is_coef_times_logged_aux(make, batch_of):
    """loss(coef 0.5) - loss(coef 0) on the same weights and batch = 0.5 x the aux_loss it logs."""
    on, off = make(0.5), make(0.0)
    batch = batch_of(on)
    loss_on, metrics, _ = on._loss_metrics_rewards(on.model, batch, "train")
    loss_off, metrics_off, _ = off._loss_metrics_rewards(off.model, batch, "train")
    assert "aux_loss" not in metrics_off and float(metrics["aux_loss"]) > 0
    torch.testing.assert_close(loss_on - loss_off, 0.5 * metrics["aux_loss"], atol=1e-6, rtol=1e-4)


def test_dpo_adds_coef_times_the_balancing_loss(tmp_path, tok):
    base = tiny_moe(tok)
    rows = datasets.Dataset.from_list(PAIRS)

    def make(coef):
        args = few_step_args(DPOConfig, tmp_path / "dpo", max_length=32, router_aux_loss_coef=coef)
        return DPOTrainer(model=copy.deepcopy(base), args=args, train_dataset=rows, processing_class=tok)

    batch_of = lambda t: t._prepare_inputs(next(iter(t.get_train_dataloader())))  # noqa: E731
    _difference_is_coef_times_logged_aux(make, batch_of)


def test_kto_adds_coef_times_the_balancing_loss(tmp_path, tok):
    base = tiny_moe(tok)
    rows = datasets.Dataset.from_list(
        [
            {"prompt": p["prompt"], "completion": p["chosen"], "label": i % 2 == 0}
            for i, p in enumerate(PAIRS * 2)
        ]
    )

    def make(coef):
        args = few_step_args(KTOConfig, tmp_path / "kto", max_length=32, router_aux_loss_coef=coef)
        return KTOTrainer(model=copy.deepcopy(base), args=args, train_dataset=rows, processing_class=tok)

    batch_of = lambda t: t._prepare_inputs(next(iter(t.get_train_dataloader())))  # noqa: E731
    _difference_is_coef_times_logged_aux(make, batch_of)


# --- GRPO and RLOO (current form): logged, and it moves the routers --------------------------------------


def _prompts():
    return datasets.Dataset.from_list([{"prompt": f"count {w}"} for w in ("a", "b", "c", "d")])


@pytest.mark.parametrize("trainer_name", ["grpo", "rloo"])
def test_online_trainers_log_aux_loss_and_it_moves_the_routers(tmp_path, tok, trainer_name):
    from rlhfkit.trainers.rloo import RLOOConfig, RLOOTrainer

    config_cls, trainer_cls = (
        (GRPOConfig, GRPOTrainer) if trainer_name == "grpo" else (RLOOConfig, RLOOTrainer)
    )

    def run(coef):
        args = config_cls(
            output_dir=str(tmp_path / trainer_name), report_to="none", use_cpu=True,
            per_device_train_batch_size=4, num_generations=2, max_completion_length=4, max_steps=1,
            logging_steps=10, save_strategy="no", disable_tqdm=True, seed=3, learning_rate=1e-2,
            router_aux_loss_coef=coef,
        )  # fmt: skip
        reward = lambda completions, **kw: [float(len(c)) for c in completions]  # noqa: E731
        trainer = trainer_cls(
            tiny_moe(tok), reward, args=args, train_dataset=_prompts(), processing_class=tok
        )
        trainer.train()
        return trainer

    on = run(0.5)
    assert on.aux_loss_enabled and on.model.model_tags == ["rlhfkit", trainer_name]
    # no update reached logging_steps: the run's last entry carries their metrics, as TRL's does
    last = on.state.log_history[-1]
    assert "train_loss" in last and last["aux_loss"] > 0
    off = run(0.0)
    assert not any("aux_loss" in h for h in off.state.log_history)
    moved = [not torch.equal(a, b) for a, b in zip(_router_weights(on.model), _router_weights(off.model))]
    assert all(moved)  # the same seed and data: only the balancing term differs


@pytest.mark.parametrize("name", ["sft", "dpo", "kto", "grpo", "rloo"])
def test_the_command_line_takes_the_coefficient(tmp_path, name):
    from rlhfkit.commands._args import parse_args
    from rlhfkit.trainers.rloo import RLOOConfig

    config_cls = {"sft": SFTConfig, "dpo": DPOConfig, "kto": KTOConfig, "grpo": GRPOConfig}
    config_cls["rloo"] = RLOOConfig
    argv = ["--output_dir", str(tmp_path), "--router_aux_loss_coef", "0.25"]
    (config,) = parse_args((config_cls[name],), argv, "test", "")
    assert config.router_aux_loss_coef == 0.25
    if name == "rloo":
        assert config.form == "current"  # a field only TRL 1.x's form reads
