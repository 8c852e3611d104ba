"""`trl.import_utils`: whether optional packages are installed, answered from this environment."""

import importlib.metadata
import importlib.util


def _installed(name: str, min_version: str | None = None) -> bool:
    """Whether `name` imports here; with `min_version`, whether its installed version is at least that."""
    if importlib.util.find_spec(name) is None:
        return False
    if min_version is None:
        return True
    from packaging.version import Version

    return Version(importlib.metadata.version(name.replace("_", "-"))) >= Version(min_version)


def is_diffusers_available(min_version: str | None = None) -> bool:
    return _installed("diffusers", min_version)


def is_harbor_available(min_version: str | None = None) -> bool:
    return _installed("harbor", min_version)


def is_jmespath_available(min_version: str | None = None) -> bool:
    return _installed("jmespath", min_version)


def is_joblib_available(min_version: str | None = None) -> bool:
    return _installed("joblib", min_version)


def is_liger_kernel_available(min_version: str | None = None) -> bool:
    return _installed("liger_kernel", min_version)


def is_math_verify_available(min_version: str | None = None) -> bool:
    return _installed("math_verify", min_version)


def is_mergekit_available(min_version: str | None = None) -> bool:
    return _installed("mergekit", min_version)


def is_openreward_available(min_version: str | None = None) -> bool:
    return _installed("openreward", min_version)


def is_peft_available(min_version: str | None = None) -> bool:
    return _installed("peft", min_version)


def is_vllm_available(min_version: str | None = None) -> bool:
    return _installed("vllm", min_version)


def is_deepspeed_available(min_version: str | None = None) -> bool:
    return _installed("deepspeed", min_version)
