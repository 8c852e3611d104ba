"""PPOTrainer methods on tiny offline models: generate, step, rewards, advantages, loss, stats, logging."""

from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path

import pytest
import torch

from rlhfkit import (
    AutoModelForCausalLMWithValueHead,
    AutoModelForSeq2SeqLMWithValueHead,
    PPOConfig,
    PPOTrainer,
)
from rlhfkit.core.losses import ppo_policy_loss, ppo_value_loss
from rlhfkit.rollout import LengthSampler, forward_response
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.testing import tiny_model_path, tiny_tokenizer, tiny_value_head_model

DOCUMENTED_KEYS = [
    "objective/kl",
    "objective/kl_dist",
    "objective/kl_coef",
    "objective/entropy",
    "objective/logprobs",
    "objective/ref_logprobs",
    "ppo/mean_scores",
    "ppo/std_scores",
    "ppo/mean_non_score_reward",
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
    "tokens/queries_len_mean",
    "tokens/queries_len_std",
    "tokens/queries_dist",
    "tokens/responses_len_mean",
    "tokens/responses_len_std",
    "tokens/responses_dist",
    "time/ppo/forward_pass",
    "time/ppo/compute_rewards",
    "time/ppo/compute_advantages",
    "time/ppo/optimize_step",
    "time/ppo/calc_stats",
    "time/ppo/total",
    # debugging extras
    "ppo/policy/ratio_mean",
    "ppo/policy/ratio_var",
    "ppo/skipped_minibatches",
    "ppo/early_stopped",
    "ppo/optimizer_steps",
]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def base_model():
    return tiny_value_head_model("llama", summary_dropout_prob=0.0)


def make_trainer(base_model, tokenizer, **config_kwargs):
    kwargs = dict(batch_size=4, mini_batch_size=2, ppo_epochs=1, learning_rate=1e-3, seed=0)
    kwargs.update(config_kwargs)
    return PPOTrainer(PPOConfig(**kwargs), copy.deepcopy(base_model), tokenizer=tokenizer)


def fake_rollout(n=4, seed=0, vocab=900):
    """Queries and responses of different lengths (token ids >= 10 avoid the special tokens)."""
    g = torch.Generator().manual_seed(seed)
    queries = [torch.randint(10, vocab, (3 + i % 3,), generator=g) for i in range(n)]
    responses = [torch.randint(10, vocab, (2 + (i * 2) % 5,), generator=g) for i in range(n)]
    scores = [torch.tensor(float(i) - 1.5) for i in range(n)]
    return queries, responses, scores


def trainable_snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


# ---------------------------------------------------------------------------------------- construction
def test_constructor_rejects_bad_arguments(base_model, tokenizer):
    config = PPOConfig(batch_size=4, mini_batch_size=2)
    with pytest.raises(TypeError, match="value head"):
        PPOTrainer(config, base_model.pretrained_model, tokenizer=tokenizer)
    with pytest.raises(TypeError, match="tokenizer"):
        PPOTrainer(config, copy.deepcopy(base_model))
    with pytest.raises(TypeError, match="PPOConfig"):
        PPOTrainer({"batch_size": 4}, copy.deepcopy(base_model), tokenizer=tokenizer)


def test_dataloader_from_a_dataset_with_token_lists(base_model, tokenizer):
    from datasets import Dataset

    texts = [f"prompt number {i}" for i in range(10)]
    dataset = Dataset.from_dict({"query": texts, "meta": list(range(10))})
    dataset = dataset.map(lambda s: {"input_ids": tokenizer.encode(s["query"])})
    # seed 002 passes the prompts as train_dataset=
    trainer = PPOTrainer(
        PPOConfig(batch_size=4, mini_batch_size=2),
        copy.deepcopy(base_model),
        tokenizer=tokenizer,
        train_dataset=dataset,
    )
    batches = list(trainer.dataloader)
    assert len(batches) == 2  # 10 // 4, the incomplete batch is dropped
    batch = batches[0]
    assert set(batch) == {"query", "input_ids"}  # "meta" is not used by the model: removed
    assert all(
        isinstance(t, torch.Tensor) and t.dtype == torch.long and t.dim() == 1 for t in batch["input_ids"]
    )
    assert [tokenizer.decode(t) for t in batch["input_ids"]] == batch["query"]


