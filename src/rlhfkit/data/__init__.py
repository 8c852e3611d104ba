"""Collators, packing and dataset preparation."""
