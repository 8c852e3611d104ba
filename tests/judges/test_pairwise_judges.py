"""Judges: the Wilson win rate by hand, score judges pick the obviously better completion, and the LM judge
judges both orders, so a position-biased model gives ties, not wins."""

from __future__ import annotations

import math

import pytest
import torch

import rlhfkit
from rlhfkit.judges import (
    TIE,
    BasePairwiseJudge,
    BaseRankJudge,
    LMPairwiseJudge,
    RewardModelJudge,
    RuleJudge,
    ScoreRankJudge,
    load_judge,
    wilson_interval,
    win_rate,
)
from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer


# --- win rate --------------------------------------------------------------------------------------------
def test_wilson_interval_matches_hand_computation():
    # 8 wins in 10, z = 1.96: centre = (0.8 + 3.8415/20) / (1 + 3.8415/10) = 0.7167,
    # half = 1.96 / 1.38415 * sqrt(0.8*0.2/10 + 3.8415/400) = 0.2266 -> (0.4902, 0.9433)
    rate, low, high = win_rate([1] * 8 + [0] * 2)
    assert rate == 0.8
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    # 5 wins in 5: the interval does not collapse to a point (the normal approximation gives [1, 1]);
    # low = (1 + 3.8415/10 - 1.96 * sqrt(3.8415/100)) / (1 + 3.8415/5) = 0.5655
    rate, low, high = win_rate([1] * 5)
    assert rate == 1.0 and high == 1.0 and low == pytest.approx(0.5655, abs=1e-4)


def test_ties_count_half_and_model_index_chooses_the_side():
    # 1 win, 1 tie, 2 losses: (1 + 0.5) / 4
    judgements = [1, TIE, 0, 0]
    assert win_rate(judgements).rate == 0.375
    assert win_rate(judgements, model_index=0).rate == 0.625  # the same pairs seen from the other side
    rate, low, high = win_rate(judgements)
    assert (low, high) == wilson_interval(0.375, 4) and low < rate < high


def test_win_rate_rejects_bad_judgements():
    with pytest.raises(ValueError, match="empty"):
        win_rate([])
    with pytest.raises(ValueError, match="0, 1 or -1"):
        win_rate([0, 2])
    with pytest.raises(ValueError, match="model_index"):
        win_rate([0], model_index=2)


# --- rule and reward-model judges --------------------------------------------------------------------------
def count_good(prompts, completions):
    return [c.count("good") for c in completions]


def test_rule_judge_picks_the_better_completion_and_reports_ties():
    judge = RuleJudge(count_good)
    assert isinstance(judge, BasePairwiseJudge) and rlhfkit.BasePairwiseJudge is BasePairwiseJudge
    pairs = [["good good", "bad"], ["bad", "good"], ["good", "good"]]
    assert judge.judge(["p1", "p2", "p3"], pairs) == [0, 1, TIE]
    assert judge.judge(["p"], [["good", "good good"]], shuffle_order=False) == [1]
    assert RuleJudge(count_good, margin=1.5).judge(["p"], [["good good", "good"]]) == [TIE]


def test_rule_judge_passes_prompts_to_the_function():
    def echoes_prompt(prompts, completions):
        return [float(c == p) for p, c in zip(prompts, completions)]

    assert RuleJudge(echoes_prompt).judge(["yes", "no"], [["no", "yes"], ["no", "yes"]]) == [1, 0]


def test_score_rank_judge_orders_best_first():
    ranker = ScoreRankJudge(RuleJudge(count_good))
    assert isinstance(ranker, BaseRankJudge)
    assert ranker.judge(["a", "b"], [["good", "", "good good"], ["x", "good"]]) == [[2, 0, 1], [1, 0]]


def test_judges_name_bad_input():
    judge = RuleJudge(count_good)
    with pytest.raises(ValueError, match="pair"):
        judge.judge(["p"], [["a", "b", "c"]])
    with pytest.raises(ValueError, match="1 prompts for 2"):
        judge.judge(["p"], [["a", "b"], ["c", "d"]])
    with pytest.raises(ValueError, match="scores for"):
        RuleJudge(lambda prompts, completions: [1.0]).judge(["p"], [["a", "b"]])


def test_built_in_sentiment_rule_judge_prefers_the_positive_review():
    judge = load_judge("positive-review")  # the demo's VADER judge, via the task registry
    pairs = [
        [" It was dreadful, boring and ugly.", " A wonderful, moving and beautiful film."],
        [" I loved every minute, a delight.", " A waste of time, awful acting."],
    ]
    assert judge.judge(["The film", "Honestly,"], pairs) == [1, 0]


