"""The published report as a person sees it: headless Chromium opens index.html from disk, with
networking off, every image must load, and a screenshot is saved.

Skipped where no Chromium is installed (``apt-get install -y chromium``). Screenshots go to
``$KVOFFLOAD_SCREENSHOTS`` when set (to look at them), else to the test's temporary folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.chromium

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH (apt-get install -y chromium)")

# Appended to a copy of the page: once everything has loaded, list every image that did not.
PROBE = """<script>window.addEventListener('load', () => {
  const bad = [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'));
  const out = document.createElement('pre'); out.id = 'probe';
  out.textContent = 'images=' + document.images.length + ' broken=' + JSON.stringify(bad);
  document.body.appendChild(out);
});</script>"""


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run", f"--user-data-dir={profile}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def render(site: Path, tmp_path: Path, shot_name: str) -> tuple[int, list[str], Path]:
    """(images on the page, the src of each broken one, the screenshot) for ``site``/index.html."""
    html = (site / "index.html").read_text()
    # nothing from the network: every src and href is a file beside the page
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", html), "the page loads something remote"
    probe = site / "index.probe.html"
    probe.write_text(html.replace("</body>", PROBE + "</body>"))
    try:
        dom = chromium(tmp_path / "profile-dom", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    finally:
        probe.unlink()
    found = re.search(r"images=(\d+) broken=(\[.*?\])", dom.stdout)
    assert found, f"the probe did not run: {dom.stderr[-500:]}"
    shots = Path(os.environ.get("KVOFFLOAD_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / shot_name
    chromium(tmp_path / "profile-shot", "--window-size=1400,2400", "--hide-scrollbars",
             f"--screenshot={shot}", (site / "index.html").as_uri())
    broken = re.findall(r'"([^"]*)"', found.group(2))
    return int(found.group(1)), broken, shot


@needs_chromium
def test_the_committed_report_loads_every_image(tmp_path):
    site = tmp_path / "charts"
    shutil.copytree(REPO / "results" / "charts", site)  # the probe page is written beside a copy
    images, broken, shot = render(site, tmp_path, "committed-report.png")
    assert images == len(list(site.glob("*.png"))) > 0
    assert broken == []
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000


@needs_chromium
def test_a_missing_figure_is_seen_as_broken(tmp_path):
    """The check can fail: a report whose figure was deleted shows a broken image."""
    site = tmp_path / "charts"
    shutil.copytree(REPO / "results" / "charts", site)
    victim = sorted(site.glob("*.png"))[0]
    victim.unlink()
    images, broken, _ = render(site, tmp_path, "broken-report.png")
    assert broken == [victim.name] and images > 1
