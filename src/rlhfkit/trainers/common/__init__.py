"""What several trainers share, each concern in one module.

online_loop.py           `OnlineTrainerLoop`: the Trainer integration of the online trainers (RLOO, GRPO)
trainer_setup.py         `OfflineTrainer`: how the offline trainers (reward, SFT, DPO) set themselves up
config.py                config fields declared once (`option`, the mixins) and their checks
legacy_training_args.py  TrainingArguments names transformers 5 removed, still accepted
checkpointing.py         the one checkpoint format: atomic `checkpoint-<step>` folders with checksums
atomic_folders.py        folders published by renames only; the output folder's lock (one run per folder)
checkpoint_manifest.py   a checkpoint's manifest of checksums, and the checks before anything is loaded
state_files.py           state other than weights as JSON plus safetensors (`save_state`, `load_state`)
sharding.py              models sharded across processes (ZeRO-3, FSDP2): generation and checkpoints
guards.py                non-finite step guard, SIGINT/SIGTERM handling, atomic Trainer saves
health.py                health alarms over the logged metrics
progress.py              the rich progress bar and the tables of sample completions
prompts.py               prompt datasets: tokenised and checked up front, handed out in a resumable order
optimizers.py            optimizer options of the trainers that build their own (PPO, DDPO)
win_rate.py              `WinRateCallback`: the policy's win rate against a reference during training
"""
