"""Test-only stand-in for `trl`: every name is rlhfkit's (see `_resolve`), never TRL's."""

from trl._resolve import module_getattr
from trl.import_utils import (  # noqa: F401  facts about the environment, which TRL's tests import from here
    is_diffusers_available,
    is_liger_kernel_available,
    is_peft_available,
    is_vllm_available,
)

__version__ = "0.0.0+rlhfkit-shim"
__getattr__ = module_getattr("trl")
