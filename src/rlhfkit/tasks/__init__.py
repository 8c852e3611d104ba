"""Built-in toy tasks and data for the demo, examples and tests (no download)."""
