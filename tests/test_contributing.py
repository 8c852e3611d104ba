"""docs/contributing.md stays true: each registry it names lives in the file it names, and a toy loss
type added by its first recipe alone (one entry in `POLICY_LOSSES`) trains through GRPO."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

from rlhfkit.core import advantages, policy_losses
from rlhfkit.core.policy_losses import POLICY_LOSSES, PolicyLossSpec, Surrogate, clipped_surrogate
from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout import backends
from rlhfkit.tasks import registry, toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.grpo import GRPOConfig, GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs/contributing.md").read_text(encoding="utf-8")


def recipe(title: str) -> str:
    """The text of one `## title` section."""
    start = PAGE.index(f"## {title}")
    end = PAGE.find("\n## ", start + 1)
    return PAGE[start : end if end != -1 else None]


def named_files(section: str) -> set[str]:
    return {path for path in re.findall(r"`((?:src|tests|docs)/[\w/.<>]+)`", section) if "<" not in path}


@pytest.mark.parametrize(
    "title, module, registry_name",
    [
        ("A loss type", policy_losses, "POLICY_LOSSES"),
        ("An advantage estimator", advantages, "ADVANTAGE_ESTIMATORS"),
        ("A generation backend", backends, "GENERATION_BACKENDS"),
        ("A reward function", registry, "TASKS"),
    ],
)
def test_each_recipe_names_the_file_that_holds_its_registry(title, module, registry_name):
    assert hasattr(module, registry_name)
    source = Path(inspect.getsourcefile(module)).relative_to(ROOT).as_posix()
    assert source in named_files(recipe(title)), f"{title}: {source} (holds {registry_name}) is not listed"


def test_every_file_the_page_names_exists():
    for path in named_files(PAGE):
        assert (ROOT / path).exists(), path


def test_every_generation_backend_in_the_registry_loads():
    for name, target in backends.GENERATION_BACKENDS.items():
        module, cls = target.split(":")
        backend = getattr(__import__(module, fromlist=[cls]), cls)
        assert issubclass(backend, backends.GenerationBackend), name


def _shifted_surrogate(x) -> Surrogate:
    """The clipped surrogate plus 1 on every token: under dapo's token mean, a loss exactly 1 above dapo's."""
    base = clipped_surrogate(x)
    return base._replace(per_token_loss=base.per_token_loss + 1.0)


def _first_loss(tmp_path, loss_type: str) -> float:
    args = GRPOConfig(
        output_dir=str(tmp_path / loss_type),
        report_to="none",
        use_cpu=True,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=5,
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=3,
        loss_type=loss_type,
    )
    torch.manual_seed(0)
    trainer = GRPOTrainer(
        tiny_model("llama"),
        KeywordReward("e"),
        args=args,
        train_dataset=toy_prompt_dataset(n=16),
        processing_class=tiny_tokenizer(padding_side="left"),
    )
    trainer.train()
    return next(h["loss"] for h in trainer.state.log_history if "loss" in h)


def test_a_toy_loss_type_needs_only_its_registry_entry(tmp_path, monkeypatch):
    dapo = POLICY_LOSSES["dapo"]
    monkeypatch.setitem(POLICY_LOSSES, "toy", PolicyLossSpec(_shifted_surrogate, dapo.normaliser))
    assert _first_loss(tmp_path, "toy") == pytest.approx(_first_loss(tmp_path, "dapo") + 1.0, abs=1e-5)
    with pytest.raises(ValueError, match="loss_type must be one of .*toy"):
        GRPOConfig(output_dir=str(tmp_path / "x"), report_to="none", loss_type="no-such-loss")
