"""Which connector a run drives: the one description that every engine, the runner, the gate
and the CLI share (an engine reads it; it knows no engine)."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.core.fixes import Fixes
from kvoffload.core.types import ConfigError

STOCK = "stock"  # vLLM's own OffloadingConnector
REFERENCE = "reference"  # kvoffload.vllm.connector


def check_source(source: str, preset: str | None = None, disabled: tuple[str, ...] = ()) -> None:
    """A ConfigError unless ``source`` names a connector vLLM can load (stock, reference or
    MODULE:CLASS) and the preset and disabled fixes apply to it. Needs no vLLM: the gates' plugin
    checks its options with it before pytest collects a gate (which imports vLLM)."""
    if source not in (STOCK, REFERENCE):
        module, sep, name = source.partition(":")
        if not sep or not module or not name.isidentifier():
            raise ConfigError(f"--connector expects stock, reference or MODULE:CLASS, got {source!r}")
    if source == STOCK and (preset or disabled):
        raise ConfigError("presets and disabled fixes apply to the reference connector, not to stock")


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

    @classmethod
    def build(cls, preset: str | None = None, disabled: tuple[str, ...] = (),
              source: str = "reference") -> "ConnectorChoice":
        fixes = Fixes.preset(preset) if preset else Fixes()
        fixes = fixes.without(*disabled)
        label = preset or ("reference" if source == "reference" else f"vllm-{source}" if source == "stock" else source)
        if disabled:
            label += "".join(f" -{name}" for name in disabled)
        return cls(label=label, fixes=fixes, preset=preset, source=source, disabled=tuple(disabled))

    def describe(self) -> dict:
        return {"name": self.source, "label": self.label, "preset": self.preset,
                "fixes": self.fixes.as_dict(), "disabled": list(self.fixes.disabled())}
