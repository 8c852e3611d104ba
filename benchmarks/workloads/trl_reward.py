"""trl: RewardTrainer, batch 16 pairs of 64-token sequences (see _supervised.py)."""

from _common import workload_args

if __name__ == "__main__":
    args = workload_args(__doc__)
    from _supervised import PAIR_MAX_LENGTH, run
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    def make(common, path, tokenizer, data, callbacks):
        config = RewardConfig(**common, max_length=PAIR_MAX_LENGTH)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        return RewardTrainer(
            model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=callbacks
        )

    run(args, "trl", "reward", make)
