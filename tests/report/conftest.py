"""``report_browser.py`` beside this file drives headless Chromium; this puts the folder on ``sys.path`` for it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config):
    config.addinivalue_line("markers", "chromium: renders the report in headless Chromium (skipped where it is missing)")
