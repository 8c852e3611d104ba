"""Model wrappers (value heads, reference models, adapters, diffusion pipelines). No loss code."""