# ---------------------------------------------------------------------------------------- generate
def test_generate_returns_unpadded_responses_cut_at_eos(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer)
    queries = [torch.tensor(tokenizer.encode(t)) for t in ["the film", "a very long story about", "it"]]
    # make the greedy next token of query 0 the stop token, so a cut certainly happens
    stop = int(trainer.policy(input_ids=queries[0][None])[0][0, -1].argmax())
    torch.manual_seed(0)
    responses = trainer.generate(
        queries, batch_size=2, return_prompt=False, max_new_tokens=6, do_sample=False, eos_token_id=stop
    )
    assert isinstance(responses, list) and len(responses) == 3
    assert responses[0].tolist() == [stop]  # greedy: stop first, everything after it is dropped
    for r in responses:
        assert r.dim() == 1 and 1 <= len(r) <= 6
        hits = (r == stop).nonzero().flatten()
        assert len(hits) == 0 or hits[0] == len(r) - 1  # nothing after the first stop token
    with_prompt = trainer.generate(
        queries, batch_size=2, max_new_tokens=6, do_sample=False, eos_token_id=stop
    )
    for q, r, full in zip(queries, responses, with_prompt):
        assert torch.equal(full, torch.cat([q, r]))


def test_generate_single_query_length_sampler_and_reference(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer)
    query = torch.tensor(tokenizer.encode("the film was"))
    out = trainer.generate(query, max_new_tokens=4, do_sample=True)
    assert out.dim() == 2 and out.shape[0] == 1 and torch.equal(out[0, : len(query)], query)
    queries = [query] * 5
    responses = trainer.generate(
        queries,
        length_sampler=LengthSampler(2, 4),
        return_prompt=False,
        do_sample=True,
        min_length=-1,
        top_k=0.0,
        top_p=1.0,
        pad_token_id=tokenizer.eos_token_id,
    )
    assert all(1 <= len(r) <= 3 for r in responses)
    responses, ref_responses = trainer.generate(
        queries, return_prompt=False, generate_ref_response=True, max_new_tokens=3, do_sample=False
    )
    # before any update the reference is the policy: greedy answers agree
    assert all(torch.equal(a, b) for a, b in zip(responses, ref_responses))
    with pytest.raises(ValueError, match="unknown generation"):
        trainer.generate(queries, max_new_tokens=3, not_a_setting=1)
    with pytest.raises(TypeError, match="query_tensor"):
        trainer.generate(torch.zeros(2, 3, dtype=torch.long))


def test_generate_ignores_the_tokenizer_padding_side(base_model, tokenizer):
    right = tiny_tokenizer(padding_side="right")
    queries = [torch.tensor(tokenizer.encode(t)) for t in ["the film", "a very long story about a dog", "it"]]
    outs = []
    for tok in (tokenizer, right):
        trainer = make_trainer(base_model, tok)
        torch.manual_seed(3)
        outs.append(trainer.generate(queries, return_prompt=False, max_new_tokens=5, do_sample=True))
    assert all(torch.equal(a, b) for a, b in zip(*outs))


