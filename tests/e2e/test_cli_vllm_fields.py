"""The `vllm_*` fields from the command line: what rlhfkit cannot do is a one-line error naming why, before
any model is loaded, and a regex given without an engine is refused the same way."""

from __future__ import annotations

import re

import pytest

from rlhfkit.commands.grpo import main as grpo
from rlhfkit.commands.rloo import main as rloo

ANY_RUN = ["--model_name_or_path", "unused", "--dataset_name", "unused", "--reward_funcs", "unused.fn",
           "--use_cpu", "--report_to", "none"]  # fmt: skip


@pytest.mark.parametrize("command", [grpo, rloo])
@pytest.mark.parametrize(
    "flags, message",
    [
        # TRL's NCCL group cannot exist on CPU, and rlhfkit sends weights without one: the reason is named
        (["--vllm_group_port", "51217"], r"vllm_group_port=51217 .* NCCL .* where there is no NCCL group"),
        (["--vllm_structured_outputs_regex", "(yes|no)"], r"vllm_structured_outputs_regex .* use_vllm=True"),
        (
            ["--use_vllm", "true", "--vllm_mode", "server", "--vllm_structured_outputs_regex", "[0-9"],
            r"vllm_structured_outputs_regex='\[0-9' is not a regular expression",
        ),
    ],
)
def test_an_unusable_vllm_setting_is_a_one_line_error(tmp_path, capsys, command, flags, message):
    code = command([*ANY_RUN, "--output_dir", str(tmp_path), *flags])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1
    assert re.search(message, error[0]), error[0]
