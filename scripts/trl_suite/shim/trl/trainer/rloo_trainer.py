"""`trl.trainer.rloo_trainer`: names resolve to rlhfkit's (see `trl._resolve`)."""

from trl._resolve import module_getattr

__getattr__ = module_getattr("trl.trainer.rloo_trainer")
