"""Every engine setting has a decision for the vllm-scheduler engine (kvoffload/vllm/settings.py):
honoured (it reaches vLLM's config, the connector's options, or the replay's model and copies)
or refused with one line. Runs in the main suite (no vllm import): a new EngineConfig field
without a decision fails here; tests/vllm/test_engine_settings.py checks each decision in vLLM."""

from __future__ import annotations

import dataclasses

import pytest

from kvoffload.core.types import ConfigError
from kvoffload.engine.config import EngineConfig
from kvoffload.vllm.settings import HONOURED, REFUSED, REFUSED_FOR_STOCK, refuse_unhonoured

# A value other than the default for each refused setting.
OTHER_VALUE = {"workers": 2, "slot_bytes": 32, "profile": "h200-llama3-8b", "strict_lifecycle": False}


def test_every_engine_setting_is_honoured_or_refused():
    fields = {field.name for field in dataclasses.fields(EngineConfig)}
    assert set(HONOURED) | set(REFUSED) == fields, "decide how --engine vllm-scheduler honours the new setting"
    assert not set(HONOURED) & set(REFUSED)
    assert set(REFUSED_FOR_STOCK) <= set(HONOURED)  # honoured for our connector, refused for stock
    assert set(OTHER_VALUE) == set(REFUSED) | set(REFUSED_FOR_STOCK)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_setting_is_one_line_naming_it(name):
    engine = EngineConfig().replace(**{name: OTHER_VALUE[name]})
    for stock in (False, True):
        with pytest.raises(ConfigError) as raised:
            refuse_unhonoured(engine, *((REFUSED_FOR_STOCK, "--connector stock") if stock else ()))
        message = str(raised.value)
        assert message.startswith(f"{name}={OTHER_VALUE[name]!r} is not honoured by --engine vllm-scheduler")
        assert REFUSED[name] in message and "\n" not in message


def test_strict_lifecycle_is_refused_for_stock_only():
    engine = EngineConfig(strict_lifecycle=False)
    refuse_unhonoured(engine)
    with pytest.raises(ConfigError, match="strict_lifecycle=False is not honoured by --engine vllm-scheduler "
                                          "with --connector stock"):
        refuse_unhonoured(engine, REFUSED_FOR_STOCK, "--connector stock")


def test_the_defaults_and_every_honoured_setting_pass():
    refuse_unhonoured(EngineConfig(), REFUSED_FOR_STOCK, "--connector stock")
    refuse_unhonoured(EngineConfig(gpu_blocks=64, reserve_full_isl=False, scheduling="async", seed=3),
                      REFUSED_FOR_STOCK, "--connector stock")
