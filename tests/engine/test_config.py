"""The engine's settings check themselves: a caller of the Python API, with no TOML loader or
``--set`` parser in between, gets one ConfigError naming the setting, never a run that misreads
it (a bool is an int to Python, and a float or a string compares or fails deep in a replay)."""

from __future__ import annotations

import pytest

from kvoffload.core.types import ConfigError
from kvoffload.engine.config import EngineConfig


@pytest.mark.parametrize("value", [True, 8.0, "8", None], ids=["bool", "float", "str", "None"])
def test_a_count_of_another_type_is_refused_by_name(value):
    with pytest.raises(ConfigError) as refused:
        EngineConfig(cpu_chunks=value)
    assert str(refused.value) == f"cpu_chunks must be an integer >= 1, got {value!r}"