# ---------------------------------------------------------------------------------------- step inputs
def _counting_forward(trainer):
    calls = {"n": 0}
    original = trainer.policy.forward

    def forward(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    trainer.policy.forward = forward
    return calls


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        (lambda q, r, s: (q, r[:3], s), ValueError, "lengths"),
        (lambda q, r, s: (q[:3], r[:3], s[:3]), ValueError, "batch_size"),
        (
            lambda q, r, s: (q, [torch.tensor([], dtype=torch.long)] + r[1:], s),
            ValueError,
            r"responses\[0\] is empty",
        ),
        (lambda q, r, s: (q, r, [torch.ones(2, 2)] + s[1:]), ValueError, r"scores\[0\]"),
        (lambda q, r, s: ([q[0].float()] + q[1:], r, s), TypeError, r"queries\[0\].*integer"),
        (lambda q, r, s: (q, r, [torch.tensor(True)] + s[1:]), TypeError, r"scores\[0\]"),
        (lambda q, r, s: (q, r, ["1.0"] + s[1:]), TypeError, r"scores\[0\]"),
        (lambda q, r, s: (torch.stack([x[:2] for x in q]), r, s), TypeError, "queries must be a list"),
        (lambda q, r, s: (q, [x.to("meta") for x in r], s), ValueError, r"responses\[0\].*meta"),
    ],
)
def test_bad_step_inputs_fail_before_any_forward_pass(base_model, tokenizer, mutate, error, match):
    trainer = make_trainer(base_model, tokenizer)
    calls = _counting_forward(trainer)
    before = trainable_snapshot(trainer.policy)
    with pytest.raises(error, match=match):
        trainer.step(*mutate(*fake_rollout()))
    assert calls["n"] == 0
    assert all(torch.equal(p, before[n]) for n, p in trainer.policy.named_parameters() if p.requires_grad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_scores_skip_the_step_with_a_warning(base_model, tokenizer, bad):
    # not an error: the step is skipped and counted (rlhfkit.trainers.common.guards.NonFiniteGuard)
    from rlhfkit.trainers.common.guards import NonFiniteStepWarning

    trainer = make_trainer(base_model, tokenizer)
    before = trainable_snapshot(trainer.policy)
    q, r, s = fake_rollout()
    with pytest.warns(NonFiniteStepWarning, match=r"scores\[3\] is (nan|inf)"):
        stats = trainer.step(q, r, s[:3] + [torch.tensor(bad)])
    assert stats["ppo/step_skipped"] == 1.0
    assert all(torch.equal(p, before[n]) for n, p in trainer.policy.named_parameters() if p.requires_grad)


def test_response_masks_are_checked(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer)
    q, r, s = fake_rollout()
    with pytest.raises(ValueError, match=r"response_masks\[1\] has shape"):
        trainer.step(q, r, s, response_masks=[torch.ones_like(r[0])] + [torch.ones(1)] * 3)
    with pytest.raises(ValueError, match=r"response_masks\[0\] masks out every token"):
        trainer.step(q, r, s, response_masks=[torch.zeros_like(x) for x in r])


# ---------------------------------------------------------------------------------------- step
def test_step_updates_the_policy_and_reports_documented_stats(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer, ppo_epochs=2)
    ref_before = {n: p.clone() for n, p in trainer.ref_model.named_parameters()}
    before = trainable_snapshot(trainer.policy)
    q, r, s = fake_rollout()
    stats = trainer.step(q, r, torch.stack(s))  # a (B,) tensor of scores is accepted too
    missing = [k for k in DOCUMENTED_KEYS if k not in stats]
    assert not missing, missing
    scalars = {k: v for k, v in stats.items() if isinstance(v, float)}
    assert all(math.isfinite(v) for v in scalars.values()), scalars
    assert stats["objective/kl"] == pytest.approx(0.0, abs=1e-5)  # first step: policy == reference
    assert stats["objective/kl_coef"] == pytest.approx(0.2)
    assert stats["ppo/mean_scores"] == pytest.approx(0.0)  # scores -1.5 .. 1.5
    assert stats["ppo/optimizer_steps"] == 4.0  # 2 epochs x (4 samples / backward batch 2)
    assert stats["ppo/skipped_minibatches"] == 0.0 and stats["ppo/early_stopped"] == 0.0
    assert stats["tokens/responses_len_mean"] == pytest.approx(sum(len(x) for x in r) / 4)
    assert stats["objective/kl_dist"].shape == (4,)
    moved = [
        n for n, p in trainer.policy.named_parameters() if p.requires_grad and not torch.equal(p, before[n])
    ]
    frozen = [n for n, p in trainer.policy.named_parameters() if p.requires_grad and n not in moved]
    # every parameter that takes part in the forward pass moved (a token embedding row only moves if used)
    assert not [n for n in frozen if "embed_tokens" not in n], frozen
    assert any(n.startswith("v_head") for n in moved)
    assert all(torch.equal(p, ref_before[n]) for n, p in trainer.ref_model.named_parameters())
    assert trainer.current_step == 1
    # second step: the policy has moved away from the reference
    stats = trainer.step(q, r, s)
    assert stats["objective/kl"] != 0.0


def test_policy_ratio_holds_every_trained_token_of_every_minibatch(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer, ppo_epochs=2)
    q, r, s = fake_rollout()
    stats = trainer.step(q, r, s)
    ratio = stats["ppo/policy/ratio"]
    # one value per real response token, in each of the 2 epochs
    assert ratio.shape == (2 * sum(len(x) for x in r),)
    # first minibatch: the policy has not moved yet (no dropout), so its ratios are exactly 1
    first = trainer.config.mini_batch_size
    assert (ratio > 0).all() and abs(float(ratio.mean()) - stats["ppo/policy/ratio_mean"]) < 0.5
    assert ratio[:first].tolist() == pytest.approx([1.0] * first, abs=1e-5)


def test_learning_rate_logged_is_the_one_the_step_used(base_model, tokenizer):
    model = copy.deepcopy(base_model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    trainer = PPOTrainer(
        PPOConfig(batch_size=4, mini_batch_size=2, ppo_epochs=1),
        model,
        tokenizer=tokenizer,
        optimizer=optimizer,
        lr_scheduler=scheduler,
    )
    logged = [trainer.step(*fake_rollout())["ppo/learning_rate"] for _ in range(3)]
    # step k trains at 0.01 * 0.5**k; the scheduler moves on only after the step
    assert logged == pytest.approx([0.01, 0.005, 0.0025])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.00125)


def test_adaptive_kl_coefficient_is_updated_each_step(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer, init_kl_coef=0.5, target=6, horizon=100)
    trainer.step(*fake_rollout())
    # first step KL = 0: error clipped to -0.2, value *= 1 - 0.2 * 4 / 100
    assert trainer.kl_ctl.value == pytest.approx(0.5 * (1 - 0.2 * 4 / 100))
    fixed = make_trainer(base_model, tokenizer, adap_kl_ctrl=False, init_kl_coef=0.3)
    fixed.step(*fake_rollout())
    assert fixed.kl_ctl.value == 0.3


def test_response_masks_limit_the_trained_tokens(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer)
    q, r, s = fake_rollout()
    masks = [torch.zeros_like(x) for x in r]
    for m in masks:
        m[0] = 1  # train on the first response token only
    stats = trainer.step(q, r, s, response_masks=masks)
    assert stats["ppo/policy/advantages"].shape == (4,)  # one trained token per sample


def test_ratio_threshold_skips_minibatches_without_an_optimizer_step(base_model, tokenizer):
    # mean ratio is 1 on the first epoch (same policy, no dropout): a threshold below 1 skips everything
    trainer = make_trainer(base_model, tokenizer, ratio_threshold=0.5, ppo_epochs=2)
    before = trainable_snapshot(trainer.policy)
    stats = trainer.step(*fake_rollout())
    assert stats["ppo/skipped_minibatches"] == 4.0 and stats["ppo/policy/skipped"] == 1.0
    assert stats["ppo/optimizer_steps"] == 0.0
    assert trainer.optimizer.state_dict()["state"] == {}  # Adam never stepped: no moments were created
    assert all(torch.equal(p, before[n]) for n, p in trainer.policy.named_parameters() if p.requires_grad)
    assert all(p.grad is None or not p.grad.any() for p in trainer.policy.parameters())


def test_early_stopping_on_policy_kl(base_model, tokenizer):
    trainer = make_trainer(
        base_model, tokenizer, early_stopping=True, target_kl=1e-9, ppo_epochs=4, learning_rate=1e-2
    )
    stats = trainer.step(*fake_rollout())
    assert stats["ppo/early_stopped"] == 1.0
    assert stats["ppo/optimizer_steps"] < 8.0  # 4 epochs x 2 groups without stopping


def test_score_scaling_normalisation_and_clipping(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer, use_score_scaling=True, use_score_norm=True, score_clip=0.5)
    q, r, _ = fake_rollout()
    scores = [torch.tensor(v) for v in (1.0, 2.0, 3.0, 10.0)]
    stats = trainer.step(q, r, scores)
    # running moments after one batch: mean 4, unbiased std of (1, 2, 3, 10) = sqrt(50/3)
    assert trainer.running.mean == pytest.approx(4.0) and trainer.running.count == 4
    assert trainer.running.std == pytest.approx(math.sqrt(50 / 3))
    normed = [(v - 4.0) / math.sqrt(50 / 3) for v in (1.0, 2.0, 3.0, 10.0)]
    clipped = [min(max(v, -0.5), 0.5) for v in normed]
    assert stats["ppo/mean_scores_scaled"] == pytest.approx(sum(clipped) / 4, abs=1e-6)
    assert stats["ppo/mean_scores"] == pytest.approx(4.0)  # raw scores are reported


def test_score_norm_alone_leaves_scores_unchanged(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer, use_score_norm=True)  # no use_score_scaling: ignored
    scores = torch.tensor([1.0, 2.0, 3.0, 10.0])
    assert torch.equal(trainer._scale_scores(scores), scores) and trainer.running.count == 0


# ---------------------------------------------------------------------------------------- maths hooks
@pytest.mark.parametrize(
    "kind, expected_kl",
    [
        # logprobs (-1, -2), ref (-1.5, -1): d = logp - ref = (0.5, -1)
        ("kl", [0.5, -1.0]),
        ("abs", [0.5, 1.0]),
        ("mse", [0.125, 0.5]),  # 0.5 * d^2
        ("k3", [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]),  # exp(-d) - 1 + d
    ],
)
def test_compute_rewards_hand_values(base_model, tokenizer, kind, expected_kl):
    trainer = make_trainer(base_model, tokenizer, kl_penalty=kind, init_kl_coef=0.5, adap_kl_ctrl=False)
    logprobs, ref = torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    rewards, non_score, kls = trainer.compute_rewards(torch.tensor([3.0]), logprobs, ref, mask)
    assert kls[0, :2].tolist() == pytest.approx(expected_kl)
    assert non_score[0, :2].tolist() == pytest.approx([-0.5 * k for k in expected_kl])
    # the score lands on the last real token; padding gets nothing
    assert rewards[0].tolist() == pytest.approx([-0.5 * expected_kl[0], 3.0 - 0.5 * expected_kl[1], 0.0])


def test_compute_rewards_full_kl_from_logits(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer, kl_penalty="full", init_kl_coef=1.0, adap_kl_ctrl=False)
    # p = softmax(0, 0) = (1/2, 1/2); ref = softmax(0, ln 3) = (1/4, 3/4)
    # KL = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3)
    logits = torch.zeros(1, 1, 2)
    ref_logits = torch.tensor([[[0.0, math.log(3.0)]]])
    logprobs = torch.log_softmax(logits, -1)[..., 0]
    ref_logprobs = torch.log_softmax(ref_logits, -1)[..., 0]
    _, _, kls = trainer.compute_rewards(
        torch.tensor([0.0]),
        logprobs,
        ref_logprobs,
        torch.ones(1, 1, dtype=torch.bool),
        logits=logits,
        ref_logits=ref_logits,
    )
    assert kls.item() == pytest.approx(0.5 * math.log(4 / 3))


def test_full_kl_step_runs(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer, kl_penalty="full")
    stats = trainer.step(*fake_rollout())
    assert stats["objective/kl"] == pytest.approx(0.0, abs=1e-5)


def test_compute_advantages_returns_and_whitening(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer, gamma=0.5, lam=1.0)
    # values 0, rewards (0, 0, 1), gamma 0.5, lam 1: advantages = discounted returns = (0.25, 0.5, 1)
    values = torch.zeros(1, 4)
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[True, True, True, False]])
    _, advantages, returns = trainer.compute_advantages(values, rewards, mask)
    assert returns[0].tolist() == pytest.approx([0.25, 0.5, 1.0, 0.0])
    real = advantages[mask]
    assert real.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert real.std().item() == pytest.approx(1.0, abs=1e-3)
    assert real.argsort().tolist() == [0, 1, 2]
    assert advantages[0, 3].item() == 0.0


