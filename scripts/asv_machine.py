"""Describe this machine for asv: ``benchmarks/record`` stores it as ``results/asv/<machine>/machine.json``.

    python scripts/asv_machine.py NAME ENV_PYTHON [MACHINE_FILE]
    python scripts/asv_machine.py --check MACHINE_JSON

asv copies the entry NAME of its machine file (``~/.asv-machine.json``, asv's own place for it)
into ``machine.json`` beside every result it saves. This writes that entry: asv's fields (os,
arch, cpu, num_cpu, ram) and what else moves a measured number: the Python and torch of the
environment the benchmarks run in (ENV_PYTHON, asv's virtualenv), and on a GPU runner the GPU,
its driver and torch's CUDA. Values are strings, as asv's are; an absent GPU is left out.

One machine name is one machine: its hardware (CPU model, core count, memory, GPU) is its
identity. ``--check`` compares this machine's hardware with a committed ``machine.json`` and
refuses (one line naming both, exit 2) when they differ, or when that file describes no hardware
(results recorded before machine.json described it); ``benchmarks/record`` and the GPU runner's
results run it before they write into a machine's folder, because asv would otherwise overwrite
the file with this machine's entry and join two machines' numbers on one line.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

# What the environment's interpreter reports about itself (run there, not here: the project's
# .venv may differ from asv's environment).
_ENV_PROBE = ("import json, platform, torch; print(json.dumps({'python': platform.python_version(), "
              "'torch': torch.__version__, 'cuda': torch.version.cuda}))")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, the platform's string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def os_name() -> str:
    try:
        fields = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
        release = fields.get("PRETTY_NAME", "").strip('"')
    except OSError:
        release = ""
    kernel = f"{platform.system()} {platform.release()}"
    return f"{release} ({kernel})" if release else kernel


def gpus() -> dict[str, str]:
    """GPU names and driver from nvidia-smi; {} where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]
    if not rows:
        return {}
    return {"gpu": "; ".join(sorted({row[0] for row in rows})) + f" (x{len(rows)})",
            "gpu_driver": "; ".join(sorted({row[-1] for row in rows}))}


HARDWARE = ("cpu", "num_cpu", "ram", "gpu")
RAM_TOLERANCE = 0.03  # the kernel's share of the same memory moves a little between boots


def hardware(info: dict) -> dict[str, str]:
    return {field: str(info[field]) for field in HARDWARE if info.get(field)}


def shown(info: dict) -> str:
    found = hardware(info)
    if "cpu" not in found:
        return "no hardware (not recorded)"
    parts = [found["cpu"], f"{found.get('num_cpu', '?')} cores", found.get("ram", "? GiB")]
    return ", ".join(parts + ([found["gpu"]] if "gpu" in found else []))


def same_hardware(a: dict, b: dict) -> bool:
    """The same CPU model, core count and GPU, and memory within RAM_TOLERANCE."""
    one, other = hardware(a), hardware(b)
    if "cpu" not in one or "cpu" not in other:
        return False
    if any(one.get(field) != other.get(field) for field in ("cpu", "num_cpu", "gpu")):
        return False
    try:
        ram = [float(info.get("ram", "").split()[0]) for info in (one, other)]
    except (ValueError, IndexError):
        return one.get("ram") == other.get("ram")
    return abs(ram[0] - ram[1]) <= RAM_TOLERANCE * max(ram)


def this_hardware() -> dict[str, str]:
    memory = memory_bytes()
    info = {"cpu": cpu_model(), "num_cpu": str(os.cpu_count()),
            "ram": "" if memory is None else f"{memory / 2**30:.1f} GiB"}
    found = gpus()
    if found:
        info["gpu"] = found["gpu"]
    return info


def check(machine_json: Path) -> int:
    """0 when ``machine_json`` is absent or describes this hardware; else one line and 2."""
    if not machine_json.is_file():
        return 0
    try:
        recorded = json.loads(machine_json.read_text())
    except (OSError, ValueError) as error:
        print(f"{machine_json}: not a machine description ({error})", file=sys.stderr)
        return 2
    here = this_hardware()
    if not isinstance(recorded, dict) or not same_hardware(recorded, here):
        name = recorded.get("machine", machine_json.parent.name) if isinstance(recorded, dict) else "?"
        print(f"{machine_json} describes {shown(recorded if isinstance(recorded, dict) else {})}; this machine is "
              f"{shown(here)}: one machine name is one machine, so record under another name than {name!r}",
              file=sys.stderr)
        return 2
    return 0


def describe(name: str, env_python: str) -> dict[str, str]:
    env = json.loads(subprocess.run([env_python, "-c", _ENV_PROBE], capture_output=True, text=True,
                                    timeout=300, check=True).stdout)
    memory = memory_bytes()
    info = {
        "machine": name,
        "os": os_name(),
        "arch": platform.machine(),
        "cpu": cpu_model(),
        "num_cpu": str(os.cpu_count()),
        "ram": "" if memory is None else f"{memory / 2**30:.1f} GiB",
        "python": env["python"],
        "torch": env["torch"],
    }
    found = gpus()
    if found:
        info.update(found, cuda=str(env["cuda"]))
    return info


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"] and len(argv) == 2:
        return check(Path(argv[1]))
    if len(argv) not in (2, 3) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", argv[0]):
        print(__doc__.strip().splitlines()[2].strip() + "  (NAME: letters, digits, '.', '_', '-')", file=sys.stderr)
        return 2
    name, env_python = argv[:2]
    path = Path(argv[2]) if len(argv) == 3 else Path.home() / ".asv-machine.json"
    collection = json.loads(path.read_text()) if path.is_file() else {"version": 1}
    collection[name] = describe(name, env_python)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(collection, indent=4) + "\n")
    os.replace(tmp, path)
    print(" ".join(f"{key}={value!r}" for key, value in collection[name].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
