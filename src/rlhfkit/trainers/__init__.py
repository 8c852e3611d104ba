"""Trainers: one module per algorithm, plus `common` for the plumbing they share."""
