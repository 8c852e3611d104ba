from rlhfkit.cli import main

if __name__ == "__main__":  # vLLM's engine starts in a spawned process, which re-imports this module
    raise SystemExit(main())
