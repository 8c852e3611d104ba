"""Trainers: one module per algorithm (and its config), plus small plumbing modules they share by composition."""