def test_loss_matches_core_functions(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer, vf_coef=0.3)
    g = torch.Generator().manual_seed(0)
    shape = (2, 3)
    old, new = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    values, vpreds = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    adv, ret = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    pg, vf, stats = trainer.loss(old, values, None, vpreds, new, mask, adv, ret)
    assert pg.item() == pytest.approx(ppo_policy_loss(new, old, adv, mask, 0.2).loss.item())
    assert vf.item() == pytest.approx(0.3 * ppo_value_loss(vpreds, values, ret, mask, 0.2).loss.item())
    assert stats["loss/total"].item() == pytest.approx(pg.item() + vf.item())
    assert stats["loss/value"].item() == pytest.approx(vf.item() / 0.3)


def test_train_minibatch_steps_the_optimizer(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer)
    before = trainable_snapshot(trainer.policy)
    q, r, _ = fake_rollout(n=2)
    batch = RolloutBatch.from_sequences(q, r, tokenizer.pad_token_id)
    out = forward_response(
        trainer.policy,
        batch.query_ids,
        batch.query_mask,
        batch.responses,
        batch.response_mask,
        with_values=True,
    )
    mask = batch.loss_mask
    old = out.logprobs.detach() - 0.1
    stats = trainer.train_minibatch(
        old,
        out.values.detach(),
        out.logprobs,
        None,
        out.values,
        mask,
        torch.ones_like(old),
        torch.ones_like(old),
    )
    assert stats["policy/skipped"].item() == 0.0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.policy.named_parameters() if p.requires_grad)


