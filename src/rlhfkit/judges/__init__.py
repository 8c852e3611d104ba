"""Judges: which of two completions is better, and how often a model beats a reference.

- `base`: TRL's interfaces, `BasePairwiseJudge` (index of the better of two, -1 = tie) and `BaseRankJudge`
- `scored`: judges that score each completion alone, by a reward model (`RewardModelJudge`) or a rule /
  lexicon function (`RuleJudge`), and `ScoreRankJudge` to rank by those scores
- `lm`: `LMPairwiseJudge`, a local causal LM asked which answer is better, both orders, via choice logprobs
- `win_rates`: `win_rate`, the win rate with its 95% Wilson interval (ties count half)
- `loading`: `load_judge`, from a `--judge_model` value (local folder or built-in rule judge name), and
  `check_judge_model`, which refuses a missing or unknown value without loading anything
"""

from rlhfkit.judges.base import TIE, BaseJudge, BasePairwiseJudge, BaseRankJudge
from rlhfkit.judges.lm import DEFAULT_TEMPLATE, LMPairwiseJudge
from rlhfkit.judges.loading import check_judge_model, load_judge, rule_judge_names
from rlhfkit.judges.scored import RewardModelJudge, RuleJudge, ScoreJudge, ScoreRankJudge
from rlhfkit.judges.win_rates import WinRate, wilson_interval, win_rate

__all__ = [
    "DEFAULT_TEMPLATE",
    "TIE",
    "BaseJudge",
    "BasePairwiseJudge",
    "BaseRankJudge",
    "LMPairwiseJudge",
    "RewardModelJudge",
    "RuleJudge",
    "ScoreJudge",
    "ScoreRankJudge",
    "WinRate",
    "check_judge_model",
    "load_judge",
    "rule_judge_names",
    "wilson_interval",
    "win_rate",
]
