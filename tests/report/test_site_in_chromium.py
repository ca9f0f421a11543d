"""The published report as a person sees it: headless Chromium opens index.html from disk with
the network cut off (every request that is not ``file:`` is aborted and counted: ``browser.py``),
and every image must load, no console error may appear, and the whole page's screenshot (tiles
of at most 16384 px, top down) must cover exactly the page's height at the window's width. A
report drawn from the committed results must fit a 1400 px window: no sideways scrolling, every
figure drawn at its own width (1:1).

Skipped where no Chromium is installed (``apt-get install -y chromium``), except where
``KVOFFLOAD_REQUIRE_CHROMIUM=1`` (CI sets it: there a missing browser is a failure, not a skip).
Screenshots go to ``$KVOFFLOAD_SCREENSHOTS`` when set (to look at them), else to the test's
temporary folder: ``<name>-01.png``, ``<name>-02.png``, ... from the top of the page down.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvoffload.report import draw_report
from report_browser import CHROMIUM, TILE_HEIGHT, WIDTH, PageVisit, open_page, png_size

pytestmark = pytest.mark.chromium

REPO = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("KVOFFLOAD_REQUIRE_CHROMIUM") == "1"
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not REQUIRED,
                                    reason="no Chromium on PATH (apt-get install -y chromium)")


def shots_dir(tmp_path: Path) -> Path:
    shots = Path(os.environ.get("KVOFFLOAD_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def save_tiles(visit: PageVisit, shots: Path, name: str) -> list[tuple[int, int]]:
    """Write the screenshot's tiles as ``name-01.png``, ... and return their sizes."""
    for i, tile in enumerate(visit.screenshots, 1):
        (shots / f"{name}-{i:02d}.png").write_bytes(tile)
    return [png_size(tile) for tile in visit.screenshots]


def assert_whole_page_shot(visit: PageVisit, sizes: list[tuple[int, int]]) -> None:
    """The tiles cover the page top to bottom at the window's width, none taller than a texture."""
    assert visit.viewport_width == WIDTH
    assert [width for width, _ in sizes] == [WIDTH] * len(sizes)
    assert sum(height for _, height in sizes) == visit.scroll_height
    assert all(height <= TILE_HEIGHT for _, height in sizes)


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
    sizes = save_tiles(visit, shots_dir(tmp_path), "committed-report")
    assert_whole_page_shot(visit, sizes)
    assert visit.scroll_height > 400 * len(figures)  # every figure stacked: far taller than one screen
    assert all(len(tile) > 10_000 for tile in visit.screenshots)  # pictures, not blank tiles


@needs_chromium
def test_a_report_of_the_committed_results_fits_a_1400_px_window(tmp_path):
    """Drawn now from results/ (the committed page may predate the layout): nothing scrolls sideways,
    and every figure is drawn at its own width, so its text is as legible as in the PNG."""
    out = tmp_path / "charts"
    draw_report(REPO / "results", out)
    visit = open_page((out / "index.html").as_uri())
    assert visit.errors == [] and [src for src, ok in visit.images if not ok] == []
    assert visit.scroll_width <= visit.viewport_width == WIDTH
    scaled = {src: sizes for src, sizes in visit.image_widths.items() if sizes[1] != sizes[0]}
    assert scaled == {}  # src: (the PNG's width, the width drawn)
    assert_whole_page_shot(visit, save_tiles(visit, shots_dir(tmp_path), "drawn-report"))


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


# What the pointer meets over the middle of each commit slot of the first history chart: at the
# whole pixel there, where a mouse rests at a device pixel ratio of 1 (Chromium hit-tests a point
# by the whole pixel it falls in; a slot of one pixel has no middle of its own otherwise).
HOVER = """JSON.stringify([...document.querySelectorAll('.chart')].filter(c => c.querySelector('a.slot'))[0]
  ? [...[...document.querySelectorAll('.chart')].filter(c => c.querySelector('a.slot'))[0].querySelectorAll('a.slot')]
      .map(a => { a.scrollIntoView({block: 'center'}); const r = a.getBoundingClientRect();
                  const hit = document.elementFromPoint(Math.floor(r.left + r.width / 2), r.top + r.height / 2);
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
