"""trl: SFTTrainer, batch 16 x 128 tokens, no packing (see _supervised.py)."""

from _common import workload_args

if __name__ == "__main__":
    args = workload_args(__doc__)
    from _supervised import SFT_MAX_LENGTH, run
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    def make(common, path, tokenizer, data, callbacks):
        config = SFTConfig(**common, max_length=SFT_MAX_LENGTH, dataset_text_field="text", packing=False)
        model = AutoModelForCausalLM.from_pretrained(path)
        return SFTTrainer(
            model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=callbacks
        )

    run(args, "trl", "sft", make)
