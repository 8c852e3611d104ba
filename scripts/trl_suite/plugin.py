"""pytest plugin that runs TRL's trainer tests against rlhfkit (loaded with `-p plugin` by run.py).

It (1) sends hub model ids and the `zen` dataset to local stand-ins (hub_models, hub_datasets),
(2) skips tests that cannot run on a CPU-only machine, with reasons starting "not CPU-runnable",
and (3) writes each test's outcome and one-line reason to the JSON file named by
`$TRL_SUITE_OUTCOMES`. The `trl` package the tests import is the shim under shim/ (run.py puts
it first on the path); this plugin never touches rlhfkit itself.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import shutil

import pytest

NOT_CPU = "not CPU-runnable"
# test names whose subject needs a GPU stack or the hub (vLLM server, Liger kernels, DeepSpeed, uploads)
_NOT_CPU_NAMES = re.compile(r"vllm|liger|deepspeed|push_to_hub|multi_gpu")
# skip reasons of TRL's own markers that mean "needs hardware or a GPU-only package"
_NOT_CPU_REASONS = re.compile(r"accelerator|gpu|cuda|vllm|liger|bitsandbytes|kernels|deepspeed|flash", re.I)
# Qwen2.5's special-token ids (151643 <|endoftext|>, 151645 <|im_end|>, 151657 <tool_call>, ...): tests
# that feed these to a mocked `generate` need Qwen's real tokenizer, which the stand-in does not have.
_QWEN_TOKEN_IDS = re.compile(r"\b1516[4-6]\d\b")
_NEEDS_QWEN_TOKENIZER: set[str] = set()
_OUTCOMES: dict[str, dict] = {}  # node id -> {"outcome", "reason", "duration"}


def _subclasses(cls: type) -> list[type]:
    import transformers.models.auto.modeling_auto  # noqa: F401  (defines the AutoModelFor... classes)

    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _install_model_map() -> None:
    """Route `from_pretrained(<hub id>)` of every transformers loader to the local stand-in folder."""
    import transformers
    from hub_models import is_hub_id, local_model_dir
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    owners = [
        transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoProcessor, _BaseAutoModelClass,
        transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase, transformers.PretrainedConfig,
        transformers.GenerationConfig, transformers.ProcessorMixin,
    ]  # fmt: skip
    # Each AutoModelFor... class carries its own copy of from_pretrained, which hands the name it was given
    # to the custom-code loader: it must see the local folder too, not only the classes it calls.
    owners += [cls for cls in _subclasses(_BaseAutoModelClass) if "from_pretrained" in cls.__dict__]
    for owner in owners:
        original = owner.__dict__["from_pretrained"].__func__

        @functools.wraps(original)
        def from_pretrained(cls, name, *args, _original=original, **kwargs):
            if is_hub_id(name):
                name = str(local_model_dir(os.fspath(name)))
            return _original(cls, name, *args, **kwargs)

        owner.from_pretrained = classmethod(from_pretrained)


def _install_dataset_map() -> None:
    """Route `datasets.load_dataset(<hub dataset>, <config>)` to local parquet stand-ins."""
    import datasets
    from hub_datasets import local_dataset_files
    from hub_models import is_hub_id

    original = datasets.load_dataset

    @functools.wraps(original)
    def load_dataset(path, name=None, *args, **kwargs):
        if not is_hub_id(path):
            return original(path, name, *args, **kwargs)
        return original("parquet", None, *args, data_files=local_dataset_files(path, name), **kwargs)

    datasets.load_dataset = load_dataset


def _install_hub_cleanup_stub() -> None:
    """Hub clean-up in class tear-downs (deleting a test repo) has nothing to delete offline."""
    import huggingface_hub

    huggingface_hub.HfApi.delete_repo = lambda self, *args, **kwargs: None


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: TRL's slow tests (run on GPU machines in TRL's CI)")
    _install_model_map()
    _install_dataset_map()
    _install_hub_cleanup_stub()


@pytest.fixture
def lazy_shared_datadir(request, tmp_path):
    """pytest-datadir's fixture (not installed here): a copy of the test folder's `data/`."""
    copy = tmp_path / "shared-data"
    shutil.copytree(request.path.parent / "data", copy)
    return copy


def _not_cpu_reason(item) -> str | None:
    if item.get_closest_marker("slow"):
        return f"{NOT_CPU}: marked slow (TRL runs these on GPU machines)"
    subject = _NOT_CPU_NAMES.search(getattr(item, "originalname", item.name))
    if subject:
        return f"{NOT_CPU}: test of {subject.group(0)}"
    for mark in item.iter_markers("skipif"):
        reason = str(mark.kwargs.get("reason", ""))
        if _NOT_CPU_REASONS.search(reason):
            return f"{NOT_CPU}: {reason}"
    return None


def _source(item) -> str:
    try:
        return inspect.getsource(item.function)
    except (AttributeError, OSError, TypeError):
        return ""


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        reason = _not_cpu_reason(item)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
        elif _QWEN_TOKEN_IDS.search(_source(item)):
            _NEEDS_QWEN_TOKENIZER.add(item.nodeid)


def _one_line(report) -> str:
    """The exception type and the first line of its message (or the skip reason)."""
    if report.skipped:
        longrepr = report.longrepr
        return str(longrepr[2] if isinstance(longrepr, tuple) else longrepr).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    else:  # e.g. a fixture that does not exist: take pytest's "E   ..." line
        lines = str(report.longrepr).strip().splitlines()
        text = next((line[1:].strip() for line in lines if line.startswith("E ")), lines[-1])
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else text)[:300]


def pytest_runtest_logreport(report):
    entry = _OUTCOMES.setdefault(report.nodeid, {"outcome": "passed", "reason": ""})
    if report.when == "call" and hasattr(report, "wasxfail"):
        entry.update(outcome="xfailed" if report.skipped else "xpassed", reason=str(report.wasxfail))
    elif report.skipped and entry["outcome"] == "passed":
        entry.update(outcome="skipped", reason=_one_line(report))
    elif report.failed:
        kind = "failed" if report.when == "call" else "error"
        if entry["outcome"] not in ("failed", "error"):
            reason = _one_line(report)
            if report.nodeid in _NEEDS_QWEN_TOKENIZER:
                reason = f"HarnessUnmapped: test hard-codes Qwen2.5 token ids ({reason})"
            entry.update(outcome=kind, reason=reason)
    if report.when == "call":
        entry["duration"] = round(report.duration, 2)
    if report.when == "teardown":
        _write_outcomes()  # after every test, so a file stopped by run.py's file limit keeps what ran


def pytest_collectreport(report):
    if report.failed:  # a file that does not import: one error standing for all its tests
        _OUTCOMES[report.nodeid] = {"outcome": "error", "reason": "collection: " + _one_line(report)}


def pytest_sessionfinish(session, exitstatus):
    _write_outcomes()


def _write_outcomes() -> None:
    path = os.environ.get("TRL_SUITE_OUTCOMES")
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(_OUTCOMES, handle, indent=1, sort_keys=True)
