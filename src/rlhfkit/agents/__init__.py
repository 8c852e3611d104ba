"""Agentic rollouts: tools a model calls while it samples, and multi-turn episodes built token by token.

`ToolBox` runs the tools (time limit, errors the model reads), `parse_turn` finds the calls in a sampled
turn, `tool_suffix_ids` gives the template's tokens for the tool results, and `run_episodes` drives any
`GenerationBackend` through the turns, keeping a mask of which tokens the model sampled. Names load lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ToolBox": "rlhfkit.agents.tools",
    "ToolResult": "rlhfkit.agents.tools",
    "Turn": "rlhfkit.agents.parsing",
    "parse_turn": "rlhfkit.agents.parsing",
    "tool_call_format": "rlhfkit.agents.parsing",
    "tool_suffix_ids": "rlhfkit.agents.turns",
    "check_prefix_preserving": "rlhfkit.agents.turns",
    "Episode": "rlhfkit.agents.episodes",
    "episode_metrics": "rlhfkit.agents.episodes",
    "run_episodes": "rlhfkit.agents.rollout",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'rlhfkit.agents' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
