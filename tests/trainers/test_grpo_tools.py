"""GRPOTrainer and RLOO's current form with tools, environments and rollout_func, on the tiny Llama.

The completions come from `ScriptedBackend`: a sampler that writes given replies (a tool call, then an answer
once the tool's result is in the context) and reports the policy's own logprobs of them, so the real trainer
loop runs on known multi-turn completions. Checked: tool results stay in the sequence but out of the loss
(the logged loss equals the one recomputed by hand with that mask, the sampling gap sees no tool token),
environments reset per rollout with their state kept per rollout, `get_reward`, a dict of environments chosen
by the `environment` column, rollout_func's extra columns and env_mask, and the checks made at construction.
"""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset

from rlhfkit.rollout import forward_response
from rlhfkit.rollout.backends import GenerationBackend, GenerationOutput
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.rollout.generation import pad_right
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.chat_templates import tool_chat_tokenizer
from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer
from rlhfkit.trainers.rloo.config import RLOOConfig
from rlhfkit.trainers.rloo.forms import RLOOTrainer


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class ScriptedBackend(GenerationBackend):
    """Replies `script(context, k)` to the k-th row it is asked for (context: the decoded prompt plus the
    completion so far), ended by the eos token and cut at max_new_tokens; logprobs are the policy's."""

    def __init__(self, model, tokenizer, script):
        self.model, self.tok, self.script, self.calls = model, tokenizer, script, 0

    def _sample(self, query_ids, query_mask, params, logprob_temperature):
        replies = []
        for ids, mask in zip(query_ids, query_mask.bool()):
            context = self.tok.decode(ids[mask], skip_special_tokens=False)
            text = self.script(context, self.calls)
            self.calls += 1
            reply = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
            replies.append(torch.tensor(reply[: params.max_new_tokens]))
        responses, response_mask = pad_right(replies, self.tok.pad_token_id)
        with torch.no_grad():
            logprobs = forward_response(
                self.model, query_ids, query_mask, responses, response_mask,
                temperature=logprob_temperature or 1.0,
            ).logprobs  # fmt: skip
        return GenerationOutput(responses, response_mask.bool(), logprobs.float())


def math_script(context: str, k: int) -> str:
    """Even rows call multiply, then answer with its result; odd rows answer 7 at once."""
    if "<|tool|>" in context:  # the tool's answer is in: say it
        return context.rsplit("<|tool|>\n", 1)[1].split("<|endoftext|>", 1)[0]
    return call("multiply", a=3, b=4) if k % 2 == 0 else "7"


def correct(completions, **kwargs):
    """1 when the last assistant message says 12."""
    return [float(c[-1]["role"] == "assistant" and c[-1]["content"].strip() == "12") for c in completions]


def chat(*texts: str) -> list:
    return [[{"role": "user", "content": t}] for t in texts]


def _config(tmp_path, cls=GRPOConfig, **kwargs):
    defaults = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=96, max_steps=1, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-3,
    )  # fmt: skip
    return cls(**{**defaults, **kwargs})


def _trainer(tmp_path, reward=correct, script=math_script, dataset=None, cls=GRPOTrainer, config=None, **kw):
    tokenizer = tool_chat_tokenizer("gpt2")
    model = tiny_model("llama")
    trainer = cls(
        model,
        reward,
        args=config or _config(tmp_path),
        train_dataset=dataset or Dataset.from_dict({"prompt": chat("what is 3 times 4?", "3 x 4 =")}),
        processing_class=tokenizer,
        **kw,
    )
    backend = ScriptedBackend(model, tokenizer, script)
    trainer._sampler = lambda *args, **kwargs: backend
    return trainer


def _last_log(trainer) -> dict:
    return next(h for h in trainer.state.log_history if "loss" in h)


