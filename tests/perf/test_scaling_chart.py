"""The scaling chart: measured points in, one PNG out (no points: an error, not an empty chart)."""

from __future__ import annotations

import pytest

from kvoffload.report.scaling import ScalingPoint, draw_scaling


def test_points_of_two_series_become_one_png(tmp_path):
    points = [ScalingPoint("conversation sync", n, n * 0.1, 2**28 + n * 2**18) for n in (250, 500, 1000)]
    points += [ScalingPoint("synthetic sync", n, n * 0.2, 2**28) for n in (250, 500)]
    out = draw_scaling(points, tmp_path / "charts" / "scaling.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_no_points_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no scaling points"):
        draw_scaling([], tmp_path / "scaling.png")
