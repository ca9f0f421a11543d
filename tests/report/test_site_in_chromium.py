"""The published report as a person sees it: headless Chromium opens index.html from disk with
the network cut off (every request that is not ``file:`` is aborted and counted: ``browser.py``),
and every image must load, no console error may appear, and the whole page's screenshot must be
the page's width and a real picture.

Skipped where no Chromium is installed (``apt-get install -y chromium``), except where
``KVOFFLOAD_REQUIRE_CHROMIUM=1`` (CI sets it: there a missing browser is a failure, not a skip).
Screenshots go to ``$KVOFFLOAD_SCREENSHOTS`` when set (to look at them), else to the test's
temporary folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from report_browser import CHROMIUM, WIDTH, open_page, png_size

pytestmark = pytest.mark.chromium

REPO = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("KVOFFLOAD_REQUIRE_CHROMIUM") == "1"
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not REQUIRED,
                                    reason="no Chromium on PATH (apt-get install -y chromium)")


def shots_dir(tmp_path: Path) -> Path:
    shots = Path(os.environ.get("KVOFFLOAD_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    return shots


@pytest.fixture
def site(tmp_path) -> Path:
    """A copy of the committed report (the probes below change it)."""
    copy = tmp_path / "charts"
    shutil.copytree(REPO / "results" / "charts", copy)
    return copy


@needs_chromium
def test_the_committed_report_loads_every_image_offline(site, tmp_path):
    visit = open_page((site / "index.html").as_uri())
    figures = sorted(p.name for p in site.glob("*.png"))
    assert sorted(src for src, _ in visit.images) == figures and figures
    assert [src for src, ok in visit.images if not ok] == []
    assert visit.blocked == []  # the page asks nothing of the network
    assert visit.errors == []
    shot = shots_dir(tmp_path) / "committed-report.png"
    shot.write_bytes(visit.screenshot)
    width, height = png_size(visit.screenshot)
    # the whole page at the fixed width: every figure stacked, so far taller than one screen
    assert width == WIDTH and height > 400 * len(figures)
    assert len(visit.screenshot) > 100_000


@needs_chromium
def test_a_missing_figure_is_seen_as_broken(site):
    """The check can fail: a report whose figure was deleted shows a broken image."""
    victim = sorted(site.glob("*.png"))[0]
    victim.unlink()
    visit = open_page((site / "index.html").as_uri())
    assert [src for src, ok in visit.images if not ok] == [victim.name]
    assert len(visit.images) > 1


@needs_chromium
def test_a_remote_request_is_aborted_and_counted(site):
    """The network is cut off, not merely unused: a page that asks for a remote image and script
    gets neither, each request is counted, and the failure shows as a console error."""
    page = site / "index.html"
    page.write_text(page.read_text().replace(
        "</body>", "<img src='http://example.com/x.png'><script src='https://cdn.example.com/lib.js'></script></body>"))
    visit = open_page(page.as_uri())
    assert sorted(visit.blocked) == ["http://example.com/x.png", "https://cdn.example.com/lib.js"]
    assert ("http://example.com/x.png", False) in visit.images
    assert visit.errors  # a blocked load is an error a reader's console shows


# What the pointer meets over the middle of each commit slot of the first history chart.
HOVER = """JSON.stringify([...document.querySelectorAll('.chart')].filter(c => c.querySelector('a.slot'))[0]
  ? [...[...document.querySelectorAll('.chart')].filter(c => c.querySelector('a.slot'))[0].querySelectorAll('a.slot')]
      .map(a => { a.scrollIntoView({block: 'center'}); const r = a.getBoundingClientRect();
                  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
                  return [hit === a, a.title, r.width > 0 && r.height > 0]; })
  : [])"""


@needs_chromium
def test_a_history_chart_names_the_commit_under_the_pointer(site):
    import json
    import re

    visit = open_page((site / "index.html").as_uri(), probe=HOVER)
    slots = json.loads(visit.probe)
    assert len(slots) > 10  # one per commit of main's line (the committed history has them all)
    assert all(hit and sized for hit, _, sized in slots)  # each slot is on top of the image, with a size
    assert all(re.match(r"[0-9a-f]{12} \d{4}-\d{2}-\d{2}", title) for _, title, _ in slots)
