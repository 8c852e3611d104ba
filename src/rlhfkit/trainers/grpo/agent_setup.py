"""How GRPOTrainer (and RLOO's current form) is set up for multi-turn rollouts, checked when it is built.

Three optional arguments, TRL's: `tools` (functions the model may call), `environment_factory` (a callable
making an environment, or a dict of them by name: its public methods are tools, `reset(**row)` starts a
rollout, an optional `get_reward()` scores it) and `rollout_func` (the user samples the completions).
Environments are made once and reset for every rollout (`EnvironmentPool`); a dict of factories picks one
per dataset row by its `environment` column. Everything that can be checked before training is: each tool's
schema (type hints and docstring), that the chat template renders tools and keeps earlier turns unchanged,
that every environment has `reset`, that every row names a known environment.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlhfkit.agents.tools import ToolBox
from rlhfkit.agents.turns import check_prefix_preserving

RESERVED_METHODS = ("reset", "get_reward")  # an environment's methods that are not tools


def environment_methods(environment: Any) -> list[Callable]:
    """The environment's public methods offered to the model as tools, bound to it. Read on the class, so
    that properties are not evaluated."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if not name.startswith("_") and name not in RESERVED_METHODS
    ]


def environment_reward(env_type: type) -> Callable:
    """A reward function named after `env_type`: each rollout's `get_reward()` when its environment is
    exactly of that type, None (does not apply) otherwise; async when `get_reward` is."""
    if inspect.iscoroutinefunction(env_type.get_reward):

        async def reward(environments: list, **kwargs: Any) -> list:
            return [await e.get_reward() if type(e) is env_type else None for e in environments]

    else:

        def reward(environments: list, **kwargs: Any) -> list:
            return [e.get_reward() if type(e) is env_type else None for e in environments]

    reward.__name__ = reward.__qualname__ = env_type.__name__
    return reward


class EnvironmentPool:
    """Environments made once and reset for each rollout: a batch that needs more instances of one
    environment than were ever made makes the missing ones; the rest are reused."""

    def __init__(self, factories: dict[str | None, Callable]) -> None:
        self.factories = factories
        self.instances: dict[str | None, list] = {name: [] for name in factories}

    def take(self, names: list[str | None]) -> list:
        """One distinct instance per entry of `names` (the environment each rollout uses)."""
        handed: Counter = Counter()
        taken = []
        for name in names:
            pool = self.instances[name]
            if handed[name] == len(pool):
                pool.append(self.factories[name]())
            taken.append(pool[handed[name]])
            handed[name] += 1
        return taken


@dataclass
class Agents:
    """A trainer's multi-turn setup: standalone `tools`, the environments (`pool`; `multi`: a dict of
    factories chosen by the `environment` column), `rollout_func`, and `rewards`, one reward function per
    environment class with `get_reward` (named after it, weight 1)."""

    tools: list[Callable] = field(default_factory=list)
    pool: EnvironmentPool | None = None
    multi: bool = False
    rollout_func: Callable | None = None
    rewards: list[Callable] = field(default_factory=list)
    schemas: list[dict] = field(default_factory=list)  # of every tool any rollout may get
    _standalone: ToolBox | None = field(default=None, init=False, repr=False)  # `toolbox()`'s, made once

    @property
    def uses_tools(self) -> bool:
        """Whether completions are sampled as tool-calling episodes (else by `rollout_func`)."""
        return self.rollout_func is None

    def start_environments(self, rows: dict[str, list], owner: str) -> tuple[list | None, list]:
        """(one environment per row of `rows`, what its `reset(**row)` returned); `rows` holds one entry per
        rollout. With a dict of factories the `environment` column picks it and is not passed to reset.
        (None, Nones) without environments."""
        n = len(next(iter(rows.values())))
        if self.pool is None:
            return None, [None] * n
        names = list(rows["environment"]) if self.multi else [None] * n
        check_environment_names(names, self.pool.factories, owner, what="the prompts being sampled: rollout")
        environments = self.pool.take(names)
        keys = [k for k in rows if not (self.multi and k == "environment")]
        observations = [env.reset(**{k: rows[k][i] for k in keys}) for i, env in enumerate(environments)]
        return environments, observations

    def toolbox(self, environment: Any = None) -> ToolBox:
        """The tools of one rollout: the standalone ones and its environment's methods (without an
        environment, one ToolBox, its schemas built once, serves every rollout)."""
        if environment is None:
            if self._standalone is None:
                self._standalone = ToolBox(self.tools)
            return self._standalone
        return ToolBox([*self.tools, *environment_methods(environment)])


def check_environment_names(
    names: list, factories: dict, owner: str, what: str = "train_dataset row"
) -> None:
    """ValueError naming the first row whose `environment` names no factory (TRL's check)."""
    for row, name in enumerate(names):
        if name not in factories:
            raise ValueError(
                f"{owner}: {what} {row} has environment={name!r}, which is not a key of "
                f"environment_factory; expected one of {sorted(map(str, factories))}"
            )


def _probe_environments(factories: dict, owner: str) -> tuple[list[Callable], dict]:
    """(the reward functions of the environments with `get_reward`, one probed instance of each by name)."""
    rewards, probes, reward_types = [], {}, []
    for name, factory in factories.items():
        if not callable(factory):
            raise TypeError(
                f"{owner}: environment_factory{'' if name is None else f'[{name!r}]'} must be a callable "
                f"returning an environment, got {type(factory).__name__}"
            )
        instance = factory()
        what = type(instance).__name__
        if not callable(getattr(instance, "reset", None)):
            raise ValueError(
                f"{owner}: the environment {what} made by environment_factory has no reset method; define "
                "reset(self, **row) (it starts a rollout and may return text appended to the prompt)"
            )
        if callable(getattr(instance, "get_reward", None)) and type(instance) not in reward_types:
            reward_types.append(type(instance))
            rewards.append(environment_reward(type(instance)))
        probes[name] = instance
    return rewards, probes


