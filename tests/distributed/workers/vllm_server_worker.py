"""Worker: GRPO on 2 gloo processes sampling through one real `rlhfkit vllm-serve` server (its URL is the
first argument; `--fsdp`: the policy sharded by FSDP2, `--lora`: a LoRA policy). Each rank reports the
requests it made, the prompts it sampled, its final weights' sum, and how far the engine's logprobs are from
its trained model's before and after the last sync, and from its initial model's."""

import sys
import tempfile

import torch
from launch import save_result

from rlhfkit import GRPOConfig, GRPOTrainer
from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout import SamplingParams, vllm_client
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer

requests, prompts = [], []
call = vllm_client._call


def recording_call(url, payload=None, **kwargs):
    requests.append(url.rsplit("/", 2)[-2] if url.endswith("/") else url.split("/")[-2])
    if payload is not None and "prompt_token_ids" in payload:
        prompts.extend(payload["prompt_token_ids"])
    return call(url, payload, **kwargs)


vllm_client._call = recording_call
settings, whole = {}, lambda net: torch.cat([p.detach().reshape(-1) for p in net.parameters()])
if "--fsdp" in sys.argv:  # the policy sharded by accelerate's FSDP2
    from fsdp_cpu import FSDP2_ARGS, full_params, is_sharded

    settings, whole = FSDP2_ARGS, full_params


lora = None
if "--lora" in sys.argv:  # a LoRA policy: the engine must get the adapters merged into the base weights
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj", "up_proj"])


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


config = GRPOConfig(
    output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, per_device_train_batch_size=8,
    num_generations=4, max_completion_length=5, max_steps=2, logging_steps=1, save_strategy="no",
    disable_tqdm=True, seed=3, learning_rate=1e-2 if lora is None else 5e-2,
    use_vllm=True, vllm_mode="server", vllm_server_base_url=sys.argv[1], vllm_server_timeout=60, **settings,
)  # fmt: skip
trainer = GRPOTrainer(
    tiny_model("llama"), count_e, args=config, train_dataset=toy_prompt_dataset(n=32),
    processing_class=tiny_tokenizer(padding_side="left"), peft_config=lora,
)  # fmt: skip
trainer.train()
model = trainer.accelerator.unwrap_model(trainer.model)
engine = trainer._engine


def engine_gap(net) -> float:
    """Largest gap between the engine's and `net`'s logprobs of what the engine samples after a prompt."""
    ids = torch.tensor([[5, 6, 7, 8 + trainer.accelerator.process_index]])
    out = engine.generate(
        ids, torch.ones_like(ids), SamplingParams(max_new_tokens=6, top_k=0), logprob_temperature=1.0
    )
    completion = out.responses[0][out.response_mask[0]]
    with torch.no_grad():
        logits = net(torch.cat([ids[0], completion])[None]).logits[0, 3:-1]
    ours = logits.log_softmax(-1).gather(-1, completion[:, None])[:, 0]
    return float((out.logprobs[0][: len(completion)] - ours).abs().max())


gap_before_sync = engine_gap(model)  # the last update came after the last sampling
assert trainer._sampler() is engine  # synced now, by rank 0
counted = {  # the training's requests and the sync's, not the checks' own generate calls
    "generate_calls": requests.count("generate") - 1,
    "weight_requests": requests.count("update_weights"),
}
save_result(
    {
        "gap_before_sync": gap_before_sync,
        **counted,
        "rank": trainer.accelerator.process_index,
        "world": trainer.accelerator.num_processes,
        "prompts": sorted({tuple(p) for p in prompts if p[:3] != [5, 6, 7]}),
        "weight_sum": float(whole(model).double().sum()),
        "sharded": bool(settings) and is_sharded(model),
        "gap_trained": engine_gap(model),
        "gap_initial": engine_gap(tiny_model("llama")),
        "steps": trainer.state.global_step,
    }
)
