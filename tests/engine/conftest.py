"""Engine stories import their shared helpers (never_hits.py) by name, as tests/gates does."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