def setup_agents(tools: Any, rollout_func: Any, environment_factory: Any, owner: str) -> Agents | None:
    """The checked multi-turn setup of a trainer, or None when none of the three arguments is given."""
    if not tools and rollout_func is None and environment_factory is None:
        return None
    if callable(tools) or isinstance(tools, (str, dict)):
        raise TypeError(f"{owner}: tools must be a list of functions, got one {type(tools).__name__}")
    tools = list(tools or [])
    if rollout_func is not None:
        if tools or environment_factory is not None:
            raise ValueError(
                f"{owner}: rollout_func samples whole completions itself; it does not combine with tools or "
                "environment_factory (give rollout_func alone, or tools/environment_factory without it)"
            )
        if not callable(rollout_func):
            raise TypeError(f"{owner}: rollout_func must be callable (prompts, trainer) -> dict")
        return Agents(rollout_func=rollout_func)
    multi = isinstance(environment_factory, dict)
    if multi and not environment_factory:
        raise ValueError(f"{owner}: environment_factory is an empty dict; give at least one factory")
    factories = None if environment_factory is None else (
        dict(environment_factory) if multi else {None: environment_factory}
    )  # fmt: skip
    rewards, pool, probes = [], None, {}
    if factories is not None:
        rewards, probes = _probe_environments(factories, owner)
        pool = EnvironmentPool(factories)
        for name, instance in probes.items():  # not wasted: the first rollout of each reuses it
            pool.instances[name].append(instance)
    # every schema now: a tool without type hints or a docstring is an error before training
    schemas = ToolBox(tools).schemas if factories is None else _schemas_per_environment(tools, probes)
    return Agents(tools, pool, multi, None, rewards, schemas)


def _schemas_per_environment(tools: list, probes: dict) -> list[dict]:
    """The schemas of each environment's toolbox (their names may repeat across environments)."""
    schemas = []
    for instance in probes.values():
        schemas += ToolBox([*tools, *environment_methods(instance)]).schemas
    return schemas


def with_environment_rewards(reward_funcs: Any, processing_classes: Any, agents: Agents | None) -> tuple:
    """(`reward_funcs` as a list with each environment's reward appended, `reward_processing_classes` with a
    None for each of them); both unchanged without environment rewards."""
    if agents is None or not agents.rewards:
        return reward_funcs, processing_classes
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    funcs = [f for f in funcs if f is not None]
    if processing_classes is not None:
        given = (
            list(processing_classes)
            if isinstance(processing_classes, (list, tuple))
            else [processing_classes]
        )
        processing_classes = [*given, *[None] * len(agents.rewards)]
    return [*funcs, *agents.rewards], processing_classes


def check_agents(agents: Agents | None, tokenizer: Any, train_dataset: Any, args: Any, owner: str) -> None:
    """With tools or environments: the template and train set checks below, and a sampler that streams
    token logprobs (beam search scores beams: a multi-turn completion's turns could not be trained on)."""
    if agents is None or not agents.uses_tools:
        return
    if int((args.generation_kwargs or {}).get("num_beams") or 1) > 1:
        raise ValueError(
            f"{owner}: tools and environments sample each turn with token logprobs; beam search "
            "(num_beams > 1 in generation_kwargs) gives none: leave num_beams at 1"
        )
    check_tool_template(tokenizer, agents.schemas, args.chat_template_kwargs, owner)
    check_agent_dataset(train_dataset, agents, owner)


def check_tool_template(
    tokenizer: Any, schemas: list[dict], template_kwargs: dict | None, owner: str
) -> None:
    """ValueError unless the chat template renders `schemas` into the prompt and re-renders earlier turns
    unchanged once later ones exist (`agents.turns.check_prefix_preserving`)."""
    chat = [{"role": "user", "content": "hi"}]
    kwargs = {**(template_kwargs or {}), "add_generation_prompt": True, "tokenize": False}
    try:
        with_tools = tokenizer.apply_chat_template(chat, tools=schemas or None, **kwargs)
    except Exception as error:  # a template that fails on tools: say which setting to change
        raise ValueError(
            f"{owner}: the chat template cannot render tools ({type(error).__name__}: {error}); set "
            "chat_template_path to a template that lists tools"
        ) from error
    if schemas and with_tools == tokenizer.apply_chat_template(chat, **kwargs):
        raise ValueError(
            f"{owner}: the chat template ignores tools (the prompt is the same with and without them), so "
            "the model would never see their schemas; set chat_template_path to a template that lists tools"
        )
    check_prefix_preserving(tokenizer, **(template_kwargs or {}))


def check_agent_dataset(dataset: Any, agents: Agents, owner: str) -> None:
    """A map-style train set of chat prompts whose `environment` column (dict of factories) names known
    environments; a stream is checked batch by batch as it is read."""
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "column_names"):
        return
    if agents.uses_tools and "prompt" in dataset.column_names and not isinstance(dataset[0]["prompt"], list):
        raise ValueError(
            f"{owner}: tools and environments need chat prompts (a 'prompt' column of message lists) so that "
            "tool calls and results can be rendered as turns; got text prompts"
        )
    if agents.multi:
        if "environment" not in dataset.column_names:
            raise ValueError(
                f"{owner}: environment_factory is a dict, so train_dataset needs an 'environment' column "
                f"naming each row's environment; found columns {list(dataset.column_names)}"
            )
        check_environment_names(list(dataset["environment"]), agents.pool.factories, owner)
