"""Newest TRL: GRPOTrainer, beta=0, 16 completions (4 prompts x 4) per optimizer step (see _grpo_loop.py).

TRL-only settings, all at what rlhfkit does: transformers generate (no vLLM, no paged or continuous batching),
no Liger kernel, dropout left as the model has it (the tiny models have none), no completion logging.
"""

from _common import workload_args

TRL_SETTINGS = dict(
    use_vllm=False,
    use_liger_kernel=False,
    use_transformers_paged=False,
    disable_dropout=False,
    cast_lm_head_to_fp32=False,
)

if __name__ == "__main__":
    args = workload_args(__doc__)
    from _grpo_loop import run
    from trl import GRPOConfig, GRPOTrainer

    run(args, "trl", "grpo", GRPOConfig, GRPOTrainer, **TRL_SETTINGS)
