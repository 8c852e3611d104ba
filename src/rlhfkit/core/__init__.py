"""Pure tensor maths for RLHF: no trainer state, no I/O. Needs only torch."""