def test_tool_results_are_in_the_sequence_but_out_of_the_loss(tmp_path):
    questions = Dataset.from_dict({"prompt": chat("what is 3 times 4?", "3 x 4 =")})
    config = _config(tmp_path, log_completions=True)
    trainer = _trainer(tmp_path, config=config, tools=[multiply], eval_dataset=questions)
    trainer.train()
    batch, logs = trainer._buffer, _last_log(trainer)
    sampled, real = batch.loss_mask.sum(1), batch.response_mask.sum(1)
    tool_rows = real > sampled
    assert tool_rows.tolist() == [True, False] * 4  # the even rows called multiply
    # what the tool inserted: its result turn "\n<|tool|>\n12<|endoftext|>\n<|assistant|>\n"
    tok = trainer.processing_class
    inserted = batch.responses[0][batch.response_mask[0] & ~batch.loss_mask[0]]
    assert tok.decode(inserted) == "\n<|tool|>\n12<|endoftext|>\n<|assistant|>\n"
    assert tok.decode(batch.responses[0][batch.loss_mask[0]]).endswith("12<|endoftext|>")
    assert (batch.logprobs[batch.response_mask & ~batch.loss_mask] == 0).all()
    # on-policy (ratio 1) dapo: loss = -sum_i A_i n_i / sum_i n_i over the n_i trained tokens of each row
    advantages = batch.advantages.float()
    by_hand = -(advantages * sampled).sum() / sampled.sum()
    with_tool_tokens = -(advantages * real).sum() / real.sum()
    assert logs["loss"] == pytest.approx(by_hand.item(), abs=1e-5)
    assert abs(by_hand - with_tool_tokens) > 5e-3  # the mask makes a difference here
    # the trainer's logprobs equal the sampler's on every trained token: no tool token is compared
    assert logs["sampling/sampling_logp_difference/max"] < 1e-4
    assert logs["completions/mean_length"] == sampled.float().mean().item() == 33.0  # (64 + 2) / 2
    assert logs["reward"] == 0.5  # the tool callers say 12, the others 7
    assert logs["tools/call_frequency"] == 0.5 and logs["tools/failure_frequency"] == 0.0
    assert logs["tools/turns_mean"] == 1.5 and logs["tools/inserted_tokens_mean"] == len(inserted) / 2
    evaluation = trainer.evaluate()  # the same episodes: lengths count the model's tokens
    assert evaluation["eval_reward"] == 0.5 and evaluation["eval_completions/mean_length"] == 33.0
    table = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [row["response"] for row in table[:2]] == [
        '[assistant] multiply({"a": 3, "b": 4})\n[tool multiply] 12\n[assistant] 12',
        "[assistant] 7",
    ]


def test_a_cut_last_turn_is_truncated_and_the_iteration_cap_stops_tools(tmp_path):
    # the tool rows hold the call and its eos (61 tokens), the result turn (14), "12" and eos (3): with 77,
    # the answer loses its eos
    config = _config(tmp_path, max_completion_length=77, mask_truncated_completions=True)
    trainer = _trainer(tmp_path, config=config, tools=[multiply])
    trainer.train()
    batch, logs = trainer._buffer, _last_log(trainer)
    cut = trainer._truncated(batch)
    assert cut.tolist() == [True, False] * 4  # an earlier turn's eos does not count as the end
    assert logs["completions/clipped_ratio"] == 0.5
    assert not batch.loss_mask[cut].any() and batch.loss_mask[~cut].any()  # DAPO's mask, tool rows out
    # with 63 the result turn does not fit: left out, the episode ends on the call's eos (TRL: not clipped)
    short = _trainer(tmp_path, config=_config(tmp_path, max_completion_length=63), tools=[multiply])
    short.train()
    assert short._buffer.response_mask.sum(1).tolist() == [61, 2] * 4
    assert not short._truncated(short._buffer).any() and _last_log(short)["tools/call_frequency"] == 0.5
    capped = _trainer(tmp_path, config=_config(tmp_path, max_tool_calling_iterations=0), tools=[multiply])
    capped.train()
    logs = _last_log(capped)
    assert logs["tools/call_frequency"] == 0.0 and logs["tools/iteration_cap_frac"] == 0.5
    assert logs["reward"] == 0.0  # no tool ran: nobody says 12