def _trained_reward_model():
    """A tiny reward model trained for a few steps to score "great" above "awful"."""
    torch.manual_seed(0)
    model, tokenizer = tiny_model("llama-reward"), tiny_tokenizer(padding_side="right")
    prompts, good, bad = (
        ["The movie was", "I think it is", "Overall,"],
        [" great", " truly great"],
        [" awful", " truly awful"],
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def scores(completions):
        batch = tokenizer(
            [p + c for p in prompts for c in completions],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
        )
        return model(**batch).logits[:, 0]

    for _ in range(30):
        loss = -torch.nn.functional.logsigmoid(scores(good) - scores(bad)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, tokenizer


@pytest.mark.slow
def test_reward_model_judge_prefers_what_the_model_was_trained_to_prefer():
    model, tokenizer = _trained_reward_model()
    judge = RewardModelJudge(model, tokenizer)
    pairs = [[" great", " awful"], [" awful acting", " great acting"]]
    assert judge.judge(["It was", "My verdict:"], pairs) == [0, 1]
    # the judge reads the model through the trainers' scorer: scores agree with a direct forward pass
    batch = tokenizer(["It was great"], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        direct = model(**batch).logits[0, 0].item()
    assert judge.scores(["It was"], [" great"])[0] == pytest.approx(direct, abs=1e-5)


# --- local LM judge ----------------------------------------------------------------------------------------
class MarginStub(LMPairwiseJudge):
    """An LM judge whose choice margins come from a rule on the ordered pair (no model call)."""

    def __init__(self, rule):
        super().__init__(torch.nn.Linear(1, 1), tiny_tokenizer())
        self.rule = rule

    def choice_margins(self, prompts, firsts, seconds):
        return torch.tensor([self.rule(a, b) for a, b in zip(firsts, seconds)], dtype=torch.float32)


def test_lm_judge_needs_both_orders_to_agree():
    pairs = [["great", "awful"], ["awful", "great"], ["great", "great"]]
    prompts = ["p"] * 3
    content = MarginStub(lambda first, second: float(first.count("great") - second.count("great")))
    assert content.judge(prompts, pairs) == [0, 1, TIE]
    always_a = MarginStub(lambda first, second: 2.0)  # prefers whatever is shown first
    assert always_a.judge(prompts, pairs) == [TIE, TIE, TIE]
    always_b = MarginStub(lambda first, second: -2.0)
    assert always_b.judge(prompts, pairs) == [TIE, TIE, TIE]
    # a content preference weaker than the position bias: the orders disagree, a tie
    weak = MarginStub(lambda first, second: 1.0 + 0.5 * (first.count("great") - second.count("great")))
    assert weak.judge(prompts[:2], pairs[:2]) == [TIE, TIE]


def _biased_lm(token: str):
    """The tiny llama with a large bonus on `token`'s logit everywhere: it always answers `token`."""
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    token_id = tokenizer.encode(token, add_special_tokens=False)[0]

    def add_bias(module, inputs, output):
        output = output.clone()
        output[..., token_id] += 20.0
        return output

    model.lm_head.register_forward_hook(add_bias)
    return model, tokenizer


@pytest.mark.parametrize("favourite", ["A", "B"])
def test_position_biased_lm_gives_ties_not_wins(favourite):
    model, tokenizer = _biased_lm(favourite)
    judge = LMPairwiseJudge(model, tokenizer, batch_size=3)
    prompts = ["Say something nice.", "Describe the film in a few words please."]
    pairs = [["A lovely day.", "Bad."], ["It is a wonderful, moving film.", "meh"]]
    margins = judge.choice_margins(prompts, [a for a, _ in pairs], [b for _, b in pairs])
    assert ((margins > 10) if favourite == "A" else (margins < -10)).all()
    assert judge.judge(prompts, pairs) == [TIE, TIE]


def test_lm_choice_margins_do_not_depend_on_padding_or_batching():
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    judge = LMPairwiseJudge(model, tokenizer, batch_size=4)
    prompts, firsts, seconds = (
        ["short", "a much longer prompt than the other one"],
        ["x", "yes indeed"],
        ["y z", "no"],
    )
    batched = judge.choice_margins(prompts, firsts, seconds)
    for i in range(2):  # each alone, unpadded, by hand: log p(A) - log p(B) at the last position
        ids = tokenizer(
            judge.prompt_text(prompts[i], firsts[i], seconds[i]),
            add_special_tokens=False,
            return_tensors="pt",
        )["input_ids"]
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1)
        a, b = judge.choice_ids
        assert batched[i].item() == pytest.approx((logprobs[a] - logprobs[b]).item(), abs=1e-4)


def test_lm_judge_checks_its_template_and_choices():
    model, tokenizer = torch.nn.Linear(1, 1), tiny_tokenizer()
    with pytest.raises(ValueError, match="exactly the fields"):
        LMPairwiseJudge(model, tokenizer, template="{prompt} {first}")
    with pytest.raises(ValueError, match="choices"):
        LMPairwiseJudge(model, tokenizer, choices=("A", " B"))  # " B" is two tokens here
    with pytest.raises(ValueError, match="same token"):
        LMPairwiseJudge(model, tokenizer, choices=("A", "A"))
    judge = LMPairwiseJudge(tiny_model("llama"), tokenizer)
    with pytest.raises(ValueError, match="positions"):
        judge.judge(["word " * 5000], [["a", "b"]])
    plain = LMPairwiseJudge(
        model,
        tokenizer,
        use_chat_template=False,
        choices=("0", "1"),
        template="Q: {prompt}\n0: {first}\n1: {second}\nBetter:",
    )
    assert plain.prompt_text("p", "a", "b") == "Q: p\n0: a\n1: b\nBetter:"


# --- loading from a --judge_model value ---------------------------------------------------------------------
def test_load_judge_resolves_folders_and_names_the_flag_for_hub_names():
    assert isinstance(load_judge(str(tiny_model_path("llama-reward"))), RewardModelJudge)
    assert isinstance(load_judge(str(tiny_model_path("llama"))), LMPairwiseJudge)
    assert isinstance(load_judge("keyword"), RuleJudge)
    with pytest.raises(ValueError, match="--judge_model 'gpt-4o-mini' is not a local") as err:
        load_judge("gpt-4o-mini")
    assert "positive-review" in str(err.value)  # the built-in names are listed
    assert math.isfinite(load_judge("length").scores(["p"], ["two words"])[0])
