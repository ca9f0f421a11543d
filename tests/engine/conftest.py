"""Engine stories import their shared helpers by name: scripted.py and never_hits.py beside this
file, and the gates' story.py (a bounded, traced replay and its readers)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "gates"))
