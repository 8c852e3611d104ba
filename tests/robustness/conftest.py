import sys
from pathlib import Path

# share the trainer builders of tests/distributed/workers
sys.path.insert(0, str(Path(__file__).parents[1] / "distributed"))
