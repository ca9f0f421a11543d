"""The gates' pytest plugin: ``--kv-connector`` names the connector under test; ``--kv-preset``
(a vLLM release the reference imitates) and ``--kv-disable`` (fix flags switched off) plant a
catalogued bug in the reference, to watch its gate fail.

Before the first gate the connector is built once, as vLLM builds it (both roles, KV caches
registered), and stopped (``StartProbe``). A connector that cannot start is one verdict: the
first gate errors with "could not start: ..." and every other gate skips, pointing at it,
instead of failing the same way forty times."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S


def pytest_addoption(parser) -> None:
    group = parser.getgroup("kvoffload gates")
    group.addoption("--kv-connector", default="reference",
                    help="connector under test: stock (vLLM's OffloadingConnector), reference, simple-cpu[-lazy] "
                         "(vLLM's SimpleCPUOffloadConnector), or MODULE:CLASS")
    group.addoption("--kv-preset", default=None, help="with --kv-connector reference: a vLLM release's preset")
    group.addoption("--kv-step-timeout", default=None, type=float, metavar="SECONDS",
                    help="a step (a connector call in it) running longer fails its gate, naming the call "
                         "(default: the engine's bound, engine/bounded.py)")
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


@dataclass
class StartProbe:
    """The outcome of building the connector once: None when it started, else its verdict and
    the gate that reported it."""

    failure: str | None = None
    frames: tuple[str, ...] = ()
    reported_by: str | None = None


@dataclass(frozen=True)
class GateConnector:
    source: str
    preset: str | None
    disabled: tuple[str, ...] = ()
    probe: StartProbe = field(default_factory=StartProbe, compare=False)
    step_bound_s: float = DEFAULT_STEP_BOUND_S

    @property
    def label(self) -> str:
        return " ".join([self.source, *([self.preset] if self.preset else []), *(f"-{d}" for d in self.disabled)])


@pytest.fixture(scope="session")
def kv_connector_built(request) -> GateConnector:
    pytest.importorskip("vllm", reason="the gates run in vLLM's scheduler: install the vllm extra")
    option = request.config.getoption  # checked by pytest_configure
    connector = GateConnector(option("--kv-connector"), option("--kv-preset"), _disabled(request.config),
                              step_bound_s=option("--kv-step-timeout") or DEFAULT_STEP_BOUND_S)
    _probe_start(connector)
    return connector


@pytest.fixture
def kv_connector(request, kv_connector_built) -> GateConnector:
    """The connector under test; one that could not start fails the first gate, skips the rest."""
    probe = kv_connector_built.probe
    if probe.failure is not None:
        if probe.reported_by is None:
            probe.reported_by = request.node.nodeid
            pytest.fail("\n".join([probe.failure, *(f"  {frame}" for frame in probe.frames)]), pytrace=False)
        pytest.skip(f"the connector could not start (one verdict, reported by {probe.reported_by})")
    return kv_connector_built


def _probe_start(connector: GateConnector) -> None:
    """Build the connector as a gate would (a one-request replay's vLLM config, scheduler and
    worker) and stop it; any exception is the connector's start-up verdict."""
    from kvoffload.engine.crashes import START_PREFIX, connector_frames, one_line
    from kvoffload.gates.story import TINY, tokens
    from kvoffload.engine.requests import RequestSpec
    from kvoffload.vllm.build import ConnectorLoad
    from kvoffload.vllm.replay import VllmSchedulerReplay

    try:
        VllmSchedulerReplay([RequestSpec("probe", tokens(1, 8), tokens(2, 1))], TINY,
                            ConnectorLoad(connector.source, connector.preset, connector.disabled),
                            step_bound_s=connector.step_bound_s).close()
    except Exception as error:  # noqa: BLE001 - whatever stops it from starting is the verdict
        frames = connector_frames(error)
        connector.probe.failure = START_PREFIX + one_line(error, frames)
        connector.probe.frames = tuple(frames[-4:])
