"""What the report reads: run result files and asv result files, nothing else.

- Run results: every ``*.json`` under the source folder whose ``schema`` is the run schema
  (``kvoffload run`` / ``kvoffload bench`` output). Other JSON (bench summaries, asv files) is
  passed over; a file that claims the run schema but is malformed is listed as ignored.
- asv results: ``<source>/asv/<machine>/<commit>-<env>.json`` (``machine.json`` excluded) and
  ``<source>/asv/benchmarks.json`` for units, versions and parameter names. These are asv's by
  their place: one that cannot be read stops the report (ResultError, exit 2), before any output. A row of ``results`` holds one value per parameter
  combination, flattened in Cartesian order of the row's ``params``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvoffload import long_numbers
from kvoffload.results import SCHEMA, ResultError, differences, read_result

_LAST_DATE_MS = 253402300800000  # 10000-01-01: the end of what a datetime holds


@dataclass(frozen=True)
class RunFile:
    """One run result, with the fields the figures group by."""

    path: Path
    workload: str
    label: str  # connector label: "reference", "vllm-0.26", "reference -last_block_at_finish"
    preset: str | None
    disabled: tuple[str, ...]
    config: dict[str, Any]
    metrics: dict[str, Any]
    commit: str | None
    crashed: bool
    distributions: dict[str, dict[int, int]] = field(default_factory=dict)  # {metric: {steps: chunks}}

    @property
    def config_key(self) -> str:
        return json.dumps(self.config, sort_keys=True)

    def config_key_without(self, *names: str) -> str:
        return json.dumps({k: v for k, v in self.config.items() if k not in names}, sort_keys=True)


@dataclass(frozen=True)
class AsvPoint:
    """One tracked value of one asv benchmark, parameter combination and commit."""

    machine: str
    env: str
    benchmark: str  # module.Class.method
    params: tuple[str, ...]  # repr of each parameter value, in param order
    commit: str
    date: int  # commit date, ms since the epoch (asv's ordering)
    value: float
    result_file: str = ""  # the asv result file the value was read from (provenance)
    version: str | None = None  # the benchmark's version when it was recorded
    spread: tuple[float, float] | None = None  # asv's quartiles of repeated samples (q_25, q_75), if any
    samples: int = 1  # how many samples asv kept statistics of (stats_repeat)
    # the hardware the result file says it ran on (asv's params: cpu, num_cpu, ram, gpu), "" if it
    # says none: one machine name is one machine, so a line never joins two of these
    hardware: str = ""


@dataclass(frozen=True)
class MainCommit:
    """One commit of main's first-parent line that carries the suite (``asv/first-parent.tsv``)."""

    commit: str  # full id
    date: str  # commit date, ISO 8601
    subject: str


def find_runs(source: Path) -> tuple[list[RunFile], list[str]]:
    """Run results under ``source`` (sorted by path), and 'path: reason' for ignored ones."""
    runs, ignored = [], []
    for path in sorted(source.rglob("*.json")):
        if not path.is_file() or not _claims_run_schema(path):
            continue
        try:
            data = read_result(path)
        except ResultError as error:
            ignored.append(str(error))
            continue
        connector = data["connector"]
        runs.append(RunFile(
            path=path,
            workload=str(data["workload"].get("name", path.stem)),
            label=str(connector.get("label") or connector.get("name") or "?"),
            preset=connector.get("preset"),
            disabled=tuple(connector.get("disabled") or ()),
            config=data["config"],
            metrics=data["metrics"],
            commit=(data.get("provenance") or {}).get("commit"),
            crashed=data.get("error") is not None,
            distributions=_distributions(data.get("distributions")),
        ))
    return runs, ignored


# What may differ between the runs of one workload's charts: the connector (``config.connector``:
# what the charts compare, with the label) and the CPU tier's size (the capacity chart's x axis;
# the ablation and delay charts take the runs of one size and print it in their footer). Any other
# key of ``config`` is the engine or the configuration (a --set override, another seed or profile).
MAY_DIFFER = ("connector", "cpu_chunks")


