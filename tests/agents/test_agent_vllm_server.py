"""run_episodes on the vLLM server backend: `rlhfkit vllm-serve` in .venv-vllm on the tiny Llama.

The engine samples the turn that follows a tool result; its logprobs must be the trainer's forward pass over
prompt + completion at exactly those positions, so the context it was given is the trained sequence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from scripted_backend import ScriptedFirstTurn, char_ids

from rlhfkit.agents import ToolBox, run_episodes
from rlhfkit.agents.turns import render_ids, tool_suffix_ids
from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.vllm_client import VLLMServerBackend
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.chat_templates import tool_chat_tokenizer
from rlhfkit.testing.vllm_server import vllm_server

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / ".venv-vllm" / "bin" / "rlhfkit"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SERVER.exists(), reason=f"no {SERVER.parent.parent.name}: run `make vllm-env`"),
]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("agents-served") / "llama"
    tiny_model("llama").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    with vllm_server(SERVER, folder, folder.parent / "server.log") as url:
        yield url


def test_the_engine_samples_the_next_turn_on_exactly_the_trained_sequence(served):
    tokenizer = tool_chat_tokenizer("gpt2")  # no added tokens: the tiny Llama knows every id
    model = tiny_model("llama").eval()
    box = ToolBox([multiply])
    questions = ["What is 3 times 4?", "Multiply 3 by 4."]
    prompts = [
        render_ids(tokenizer, [{"role": "user", "content": q}], add_generation_prompt=True, tools=box.schemas)
        for q in questions
    ]
    text = '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>'
    first = char_ids(tokenizer, text) + [tokenizer.eos_token_id]
    engine = VLLMServerBackend(model, tokenizer.pad_token_id, base_url=served, timeout=60)
    # top_k=0: the engine's logprobs are then those of the model's full distribution at this temperature
    stops = (tokenizer.eos_token_id,)
    params = SamplingParams(len(first) + 40, temperature=0.7, top_k=0, stop_token_ids=stops)
    episodes = run_episodes(
        ScriptedFirstTurn(first, engine),
        params,
        prompts,
        [box, box],
        tokenizer,
        max_iterations=1,
        max_completion_length=len(first) + 40,
        max_model_length=512,
        logprob_temperature=0.7,
        tool_timeout=5.0,
        pad_token_id=tokenizer.pad_token_id,
    )
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": "12"}])
    for prompt, episode in zip(prompts, episodes, strict=True):
        assert episode.completion_ids[: len(first) + len(suffix)] == first + suffix and episode.turns == 2
        sequence = torch.tensor([prompt + episode.completion_ids])
        with torch.no_grad():
            logits = model(sequence).logits[0, len(prompt) - 1 : -1].float() / 0.7
        scored = logits.log_softmax(-1).gather(1, sequence[0, len(prompt) :, None])[:, 0]
        second = torch.tensor(episode.model_mask) & (torch.arange(len(episode.model_mask)) >= len(first))
        assert second.sum() > 0
        torch.testing.assert_close(torch.tensor(episode.logprobs)[second], scored[second], rtol=0, atol=2e-4)
