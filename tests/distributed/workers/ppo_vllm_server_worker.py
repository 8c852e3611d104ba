"""Worker: PPO on 2 gloo processes generating through one real `rlhfkit vllm-serve` server (its URL is the
first argument; `--fsdp`: the policy sharded by FSDP2). Each rank samples its own prompts, takes two
`step()`s with its own scores, and reports the requests it made, its final weights' sum, and how far the
engine's logprobs are from its trained and from its initial model's after the last sync."""

import sys

import torch
from launch import save_result

from rlhfkit import PPOConfig, PPOTrainer
from rlhfkit.rollout import SamplingParams, vllm_client
from rlhfkit.testing import tiny_model, tiny_tokenizer, tiny_value_head_model

requests, prompts = [], []
call = vllm_client._call


def recording_call(url, payload=None, **kwargs):
    requests.append(url.rstrip("/").split("?")[0].rstrip("/").rsplit("/", 1)[-1])
    if payload is not None and "prompt_token_ids" in payload:
        prompts.extend(payload["prompt_token_ids"])
    return call(url, payload, **kwargs)


vllm_client._call = recording_call
settings, whole = {}, lambda net: torch.cat([p.detach().reshape(-1) for p in net.parameters()])
if "--fsdp" in sys.argv:
    from accelerate import FullyShardedDataParallelPlugin
    from fsdp_cpu import full_params, is_sharded

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    settings, whole = {"accelerator_kwargs": {"fsdp_plugin": plugin}}, full_params

torch.manual_seed(0)  # the value head is initialised at random: the same on every process
config = PPOConfig(
    batch_size=2, mini_batch_size=2, ppo_epochs=1, learning_rate=1e-2, seed=7,
    use_vllm=True, vllm_mode="server", vllm_server_base_url=sys.argv[1], vllm_server_timeout=60, **settings,
)  # fmt: skip
tokenizer = tiny_tokenizer(padding_side="left")
trainer = PPOTrainer(config, tiny_value_head_model("llama", summary_dropout_prob=0.0), tokenizer=tokenizer)
rank = trainer.accelerator.process_index
queries = [
    torch.tensor(tokenizer.encode(t)) for t in (["the film", "a story"] if rank == 0 else ["it was", "we"])
]
for step in range(2):
    responses = trainer.generate(queries, return_prompt=False, max_new_tokens=4, do_sample=True, top_k=0)
    scores = [torch.tensor(float(len(responses[0])) + rank), torch.tensor(-1.0 * step)]
    trainer.step(queries, responses, scores)
counted = {"generate_calls": requests.count("generate"), "weight_requests": requests.count("update_weights")}
engine = trainer._engine_sampler()  # the last step came after the last sampling: synced now, by rank 0
policy = trainer.accelerator.unwrap_model(trainer.model).pretrained_model


def unsharded(net):
    """A whole, unwrapped copy of `net` (FSDP2 holds shards; gathering them is a collective)."""
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in net.state_dict().items()}
    copy = tiny_model("llama")
    copy.load_state_dict(state)
    return copy


def engine_gap(net) -> float:
    """Largest gap between the engine's and `net`'s logprobs of what the engine samples after a prompt."""
    ids = torch.tensor([[5, 6, 7, 8 + rank]])
    out = engine.generate(
        ids, torch.ones_like(ids), SamplingParams(max_new_tokens=6, top_k=0), logprob_temperature=1.0
    )
    completion = out.responses[0][out.response_mask[0]]
    with torch.no_grad():
        logits = net(torch.cat([ids[0], completion])[None]).logits[0, 3:-1]
    ours = logits.float().log_softmax(-1).gather(-1, completion[:, None])[:, 0]
    return float((out.logprobs[0][: len(completion)] - ours).abs().max())


save_result(
    {
        **counted,  # the training's requests, before the checks' own below
        "rank": rank,
        "world": trainer.accelerator.num_processes,
        "prompts": sorted({tuple(p) for p in prompts if p[:3] != [5, 6, 7]}),
        "weight_sum": float(whole(policy).double().sum()),
        "sharded": bool(settings) and is_sharded(policy),
        "policy_version": trainer.policy_version,
        "gap_trained": engine_gap(unsharded(policy)),
        "gap_initial": engine_gap(tiny_model("llama")),
    }
)