def check_one_axis(runs: list[RunFile]) -> None:
    """Every chart of a workload puts its runs on one axis, so they must come from one commit, one
    engine and one configuration: a bar from an ad-hoc run beside a bench run of another commit (or
    of the same commit with uncommitted changes, ``-dirty``), of another engine (simulator,
    vllm-scheduler, vllm) or with a --set override would compare two programs or two setups without
    saying so. Raises ResultError naming two such files and what differs; the report draws nothing
    then. Only the connector and ``cpu_chunks`` may differ (``MAY_DIFFER``)."""
    first_of: dict[str, RunFile] = {}
    for run in runs:
        first = first_of.setdefault(run.workload, run)
        if (first.commit or "unknown") != (run.commit or "unknown"):
            raise ResultError(f"{first.path} (commit {first.commit or 'unknown'}) and {run.path} (commit "
                              f"{run.commit or 'unknown'}) are runs of {run.workload} from different commits: a "
                              f"chart cannot put them on one axis; give --from a folder with one commit's runs")
        engines = [str(r.config.get("engine", "simulator")) for r in (first, run)]
        if engines[0] != engines[1]:
            raise ResultError(f"{first.path} (engine {engines[0]}) and {run.path} (engine {engines[1]}) are runs "
                              f"of {run.workload} on different engines: a chart cannot put them on one axis; give "
                              f"--from a folder with one engine's runs")
        differ = differences(first.config, run.config, ignore=(*MAY_DIFFER, "engine"))
        if differ:
            shown = ", ".join(differ[:3])
            raise ResultError(f"{first.path} and {run.path} are runs of {run.workload} with different "
                              f"configurations ({shown}): a chart cannot put them on one axis; give --from a "
                              f"folder with one configuration's runs (only the connector and cpu_chunks may "
                              f"differ)")


def _distributions(raw: Any) -> dict[str, dict[int, int]]:
    """A result's ``distributions`` ({metric: {"steps": chunks}}); what is malformed is left out."""
    found: dict[str, dict[int, int]] = {}
    if isinstance(raw, dict):
        for metric, counts in raw.items():
            if isinstance(counts, dict):
                try:
                    found[str(metric)] = {int(k): int(v) for k, v in counts.items()}
                except (TypeError, ValueError):
                    continue
    return found


def _claims_run_schema(path: Path) -> bool:
    """True for JSON objects whose ``schema`` is the run schema (other JSON is not ours)."""
    try:
        data = json.loads(path.read_bytes())
    except ValueError as error:  # a number too long to read: read_result names it and the file is listed
        return long_numbers.is_too_long(error) and not isinstance(error, json.JSONDecodeError)
    except (OSError, RecursionError):  # RecursionError: JSON nested too deeply
        return False
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def find_asv_points(asv_dir: Path) -> tuple[list[AsvPoint], dict[str, str]]:
    """Every numeric value in asv result files under ``asv_dir``, and {benchmark: unit}.

    As asv's own views do, a value recorded under another ``version`` of its benchmark than the
    suite's current one (benchmarks.json) is left out: the number meant something else then.
    The files are asv's by their place, so one that cannot be read (not a regular file, not UTF-8,
    not JSON, not asv's layout) raises ResultError naming it, before anything is drawn.
    """
    if not os.path.lexists(asv_dir):
        return [], {}
    if not asv_dir.is_dir():
        raise ResultError(f"{asv_dir}: not a directory (expected asv results: <machine>/<commit>-<env>.json)")
    suite = read_asv_suite(asv_dir)
    units = {name: str(entry.get("unit", "")) for name, entry in suite.items() if isinstance(entry, dict)}
    current = asv_versions(suite)
    points: list[AsvPoint] = []
    for machine_dir in sorted(p for p in asv_dir.iterdir() if p.is_dir()):
        for path in sorted(machine_dir.glob("*.json")):
            if path.name == "machine.json":
                continue
            points.extend(p for p in _asv_file_points(path, machine_dir.name)
                          if p.version is None or current.get(p.benchmark) in (None, p.version))
    return points, units


def read_json(path: Path, what: str) -> Any:
    """The JSON document in ``path``; ResultError naming ``path`` and ``what`` was expected otherwise.

    Opened without blocking and checked on the open descriptor: a FIFO would block a plain read
    forever, and a check before the open could race with a rename.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise ResultError(f"{path}: cannot read ({error.strerror}); expected {what}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "not a regular file")
            raise ResultError(f"{path}: {kind}; expected {what}")
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read()
    except OSError as error:
        raise ResultError(f"{path}: cannot read ({error.strerror}); expected {what}") from None
    finally:
        os.close(fd)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ResultError(f"{path}: expected UTF-8 JSON text ({what}), got undecodable bytes at byte "
                          f"{error.start}") from None
    except json.JSONDecodeError as error:
        raise ResultError(f"{path}: not JSON (line {error.lineno}: {error.msg}); expected {what}") from None
    except RecursionError:
        raise ResultError(f"{path}: JSON nested too deeply; expected {what}") from None
    except ValueError as error:  # not a JSONDecodeError: a number too long to convert
        if not long_numbers.is_too_long(error):
            raise
        raise ResultError(f"{path}: expected {long_numbers.EXPECTED} ({what}), got "
                          f"{long_numbers.describe(raw)}") from None


def read_asv_suite(asv_dir: Path) -> dict[str, Any]:
    """``asv_dir``/benchmarks.json, the suite's benchmarks as asv last saw them ({} when absent)."""
    path = asv_dir / "benchmarks.json"
    if not os.path.lexists(path):
        return {}
    data = read_json(path, "asv's benchmarks.json")
    if not isinstance(data, dict):
        raise ResultError(f"{path}: expected a JSON object of benchmarks, got {type(data).__name__}")
    return data