def test_record_step_stats_hand_values(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    kls = torch.tensor([[1.0, 2.0, 9.0], [0.5, 9.0, 9.0]])  # 9s sit on padding and must not count
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
    zeros = torch.zeros(2, 3)
    stats = trainer.record_step_stats(
        kl_coef=0.1,
        scores=torch.tensor([1.0, 3.0]),
        queries=[torch.ones(2), torch.ones(4)],
        responses=[torch.ones(2), torch.ones(1)],
        logprobs=logprobs,
        ref_logprobs=zeros,
        values=zeros,
        returns=torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]),
        advantages=zeros,
        non_score_rewards=-0.1 * kls,
        kls=kls,
        mask=mask,
        train_stats={"loss/policy": torch.tensor([1.0, 3.0])},
    )
    assert stats["objective/kl"].item() == pytest.approx((3.0 + 0.5) / 2)  # per-sequence sums, averaged
    assert stats["objective/kl_dist"].tolist() == pytest.approx([3.0, 0.5])
    assert stats["objective/entropy"].item() == pytest.approx((3.0 + 3.0) / 2)  # -sum of logprobs
    assert stats["ppo/mean_non_score_reward"].item() == pytest.approx(-0.1 * 3.5 / 2)
    assert stats["ppo/mean_scores"].item() == 2.0 and stats["objective/kl_coef"].item() == pytest.approx(0.1)
    assert stats["ppo/loss/policy"].item() == 2.0  # mean over minibatches
    assert stats["tokens/queries_len_mean"].item() == 3.0 and stats["tokens/responses_len_mean"].item() == 1.5
    # values 0 explain nothing of the returns: var_explained = 1 - var(R - 0) / var(R) = 0
    assert stats["ppo/val/var_explained"].item() == pytest.approx(0.0, abs=1e-6)