def test_sampler_correction_weighs_only_sampled_tokens(tmp_path):
    config = _config(tmp_path, vllm_importance_sampling_correction=True)
    trainer = _trainer(tmp_path, config=config, tools=[multiply])
    trainer.train()
    logs = _last_log(trainer)
    # the sampler's logprobs are the policy's: every ratio is 1 (a tool token, logprob 0, would be e^7)
    for stat in ("min", "mean", "max"):
        assert logs[f"sampling/importance_sampling_ratio/{stat}"] == pytest.approx(1.0, abs=1e-4)


class Counter:
    """A running total the model adds to; its reward is the total."""

    made = 0

    def __init__(self):
        Counter.made += 1
        self.total, self.resets = 0, 0

    def reset(self, start, **row):
        self.total, self.resets = start, self.resets + 1
        return f" Start at {start}."

    def add(self, n: int) -> int:
        """Add to the running total.

        Args:
            n: how much to add.
        """
        self.total += n
        return self.total

    def get_reward(self) -> float:
        return float(self.total)


def add_script(context: str, k: int) -> str:
    """Row k adds k once."""
    return "done" if "<|tool|>" in context else call("add", n=k)


def called(conversation: list[dict]) -> list[dict]:
    """The tool calls of a conversation's assistant messages."""
    return [
        c["function"] for m in conversation if m["role"] == "assistant" for c in m.get("tool_calls") or []
    ]


def test_environments_are_reset_per_rollout_and_score_with_get_reward(tmp_path):
    Counter.made = 0
    seen = []

    def sees_environments(prompts, completions, environments, start, **kwargs):
        added = [called(c)[0]["arguments"]["n"] for c in completions]
        assert all(c[1]["role"] == "tool" for c in completions)
        # each rollout's own environment holds its row's start plus what that rollout added
        assert [e.total for e in environments] == [s + n for s, n in zip(start, added)]
        assert [p[-1]["content"] for p in prompts] == [f"count Start at {s}." for s in start]
        seen.append(environments)
        return [0.0] * len(completions)

    dataset = Dataset.from_dict({"prompt": chat("count", "count"), "start": [10, 20]})
    config = _config(tmp_path, max_steps=2)
    trainer = _trainer(
        tmp_path, sees_environments, add_script, dataset, config=config, environment_factory=Counter
    )
    assert trainer.reward_func_names == ["sees_environments", "Counter"]
    trainer.train()
    assert Counter.made == 8  # one per rollout, made once (the probe is the first) and reset after
    first, second = seen
    assert len({id(e) for e in first}) == 8 and {id(e) for e in first} == {id(e) for e in second}
    assert all(e.resets == 2 for e in first)
    rendered = trainer.processing_class.decode(trainer._buffer.query_ids[0])
    assert "count Start at" in rendered and '"name": "add"' in rendered  # the tool schema is in the prompt
    expected = torch.tensor([float(e.total) for e in second])  # get_reward, weight 1
    torch.testing.assert_close(trainer._buffer.scores, expected)


class Echo:
    def reset(self, **row):
        return None

    def echo(self, text: str) -> str:
        """Say it back.

        Args:
            text: what to say.
        """
        return text


def test_a_dict_of_environments_is_chosen_by_the_environment_column(tmp_path):
    types = []

    def kinds(completions, environments, environment, **kwargs):
        types.extend(zip(environment, [type(e).__name__ for e in environments]))
        return [1.0] * len(completions)

    dataset = Dataset.from_dict(
        {"prompt": chat("a", "b"), "environment": ["counter", "echo"], "start": [1, 2]}
    )
    factories = {"counter": Counter, "echo": Echo}
    trainer = _trainer(tmp_path, kinds, lambda c, k: "hi", dataset, environment_factory=factories)
    trainer.train()
    assert sorted(set(types)) == [("counter", "Counter"), ("echo", "Echo")]
    prompts = trainer.processing_class.batch_decode(trainer._buffer.query_ids)
    for prompt, (name, _) in zip(prompts, types):  # each prompt lists only its environment's tools
        assert ('"name": "add"' in prompt, '"name": "echo"' in prompt) == (name == "counter", name == "echo")
    bad = Dataset.from_dict({"prompt": chat("a"), "environment": ["chess"]})
    with pytest.raises(
        ValueError, match=r"row 0 has environment='chess'.*expected one of \['counter', 'echo'\]"
    ):
        _trainer(tmp_path, kinds, dataset=bad, environment_factory=factories)
    with pytest.raises(ValueError, match="needs an 'environment' column"):
        _trainer(tmp_path, kinds, environment_factory=factories)


