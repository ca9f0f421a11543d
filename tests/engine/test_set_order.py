"""The finish order: vLLM hands its connector a step's finished requests as a ``set[str]``, so
the connector walks them in the order CPython iterates that set, which follows the process's
string hash seed. The simulator reproduces the order for the pinned seed (docs/fidelity.md,
"finish order"); these stories check the model against real sets in child interpreters started
with that seed, and the simulator's schedules against them."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.engine.engine import Engine
from kvoffload.engine.set_order import HASH_SEED, set_iteration_order, str_hash
from kvoffload.workloads import load_workload

# A child interpreter: for each list of ids, the order a set built by adding them in that order
# iterates, and each id's hash.
CHILD = ("import json, sys\n"
         "lists = json.load(sys.stdin)\n"
         "orders = []\n"
         "for ids in lists:\n"
         "    s = set()\n"
         "    for i in ids: s.add(i)\n"
         "    orders.append(list(s))\n"
         "print(json.dumps({'orders': orders, 'hashes': [[hash(i) for i in ids] for ids in lists]}))\n")


def in_child(seed: int, lists: list[list[str]]) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(lists), capture_output=True, text=True,
                          env=dict(os.environ, PYTHONHASHSEED=str(seed)), timeout=60, check=True)
    return json.loads(done.stdout)


def id_lists(rng: random.Random, count: int) -> list[list[str]]:
    """Request-id-like strings (ASCII, Latin-1, BMP and astral: 1, 2 and 4 bytes per code point),
    from 0 to 300 per set, so the table grows several times and collides."""
    prefixes = ["req-", "c3-t", "A", "é", "中", "😀", ""]
    return [[rng.choice(prefixes) + str(rng.randrange(10 ** rng.randint(1, 9)))
             for _ in range(rng.randint(0, 300) if n % 8 == 0 else rng.randint(0, 12))] for n in range(count)]


@pytest.mark.skipif(sys.hash_info.algorithm != "siphash13", reason="the model is CPython 3.11+'s SipHash-1-3")
@pytest.mark.parametrize("seed", [HASH_SEED, 1, 4242, 2**32 - 1])
def test_the_model_iterates_as_a_real_set_started_with_that_seed(seed):
    # "" hashes to 0 under every seed; U+00FF and U+0100, U+FFFF and U+10000 are the widest and
    # narrowest code points of 1, 2 and 4 bytes (CPython hashes the string's storage, that wide)
    lists = [["", "A", "req-0", "\u00ff", "\u0100", "\uffff", "\U00010000"]] + id_lists(random.Random(seed), 400)
    real = in_child(seed, lists)
    assert [[str_hash(i, seed) for i in ids] for ids in lists] == real["hashes"]
    assert [list(set_iteration_order(ids, seed)) for ids in lists] == real["orders"]


@pytest.mark.skipif(sys.hash_info.algorithm != "siphash13", reason="the model is CPython 3.11+'s SipHash-1-3")
def test_past_50000_entries_the_model_grows_the_table_as_cpython_does():
    """CPython's set_add_entry resizes a table for 4x its fill up to 50,000 entries and for 2x past
    that: tables of 8, 32, 128 ... slots, until the resize at 78,643 entries (131,072 slots) makes
    262,144, not 524,288. 80,000 ids iterate in the real set's order only if the model does too."""
    ids = [f"req-{i}" for i in range(80_000)]
    assert list(set_iteration_order(ids)) == in_child(HASH_SEED, [ids])["orders"][0]


def test_the_order_is_neither_arrival_nor_sorted():
    """The model matters: for these ids the pinned seed's order is neither the order they were
    added in nor sorted (a set of eight, grown once from 8 to 32 slots)."""
    ids = [f"c{i}-t05" for i in range(8)]
    order = set_iteration_order(ids)
    assert order != tuple(ids) and order != tuple(sorted(ids)) and sorted(order) == sorted(ids)


@pytest.mark.skipif(sys.hash_info.algorithm != "siphash13", reason="the model is CPython 3.11+'s SipHash-1-3")
@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_the_simulator_hands_finished_requests_over_in_set_order(scheduling):
    """multi-turn-small with a CPU tier of 32 chunks (the repro of docs/fidelity.md): every
    schedule's finished ids reach the connector in the order a set filled in finish order
    iterates under the pinned seed; several steps finish more than one request, and in some the
    set's order differs from the finish order."""
    workload = load_workload("multi-turn-small", {"cpu_chunks": "32", "scheduling": scheduling})
    engine = Engine(workload.requests, workload.engine, Fixes(), max_steps=5000)
    scheduler = engine.scheduler
    seen: list[tuple[list[str], list[str]]] = []  # (finish order, order handed to the connector)
    schedule = scheduler.schedule

    def recorded(step):
        finished = list(scheduler.finished_since_schedule)
        out = schedule(step)
        seen.append((finished, list(out[0].finished_req_ids)))
        return out

    scheduler.schedule = recorded
    record = engine.run()
    assert record.crash is None and record.finished_requests == len(workload.requests)
    several = [(added, handed) for added, handed in seen if len(added) > 1]
    assert len(several) >= 4 and any(added != handed for added, handed in several)
    real = in_child(HASH_SEED, [added for added, _ in several])["orders"]
    assert [handed for _, handed in several] == real
