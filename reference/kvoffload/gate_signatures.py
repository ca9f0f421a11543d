"""What a failing gate tells a maintainer to do, and what ``kvoffload gate --update`` refuses to bless.

- **Signatures** (``collect_signatures``): for each gate workload and fix flag, the deterministic
  metrics in which the reference with that flag off differs from the reference, with their values
  then: the flag's ablation on the gate's own workloads, as the bench ablates it (``cli.bench.
  ablation``: a flag another fix hides is switched off after that one, so its signature holds both;
  the replays of ``kvoffload run --workload W --disable-fix F``). ``--update`` computes them from
  the code and writes them into the baseline, so they are never a hand-written table that can
  drift from what a flag does.
- **Looks like** (``looks_like``): a failing gate compares the reference's moves with each
  signature. A flag whose signature moves the same metrics the same way on every gate workload
  (nothing where it moves nothing) is named: "looks like `final_token_watermark` off", and
  "identical to" where every value is the ablation's too.
- **Replay** (``replay_command``): the ``kvoffload run`` command that replays one gate run, so a
  moved cell can be looked at (``--trace``, ``kvoffload compare``) rather than only read.
- **Poison** (``poisoned_cells``): a baseline may not bless a must-be-0 metric (the glossary's
  ``zero`` direction: poisoned loads, violations, leaks, crashes) above 0 for the reference, nor
  for a preset unless one of the fix flags that preset lacks raises that metric on that workload
  (its signature says so: the bug the preset replays), nor one that got worse than in the
  baseline it replaces. ``--update`` refuses such a baseline unless given ``--override-reason``,
  which the baseline then records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from kvoffload.core.fixes import FIX_NAMES, PRESETS, ablation
from kvoffload.metrics import GLOSSARY, MEASURED_METRICS, same_value

REFERENCE = "reference"
MUST_BE_ZERO = tuple(name for name, direction, _ in GLOSSARY if direction == "zero" and name not in MEASURED_METRICS)


def signature_key(workload: str, flag: str) -> str:
    return f"{workload}/{flag}"


def signature_of(reference: dict[str, float | None], ablated: dict[str, float | None]) -> dict[str, float | None]:
    """The metrics (of ``reference``'s) in which ``ablated`` differs from ``reference``, as ablated."""
    return {metric: ablated.get(metric) for metric in sorted(reference)
            if not same_value(reference[metric], ablated.get(metric))}


def collect_signatures(workloads: Iterable[str], deterministic: dict[str, float | None], replay) -> dict:
    """{``workload/flag``: signature} for every gate workload and fix flag. ``deterministic`` holds
    the reference's values (``workload/reference/metric``, as ``gate.collect`` keys them);
    ``replay(workload, flag)`` returns the reference's deterministic metrics with ``flag`` off."""
    found = {}
    for workload in workloads:
        prefix = f"{workload}/{REFERENCE}/"
        reference = {key[len(prefix):]: value for key, value in deterministic.items() if key.startswith(prefix)}
        for flag in FIX_NAMES:
            found[signature_key(workload, flag)] = signature_of(reference, replay(workload, flag))
    return found


def replay_command(run: str) -> str:
    """The command that replays gate run ``workload/label`` (a label is the reference or a preset)."""
    workload, label = run.split("/", 1)
    preset = [] if label == REFERENCE else ["--preset", label]
    return " ".join(["kvoffload", "run", "--workload", workload, *preset])


def _way(before: float | None, after: float | None) -> str:
    """How a number moved: up, down, appeared, disappeared (same_value decided it moved)."""
    if before is None or after is None:
        return "appeared" if before is None else "disappeared"
    return "up" if after > before else "down"


@dataclass(frozen=True)
class Match:
    flag: str
    identical: bool  # every moved value is the ablation's value too, not only its direction

    workloads: tuple[str, ...] = ()  # where the flag's signature moves something

    def sentence(self, workloads: Iterable[str] = ()) -> str:
        how = "identical to" if self.identical else "looks like"
        disabled = " ".join(f"--disable-fix {flag}" for flag in ablation(self.flag))
        commands = "; ".join(f"{replay_command(f'{w}/{REFERENCE}')} {disabled}"
                             for w in self.workloads or tuple(workloads))
        return (f"{how} `{self.flag}` off: the reference's moves are that flag's ablation signature on every gate "
                f"workload (the baseline's signatures); replay the flag off: {commands}")


def looks_like(baseline: dict, now: dict[str, float | None], workloads: Iterable[str]) -> list[Match]:
    """The fix flags whose signature (in ``baseline``) the reference's moves from ``baseline`` to
    ``now`` match on every workload; [] when the baseline has no signatures or nothing matches."""
    signatures, before = baseline.get("signatures") or {}, baseline["deterministic"]
    workloads = list(workloads)
    moves: dict[str, dict[str, tuple]] = {}
    for workload in workloads:
        prefix = f"{workload}/{REFERENCE}/"
        moves[workload] = {key[len(prefix):]: (before[key], now[key]) for key in before
                           if key.startswith(prefix) and key in now and not same_value(before[key], now[key])}
    if not any(moves.values()):
        return []
    matches = []
    for flag in FIX_NAMES:
        if not all(signature_key(w, flag) in signatures for w in workloads):
            continue
        same_way, identical = True, True
        for workload in workloads:
            signature, moved = signatures[signature_key(workload, flag)], moves[workload]
            reference = {m: before.get(f"{workload}/{REFERENCE}/{m}") for m in signature}
            if set(signature) != set(moved) or any(_way(reference[m], signature[m]) != _way(*moved[m])
                                                   for m in moved):
                same_way = False
                break
            identical = identical and all(same_value(signature[m], moved[m][1]) for m in moved)
        if same_way:
            matches.append(Match(flag, identical, tuple(w for w in workloads if signatures[signature_key(w, flag)])))
    return matches


def _raises(signature: dict[str, float | None], metric: str) -> bool:
    value = signature.get(metric)
    return isinstance(value, (int, float)) and value > 0


@dataclass(frozen=True)
class Poison:
    key: str  # workload/connector/metric
    value: float
    why: str

    def line(self) -> str:
        return f"{self.key} = {self.value:g}: {self.why}"


def poisoned_cells(deterministic: dict[str, float | None], signatures: dict, previous: dict | None) -> list[Poison]:
    """The must-be-0 numbers a baseline may not bless (module docstring): above 0 for the reference,
    above 0 for a preset where none of its missing flags raises that metric on that workload (by
    ``signatures`` or by ``previous``'s), or higher than in ``previous`` (the baseline being
    replaced; None when there is none)."""
    cells = []
    earlier = (previous or {}).get("deterministic") or {}
    for key, value in sorted(deterministic.items()):
        workload, label, metric = key.rsplit("/", 2)
        if metric not in MUST_BE_ZERO or value is None:
            continue
        before = earlier.get(key)
        if isinstance(before, (int, float)) and value > before:
            cells.append(Poison(key, value, f"got worse (was {before:g} in the baseline it would replace)"))
        elif value > 0 and label == REFERENCE:
            cells.append(Poison(key, value, "must be 0 for the reference"))
        elif value > 0 and label in PRESETS:
            missing = PRESETS[label].missing
            # the new signatures, or the replaced baseline's: a bug in the code under test may have
            # made a flag a no-op, and with it its new signature empty
            known = (signatures, (previous or {}).get("signatures") or {})
            if not any(_raises(found.get(signature_key(workload, flag)) or {}, metric)
                       for flag in missing for found in known):
                cells.append(Poison(key, value, f"must be 0: no fix flag {label} lacks ({', '.join(missing) or 'none'}) "
                                                f"raises it on {workload}"))
    return cells