@pytest.mark.filterwarnings("ignore::rlhfkit.trainers.common.health.HealthWarning")  # made-up logprobs
def test_rollout_func_columns_reach_rewards_and_env_mask_leaves_the_loss(tmp_path):
    tok = tool_chat_tokenizer("gpt2")
    got = {}

    def rollout(prompts, trainer):
        got["prompts"] = prompts
        ids = [tok.apply_chat_template(p, add_generation_prompt=True)["input_ids"] for p in prompts]
        completions = [[10, 11, 12, 13, tok.eos_token_id][: 2 + i % 3] for i in range(len(prompts))]
        return {
            "prompt_ids": ids,
            "completion_ids": completions,
            "logprobs": [[-1.0] * len(c) for c in completions],
            "env_mask": [[1, 0] + [1] * (len(c) - 2) for c in completions],
            "bonus": [float(i) for i in range(len(prompts))],
        }

    def by_bonus(completions, bonus, **kwargs):
        return bonus

    trainer = _trainer(tmp_path, by_bonus, rollout_func=rollout)
    trainer.train()
    assert len(got["prompts"]) == 8 and got["prompts"][0] == got["prompts"][3]  # one per rollout, grouped
    batch = trainer._buffer
    assert batch.loss_mask.sum(1).tolist() == [1 + i % 3 for i in range(8)]
    assert not batch.loss_mask[:, 1].any() and batch.response_mask.sum(1).tolist() == [
        2 + i % 3 for i in range(8)
    ]
    torch.testing.assert_close(batch.scores, torch.arange(8, dtype=torch.float))
    # with an inference engine, rollout_func samples from the latest weights: the engine is synced first
    synced = []
    trainer._sampler = lambda *args, **kwargs: synced.append(True)
    trainer.args.use_vllm = True  # only read by this call: no engine is started
    trainer._custom_rollout_groups({"input_ids": [[1]] * 8, "prompt": got["prompts"], "x": [0] * 8})
    assert synced == [True]

    def incomplete(prompts, trainer):
        return {"prompt_ids": [[1]] * len(prompts), "completion_ids": [[2]] * len(prompts)}

    with pytest.raises(ValueError, match="lacks logprobs"):
        _trainer(tmp_path, by_bonus, rollout_func=incomplete).train()


def test_rloo_current_form_trains_with_tools(tmp_path):
    config = _config(tmp_path, cls=RLOOConfig, beta=0.1)
    trainer = _trainer(tmp_path, cls=RLOOTrainer, config=config, tools=[multiply])
    assert type(trainer).__name__ == "GroupRLOOTrainer"
    trainer.train()
    batch, logs = trainer._buffer, _last_log(trainer)
    assert (batch.response_mask.sum(1) > batch.loss_mask.sum(1)).tolist() == [True, False] * 4
    assert logs["tools/call_frequency"] == 0.5 and logs["reward"] == 0.5
    # the policy is its reference before the first update; a tool token (logprob 0) would count ~7 nats
    assert logs["kl"] == pytest.approx(0.0, abs=1e-5)
    assert logs["sampling/sampling_logp_difference/max"] < 1e-4
    # RLOO's KL penalty sums log pi - log pi_ref over sampled tokens: the tool token (middle) adds nothing
    two = RolloutBatch(
        torch.ones(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool),
        torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool),
        torch.tensor([[True, False, True]] * 2),
        logprobs=torch.tensor([[-1.0, 0.0, -2.0]] * 2), ref_logprobs=torch.tensor([[-1.5, -9.0, -2.0]] * 2),
        model_mask=torch.tensor([[True, False, True]] * 2),
    )  # fmt: skip
    _, metrics = trainer._advantages(two, torch.tensor([1.0, 0.0]), group_size=2)
    assert metrics["kl"] == pytest.approx(0.5 / 2)  # (0.5 + 0) over the 2 sampled tokens of each row


