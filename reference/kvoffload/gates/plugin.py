"""The gates' pytest plugin: ``--kv-connector`` names the connector under test; ``--kv-preset``
(a vLLM release the reference imitates) and ``--kv-disable`` (fix flags switched off) plant a
catalogued bug in the reference, to watch its gate fail."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("kvoffload gates")
    group.addoption("--kv-connector", default="reference",
                    help="connector under test: stock (vLLM's OffloadingConnector), reference, simple-cpu[-lazy] "
                         "(vLLM's SimpleCPUOffloadConnector), or MODULE:CLASS")
    group.addoption("--kv-preset", default=None, help="with --kv-connector reference: a vLLM release's preset")
    group.addoption("--kv-disable", default="",
                    help="with --kv-connector reference: fix flags to switch off, comma-separated (kvoffload fixes)")


def _disabled(config) -> tuple[str, ...]:
    """``--kv-disable a,b`` as its fix names."""
    return tuple(name for name in config.getoption("--kv-disable").split(",") if name)


def pytest_configure(config) -> None:
    """Bad options end the run in one line before any gate is collected (collecting imports vLLM
    and torch: tens of seconds)."""
    from kvoffload.choice import ConnectorChoice, check_source
    from kvoffload.core.types import ConfigError

    option = config.getoption
    disabled = _disabled(config)
    try:
        ConnectorChoice.build(option("--kv-preset"), disabled)  # an unknown preset or fix name
        check_source(option("--kv-connector"), option("--kv-preset"), disabled)
    except ConfigError as error:
        raise pytest.UsageError(f"kvoffload gates: {error}") from None


@dataclass(frozen=True)
class GateConnector:
    source: str
    preset: str | None
    disabled: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return " ".join([self.source, *([self.preset] if self.preset else []), *(f"-{d}" for d in self.disabled)])


@pytest.fixture(scope="session")
def kv_connector(request) -> GateConnector:
    pytest.importorskip("vllm", reason="the gates run in vLLM's scheduler: install the vllm extra")
    option = request.config.getoption  # checked by pytest_configure
    return GateConnector(option("--kv-connector"), option("--kv-preset"), _disabled(request.config))
