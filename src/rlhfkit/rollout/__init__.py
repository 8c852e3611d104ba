"""Generation and scoring of completions, shared by PPO and RLOO."""
