"""Which connector a run drives: the one description that every engine, the runner, the gate
and the CLI share (an engine reads it; it knows no engine)."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.core.fixes import Fixes
from kvoffload.core.types import ConfigError

STOCK = "stock"  # vLLM's own OffloadingConnector
REFERENCE = "reference"  # kvoffload.vllm.connector
# Connectors the suite was not built from, by name (kvoffload.vllm.foreign defines each; a test
# keeps the two lists equal). Their MODULE:CLASS path names them too.
FOREIGN: dict[str, str] = {
    "simple-cpu": "vLLM's SimpleCPUOffloadConnector, eager offload (CPU stand-ins for its GPU calls)",
    "simple-cpu-lazy": "vLLM's SimpleCPUOffloadConnector, lazy offload (lazy_offload)",
    "example": "vLLM's ExampleConnector: each prompt's KV to disk, under the run's output folder",
    "peer": "a remote-prefill peer (kvoffload.vllm.peer) for composed connectors: serves requests remote-*",
}
WITH_STORAGE = ("example",)  # foreign connectors that keep files: a run gives them a folder of their own
COMPOSED = "A+B"  # vLLM's MultiConnector of A and B, each any source above (e.g. stock+example)
SOURCES_HELP = f"stock, reference, {', '.join(FOREIGN)}, MODULE:CLASS, or A+B (MultiConnector)"


def needs_storage(source: str) -> bool:
    return any(part in WITH_STORAGE for part in source.split("+"))


def check_source(source: str, preset: str | None = None, disabled: tuple[str, ...] = ()) -> None:
    """A ConfigError unless ``source`` names a connector vLLM can load (stock, reference, a
    foreign connector's name or MODULE:CLASS) and the preset and disabled fixes apply to it. Needs no vLLM: the gates' plugin
    checks its options with it before pytest collects a gate (which imports vLLM)."""
    for part in source.split("+"):
        if part not in (STOCK, REFERENCE, *FOREIGN):
            module, sep, name = part.partition(":")
            if not sep or not module or not name.isidentifier():
                raise ConfigError(f"--connector expects {SOURCES_HELP}, got {source!r}")
    reference_part = any(part == REFERENCE or ":" in part for part in source.split("+"))
    if not reference_part and (preset or disabled):
        raise ConfigError(f"presets and disabled fixes apply to the reference connector, not to {source}")


def check_module_found(source: str) -> None:
    """A ConfigError unless the module of a ``MODULE:CLASS`` source can be found, looked up on
    ``sys.path`` without importing it or its packages: the command line says "no module" at once,
    not after vLLM's import (seconds to tens of seconds). Whether the class is there, and whether
    the module imports, only vLLM's loader can tell."""
    import importlib.machinery
    import importlib.util
    import sys

    module, sep, _ = source.partition(":")
    if source in (STOCK, REFERENCE) or not sep:
        return
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        raise ConfigError(f"--connector {source}: {module!r} is not a module name (dotted identifiers)")
    search: list[str] | None = None
    for depth in range(len(parts)):
        name = ".".join(parts[:depth + 1])
        loaded = sys.modules.get(name)
        if loaded is not None:
            spec = getattr(loaded, "__spec__", None)
        elif depth == 0:  # a top-level name: every finder asked, nothing imported
            spec = importlib.util.find_spec(name)
        else:  # a submodule: its package's folders searched, the package not imported
            spec = importlib.machinery.PathFinder.find_spec(name, search)
        if spec is None:
            raise ConfigError(f"--connector {source}: no module {name!r} on the Python path")
        if (depth + 1 < len(parts) and spec.submodule_search_locations is None
                and ".".join(parts[:depth + 2]) not in sys.modules):  # os.path: a module os put there
            raise ConfigError(f"--connector {source}: {name!r} is a module, not a package holding {parts[depth + 1]!r}")
        search = list(spec.submodule_search_locations or [])


@dataclass(frozen=True)
class ConnectorChoice:
    """Which connector a run drives: the reference with all fixes, a vLLM preset, or fixes off;
    on the vllm-scheduler engine also ``source`` "stock" (vLLM's own) or "MODULE:CLASS"."""

    label: str
    fixes: Fixes
    preset: str | None = None
    source: str = "reference"
    disabled: tuple[str, ...] = ()
    storage_dir: str | None = None  # where a disk connector keeps its files (None: a temporary folder)

    @classmethod
    def build(cls, preset: str | None = None, disabled: tuple[str, ...] = (),
              source: str = "reference") -> "ConnectorChoice":
        fixes = Fixes.preset(preset) if preset else Fixes()
        fixes = fixes.without(*disabled)
        known = all(part in (STOCK, *FOREIGN) for part in source.split("+"))
        label = preset or ("reference" if source == REFERENCE else f"vllm-{source}" if known else source)
        if disabled:
            label += "".join(f" -{name}" for name in disabled)
        return cls(label=label, fixes=fixes, preset=preset, source=source, disabled=tuple(disabled))

    def describe(self) -> dict:
        described = {"name": self.source, "label": self.label, "preset": self.preset,
                     "fixes": self.fixes.as_dict(), "disabled": list(self.fixes.disabled())}
        if self.storage_dir is not None:
            described["storage_dir"] = self.storage_dir
        return described

    def load(self) -> tuple:
        """What a vLLM engine builds the connector from (``kvoffload.vllm.build.ConnectorLoad``)."""
        return (self.source, self.preset, self.disabled, self.storage_dir)