def asv_versions(suite: dict[str, Any]) -> dict[str, str]:
    """{benchmark: its current version} from benchmarks.json (``read_asv_suite``)."""
    return {name: str(entry["version"]) for name, entry in suite.items()
            if isinstance(entry, dict) and entry.get("version") is not None}


def asv_param_names(suite: dict[str, Any]) -> dict[str, list[str]]:
    """{benchmark: its parameter names} from benchmarks.json (``read_asv_suite``)."""
    return {name: [str(n) for n in entry.get("param_names") or []]
            for name, entry in suite.items() if isinstance(entry, dict)}


def _asv_file_points(path: Path, machine: str) -> list[AsvPoint]:
    data = read_json(path, "an asv result file")
    try:
        columns = data["result_columns"]
        results = data["results"]
        commit, env = str(data["commit_hash"]), str(data.get("env_name", ""))
        hardware = _hardware(data.get("params"))
        date = _asv_date(data.get("date"))
        result_col, params_col = columns.index("result"), columns.index("params")
        version_col = columns.index("version") if "version" in columns else None
        q25_col, q75_col, repeat_col = (columns.index(c) if c in columns else None
                                        for c in ("stats_q_25", "stats_q_75", "stats_repeat"))
        rows = list(results.items())
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ResultError(f"{path}: not an asv result file ({type(error).__name__}: {error})") from None
    points = []
    for benchmark, row in rows:
        if not isinstance(row, list) or len(row) <= max(result_col, params_col):
            continue
        values, params = row[result_col], row[params_col] or []
        if not isinstance(params, list) or not all(isinstance(values_of, list) for values_of in params):
            continue  # a row of another layout, like a row that is not a list
        version = row[version_col] if version_col is not None and len(row) > version_col else None
        if not isinstance(values, list):
            values = [values]
        q25s, q75s, repeats = (_column(row, col, len(values)) for col in (q25_col, q75_col, repeat_col))
        combos = list(itertools.product(*params)) if params else [()]
        for combo, value, q25, q75, repeat in zip(combos, values, q25s, q75s, repeats):
            if _finite(value):
                spread = (float(q25), float(q75)) if _finite(q25) and _finite(q75) else None
                points.append(AsvPoint(machine=machine, env=env, benchmark=benchmark,
                                       params=tuple(_unquote(str(p)) for p in combo), commit=commit,
                                       date=date, value=float(value), result_file=str(path),
                                       version=None if version is None else str(version), spread=spread,
                                       samples=int(repeat) if _finite(repeat) and repeat >= 1 else 1,
                                       hardware=hardware))
    return points


def _hardware(params: Any) -> str:
    """"CPU, N cores, RAM[, GPU]" from a result file's asv params; "" where it names no CPU."""
    if not isinstance(params, dict) or not params.get("cpu"):
        return ""
    fields = [str(params["cpu"]), f"{params.get('num_cpu', '?')} cores", str(params.get("ram", "?"))]
    return ", ".join(fields + ([str(params["gpu"])] if params.get("gpu") else []))


def _asv_date(value: Any) -> int:
    """asv's ``date``: the commit date in ms since the epoch (0 when absent); ValueError otherwise,
    reported as a file of another layout."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < _LAST_DATE_MS:
        raise ValueError(f"key date: expected ms since the epoch, got {value!r:.40}")
    return int(value)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _column(row: list, col: int | None, count: int) -> list:
    """A statistics column of an asv result row, one entry per parameter combination (None if absent)."""
    values = row[col] if col is not None and len(row) > col else None
    if not isinstance(values, list) or len(values) != count:
        return [None] * count
    return values


def read_main_line(asv_dir: Path) -> list[MainCommit]:
    """``asv_dir``/first-parent.tsv (``benchmarks/record`` writes it): main's first-parent commits
    that carry the suite, oldest first; [] when absent (the charts then order commits by date)."""
    path = asv_dir / "first-parent.tsv"
    if not os.path.lexists(path):
        return []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise ResultError(f"{path}: cannot read ({error.strerror}); expected main's first-parent commits") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ResultError(f"{path}: not a regular file; expected main's first-parent commits")
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read()
    finally:
        os.close(fd)
    commits = []
    for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        fields = line.split("\t", 2)
        if len(fields) != 3 or not all(c in "0123456789abcdef" for c in fields[0]) or len(fields[0]) < 8:
            raise ResultError(f"{path}: line {number}: expected 'commit<TAB>date<TAB>subject'")
        commits.append(MainCommit(*fields))
    return commits


def _unquote(text: str) -> str:
    """asv keys parameters by repr(): show 'multi-turn' as multi-turn."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def check_source(source: Path) -> None:
    if not source.exists():
        raise ResultError(f"{source}: no such directory (run, bench and sweep write their results under out/ "
                          f"unless told otherwise; the published ones: --from results)")
    if not source.is_dir():
        raise ResultError(f"{source}: not a directory")
