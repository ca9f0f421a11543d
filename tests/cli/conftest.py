"""``hostile_cases.py`` beside this file holds the hostile-input cases; this puts the folder on ``sys.path`` for it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
