"""The gates' pytest plugin: ``--kv-connector`` names the connector under test, ``--kv-preset``
a vLLM release the reference imitates (reference only)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("kvoffload gates")
    group.addoption("--kv-connector", default="reference",
                    help="connector under test: stock (vLLM's OffloadingConnector), reference, or MODULE:CLASS")
    group.addoption("--kv-preset", default=None, help="with --kv-connector reference: a vLLM release's preset")


@dataclass(frozen=True)
class GateConnector:
    source: str
    preset: str | None

    @property
    def label(self) -> str:
        return f"{self.source} {self.preset}" if self.preset else self.source


@pytest.fixture(scope="session")
def kv_connector(request) -> GateConnector:
    pytest.importorskip("vllm", reason="the gates run in vLLM's scheduler: install the vllm extra")
    from kvoffload.vllm.build import ConnectorLoad

    source, preset = request.config.getoption("--kv-connector"), request.config.getoption("--kv-preset")
    ConnectorLoad(source, preset)  # a bad name or combination is a ConfigError before any gate runs
    return GateConnector(source, preset)