def undocumented(a: int) -> int:
    return a


class NoReset:
    def act(self, n: int) -> int:
        """Act.

        Args:
            n: how much.
        """
        return n


@pytest.mark.parametrize(
    "kwargs, tokenizer, error",
    [
        ({"tools": [undocumented]}, "gpt2", "undocumented"),
        ({"tools": [multiply]}, "plain", "chat template ignores tools"),
        ({"environment_factory": NoReset}, "gpt2", "NoReset made by environment_factory has no reset"),
        ({"tools": [multiply], "rollout_func": lambda p, t: {}}, "gpt2", "does not combine"),
        ({"tools": [multiply], "generation_kwargs": {"num_beams": 2}}, "gpt2", "leave num_beams at 1"),
    ],
)
def test_construction_checks_name_what_is_wrong(tmp_path, kwargs, tokenizer, error):
    tok = tool_chat_tokenizer("gpt2") if tokenizer == "gpt2" else tiny_tokenizer()
    dataset = Dataset.from_dict({"prompt": chat("hi", "ho")})
    kwargs = dict(kwargs)  # the parameter's dict is shared: do not pop from it
    config = _config(tmp_path, generation_kwargs=kwargs.pop("generation_kwargs", None))
    with pytest.raises(ValueError, match=error):
        GRPOTrainer(tiny_model("llama"), correct, args=config, train_dataset=dataset,
                    processing_class=tok, **kwargs)  # fmt: skip


def test_text_prompts_with_tools_are_refused(tmp_path):
    with pytest.raises(ValueError, match="need chat prompts"):
        _trainer(tmp_path, dataset=Dataset.from_dict({"prompt": ["a", "b"]}), tools=[multiply])


def hint() -> str:
    """Give a hint."""
    return "use the letter e"


class HintThenPolicy(GenerationBackend):
    """The first turn calls `hint` (scripted, the policy's logprobs); every later turn is the policy's own
    sample from `sampler`."""

    def __init__(self, scripted: ScriptedBackend, sampler: GenerationBackend):
        self.scripted, self.sampler = scripted, sampler

    def _sample(self, query_ids, query_mask, params, logprob_temperature):
        context = self.scripted.tok.decode(query_ids[0][query_mask[0].bool()])
        source = self.sampler if "<|tool|>" in context else self.scripted
        return source.generate(query_ids, query_mask, params, logprob_temperature=logprob_temperature)


def test_reward_rises_through_tool_calling_episodes(tmp_path):
    from rlhfkit.rollout.backends import make_generation_backend
    from rlhfkit.tasks import toy_prompt_dataset

    def es_in_answer(completions, **kwargs):
        return [float(min(c[-1]["content"].count("e"), 5)) for c in completions]

    prompts = toy_prompt_dataset(n=200)["prompt"]
    # 66 tokens: the call (42) and its eos, the hint's turn (17), 6 for the answer
    config = _config(
        tmp_path, per_device_train_batch_size=16, max_completion_length=66, learning_rate=3e-3, max_steps=25,
        lr_scheduler_type="constant", seed=0,
    )  # fmt: skip
    dataset = Dataset.from_dict({"prompt": chat(*prompts)})
    trainer = _trainer(
        tmp_path, es_in_answer, lambda c, k: call("hint"), dataset, config=config, tools=[hint]
    )
    scripted = trainer._sampler()
    policy = make_generation_backend(trainer.model, trainer.processing_class.pad_token_id)
    backend = HintThenPolicy(scripted, policy)
    trainer._sampler = lambda *args, **kwargs: backend
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    calls = [h["tools/call_frequency"] for h in trainer.state.log_history if "reward" in h]
    before, after = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"'e' in the answer after a hint: first 5 updates {before:.2f}, last 5 updates {after:.2f}")
    assert set(calls) == {1.0} and after > before + 1.0, rewards
