"""One module per `rlhfkit <command>`; each exposes `main(argv) -> int`."""
