"""trl: DPOTrainer (sigmoid loss, beta 0.1), batch 16 pairs, frozen reference copy (see _supervised.py)."""

from _common import workload_args


def main(workload: str = "dpo") -> None:
    args = workload_args(__doc__)
    from _supervised import run
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    def make(common, path, tokenizer, data, callbacks):
        config = DPOConfig(**common, beta=0.1)
        model = AutoModelForCausalLM.from_pretrained(path)
        ref_model = AutoModelForCausalLM.from_pretrained(path)
        return DPOTrainer(
            model=model,
            ref_model=ref_model,
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=callbacks,
        )

    run(args, "trl", workload, make)


if __name__ == "__main__":
    main()
