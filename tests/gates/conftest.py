"""The gates' shared helpers live in ``story.py`` next to this file."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