def test_gather_stats_is_identity_in_one_process(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer)
    stats = {"a": torch.tensor(1.5), "b": torch.arange(3.0), "c": "text"}
    assert trainer.gather_stats(stats) is stats


# ---------------------------------------------------------------------------------------- encoder-decoder
def test_encoder_decoder_generate_and_step(tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForSeq2SeqLMWithValueHead.from_pretrained(
            tiny_model_path("t5"), summary_dropout_prob=0.0
        )
    trainer = PPOTrainer(
        PPOConfig(batch_size=2, mini_batch_size=1, ppo_epochs=1, learning_rate=1e-3),
        model,
        tokenizer=tokenizer,
    )
    assert trainer.is_encoder_decoder and trainer.config.is_encoder_decoder
    queries = [torch.tensor(tokenizer.encode(t)) for t in ["translate this", "and that one please"]]
    responses = trainer.generate(queries, max_new_tokens=4, do_sample=True)  # never includes the prompt
    assert all(1 <= len(r) <= 4 for r in responses)
    before = trainable_snapshot(trainer.policy)
    stats = trainer.step(queries, responses, [1.0, -1.0])
    assert math.isfinite(stats["ppo/loss/total"])
    assert stats["objective/kl"] == pytest.approx(0.0, abs=1e-5)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.policy.named_parameters() if p.requires_grad)


