"""The output oracle on vLLM's real engine, in one process: the boundary-turns workload with
offload off, then the reference connector, then the reference with final_token_watermark off
(both checked against the off run's outputs, one engine start each).

Run as a script (the tests start it in a subprocess: vLLM's CPU worker patches torch for the
whole process). Prints one line, ``ORACLE {json}``, among vLLM's own output.
"""

import json
import sys
import time
from pathlib import Path

WORKLOAD = Path(__file__).with_name("workloads") / "boundary-turns.toml"

if __name__ == "__main__":
    from kvoffload.choice import ConnectorChoice
    from kvoffload.runner import replay_workload
    from kvoffload.workloads import load_workload

    workload = load_workload(str(WORKLOAD))
    baselines: dict = {}
    report = {}
    for label, choice in (("off", ConnectorChoice.build(source="off")), ("reference", ConnectorChoice.build()),
                          ("broken", ConnectorChoice.build(disabled=("final_token_watermark",)))):
        started = time.perf_counter()
        outcome = replay_workload(workload, choice, engine="vllm", engine_options={"baselines": baselines})
        report[label] = {"error": outcome.result["error"], "oracle": outcome.result.get("oracle"),
                         "metrics": outcome.result["metrics"], "settings": outcome.result.get("engine_settings"),
                         "seconds": time.perf_counter() - started}
    sys.stdout.write("ORACLE ")
    json.dump(report, sys.stdout)
    print()
