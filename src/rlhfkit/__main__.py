from rlhfkit.cli import main

raise SystemExit(main())