# ---------------------------------------------------------------------------------------- logging and saving
def test_log_stats_writes_tensorboard_events(base_model, tokenizer, tmp_path):
    trainer = make_trainer(
        base_model, tokenizer, log_with="tensorboard", project_kwargs={"logging_dir": str(tmp_path / "tb")}
    )
    q, r, s = fake_rollout()
    stats = trainer.step(q, r, s)
    batch = {"query": ["a", "b", "c", "d"], "response": ["w", "x", "y", "z"]}
    logs = trainer.log_stats(stats, batch, s)
    assert logs["env/reward_mean"] == pytest.approx(0.0)
    assert logs["env/reward_dist"].shape == (4,)
    trainer.accelerator.end_training()
    events = list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert events and any(e.stat().st_size > 0 for e in events)


def test_save_pretrained_writes_a_loadable_model_with_card(base_model, tokenizer, tmp_path):
    trainer = make_trainer(base_model, tokenizer)
    trainer.step(*fake_rollout())
    trainer.save_model(str(tmp_path / "out"))
    assert (tmp_path / "out" / "README.md").read_text().count("PPO") >= 1
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path / "out", summary_dropout_prob=0.0)
    for (n, p), (_, p2) in zip(trainer.policy.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(p, p2), n
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    trainer.create_model_card(str(tmp_path), model_name="my-model")
    card = (tmp_path / "README.md").read_text()
    assert "# my-model" in card and "steps: 1" in card


def test_push_to_hub_offline_fails_clearly_before_writing(base_model, tokenizer, monkeypatch):
    from huggingface_hub import HfApi, constants

    trainer = make_trainer(base_model, tokenizer)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(HfApi, "create_repo", lambda *a, **k: pytest.fail("no network call offline"))
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE.*save_pretrained"):
        trainer.push_to_hub("me/ppo-model")
    with pytest.raises(ValueError, match="repo_id"):
        trainer.push_to_hub("")


def test_push_to_hub_uploads_what_save_pretrained_writes(base_model, tokenizer, monkeypatch):
    from huggingface_hub import HfApi, constants

    calls = {}

    def upload_folder(self, *, repo_id, folder_path, commit_message, revision, create_pr):
        calls["files"] = sorted(p.name for p in Path(folder_path).iterdir())
        calls["upload"] = (repo_id, commit_message, revision, create_pr)
        return "commit-info"

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(
        HfApi, "create_repo", lambda self, repo_id, **k: calls.setdefault("repo", (repo_id, k))
    )
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    trainer = make_trainer(base_model, tokenizer)
    assert trainer.push_to_hub("me/ppo-model", private=True, branch="dev") == "commit-info"
    assert calls["repo"] == ("me/ppo-model", {"private": True, "exist_ok": True})
    assert calls["upload"][0] == "me/ppo-model" and calls["upload"][2:] == ("dev", False)
    assert {
        "README.md",
        "config.json",
        "model.safetensors",
        "value_head.safetensors",
        "tokenizer.json",
    } <= set(calls["files"])
