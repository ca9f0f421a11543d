"""Hostile inputs for the fuzz harness: JSON values, Mooncake lines, ShareGPT files, TOML
definitions, command lines; and the settings every fuzz test runs under.

Numbers are drawn from three pools: small valid values, the boundaries of ``workloads/limits.py``
(just inside and just outside), and hostile ones (NaN, infinities, 1e308, 2**63, negative, the
wrong type). Large values that are *valid* (10**7 conversations, a 10**7-token request on a huge
GPU pool) are left out on purpose: they are real work, not bad input, and would only make the
harness slow.

Examples are derandomized (the same inputs in every CI run, so a red build reproduces);
``KVOFFLOAD_FUZZ=random`` draws fresh inputs and ``KVOFFLOAD_FUZZ_EXAMPLES=3`` triples the count.
The nightly profile (``KVOFFLOAD_FUZZ=nightly``, ``.ci/nightly``) draws fresh inputs, ten times
as many unless ``KVOFFLOAD_FUZZ_EXAMPLES`` says otherwise, and runs the fault trials of every
command (``test_fault_trials.py``).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from datetime import timedelta

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kvoffload.workloads.limits import MAX_JSON_DEPTH, MAX_REQUESTS, MAX_STEP, MAX_TOKENS

NIGHTLY = os.environ.get("KVOFFLOAD_FUZZ") == "nightly"
_SCALE = float(os.environ.get("KVOFFLOAD_FUZZ_EXAMPLES", "10" if NIGHTLY else "1"))
# Inputs run in this session, by category (conftest prints them at the end: the harness's count).
INPUTS: Counter[str] = Counter()


def fuzz_settings(examples: int, seconds: float = 15) -> settings:
    return settings(
        max_examples=max(1, int(examples * _SCALE)),
        derandomize=os.environ.get("KVOFFLOAD_FUZZ") not in ("random", "nightly"),
        database=None,  # no .hypothesis/ folder from CI runs
        deadline=timedelta(seconds=seconds),  # the time bound of one input, on a loaded 2-core machine
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                               HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


class Raw(str):
    """Text written as it is into TOML (deeply nested arrays) and, by :func:`dumps`, into JSON."""


# An integer past CPython's 4,300-digit limit on int(str): json.loads and tomllib raise a bare
# ValueError on it (issue 22). A Python int this long could not even be printed, so it travels as
# text and :func:`dumps` / :func:`toml_value` write its digits unquoted.
HUGE = Raw("9" * 5000)
HOSTILE_NUMBERS = (float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 1e-300, 0.5, -1, 2**63, -(2**63),
                   10**400, HUGE, True, False, None, "12", [], {})


def dumps(value) -> str:
    """``json.dumps``, with each :data:`HUGE` written as the number it stands for."""
    return json.dumps(value).replace(json.dumps(str(HUGE)), str(HUGE))
STEP_EDGES = (0, MAX_STEP, MAX_STEP + 1, 10**10, 10**18)
TOKEN_EDGES = (0, 1, 511, 512, 513, MAX_TOKENS, MAX_TOKENS + 1, 10**8, 10**12)
COUNT_EDGES = (0, 1, MAX_REQUESTS + 1, 10**8)


@st.composite
def mostly(draw, valid: st.SearchStrategy, hostile: st.SearchStrategy, one_in: int = 12):
    """``valid`` most of the time, ``hostile`` one time in ``one_in``: a definition with every key
    hostile fails at its first key, and the keys behind it would never be reached."""
    return draw(hostile if draw(st.integers(1, one_in)) == 1 else valid)


def numbers(small: st.SearchStrategy, edges: tuple) -> st.SearchStrategy:
    return mostly(small, st.one_of(st.sampled_from(edges), st.sampled_from(HOSTILE_NUMBERS)))


def steps() -> st.SearchStrategy:
    return numbers(st.integers(0, 50), STEP_EDGES)


def lengths() -> st.SearchStrategy:
    return numbers(st.integers(1, 200), TOKEN_EDGES)


def counts() -> st.SearchStrategy:
    return numbers(st.integers(1, 4), COUNT_EDGES)


def reals() -> st.SearchStrategy:
    return numbers(st.floats(0.0, 1.0), (1.0 + 1e-17, 1.000001, 1.5, 2.0, 1e18))


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)  # no lone surrogates: UTF-8 files
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=True, allow_infinity=True), texts, st.just(HUGE))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(texts, inner, max_size=3), max_leaves=8)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


deep_nesting = st.sampled_from((MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 1, 5_000, 200_000)).map(nested)


@st.composite
def mooncake_line(draw) -> str:
    """One line of a trace: mostly a plausible record with some fields made hostile, sometimes
    junk (random JSON, text, deep nesting)."""
    shape = draw(mostly(st.just("record"), st.sampled_from(("json", "text", "nested-extra")), one_in=5))
    if shape == "json":
        return dumps(draw(json_values))
    if shape == "text":
        return draw(texts).replace("\n", " ")
    input_length = draw(mostly(st.integers(1, 1500), lengths()))
    record = {
        "timestamp": draw(mostly(st.integers(0, 10_000), st.one_of(steps(), st.floats(allow_nan=True)))),
        "input_length": input_length,
        "output_length": draw(mostly(st.integers(1, 100), lengths())),
    }
    known_length = isinstance(input_length, int) and not isinstance(input_length, bool)
    if known_length and 0 < input_length < 10**5:
        record["hash_ids"] = draw(st.lists(st.one_of(st.integers(0, 30), st.just(HUGE)) if draw(st.integers(0, 20)) == 0
                                           else st.integers(0, 30), min_size=-(-input_length // 512),
                                           max_size=-(-input_length // 512)))
    elif known_length and 0 < input_length <= MAX_TOKENS + 512:  # a request as long as gpu_blocks=auto may size for
        record["hash_ids"] = [block % 31 for block in range(-(-input_length // 512))]
    else:
        record["hash_ids"] = draw(json_values)
    if draw(st.integers(0, 9)) == 0:
        del record[draw(st.sampled_from(sorted(record)))]  # a missing key
    text = dumps(record)
    if shape == "nested-extra":  # an unused key nobody reads, nested deep
        text = text[:-1] + ', "extra": ' + draw(deep_nesting) + "}"
    return text


def mooncake_trace() -> st.SearchStrategy:
    return st.lists(mooncake_line(), min_size=0, max_size=5).map(lambda lines: "\n".join(lines) + "\n")


@st.composite
def sharegpt_file(draw) -> bytes:
    """A ShareGPT file: records of turns (some roles, values or structure wrong), JSONL or an
    array, or raw bytes, or deep nesting."""
    shape = draw(mostly(st.sampled_from(("array", "jsonl")), st.sampled_from(("bytes", "nested", "json")), one_in=3))
    if shape == "bytes":
        return draw(st.binary(max_size=200))
    if shape == "nested":
        return draw(deep_nesting).encode()
    if shape == "json":
        return dumps(draw(json_values)).encode()
    role = st.sampled_from(("human", "gpt", "human", "gpt", "system", "bard"))
    message = st.fixed_dictionaries({"from": mostly(role, json_scalars), "value": mostly(texts, json_scalars)})
    record = st.fixed_dictionaries({"id": mostly(texts, json_scalars),
                                    "conversations": mostly(st.lists(message, max_size=4), json_values)})
    records = draw(st.lists(mostly(record, json_values), min_size=0, max_size=3))
    if shape == "array":
        return dumps(records).encode()
    return "\n".join(dumps(item) for item in records).encode()


# ---- TOML -----------------------------------------------------------------------------------


def toml_value(value) -> str:
    """A TOML rendering of a Python value (inf and nan as TOML spells them)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value if item is not None) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(key)} = {toml_value(item)}" for key, item in value.items()
                               if item is not None) + "}"
    raise TypeError(value)


def toml_text(definition: dict) -> str:
    lines = []
    tables = {key: value for key, value in definition.items() if isinstance(value, dict) and key in
              ("engine", "generator", "aborts")}
    for key, value in definition.items():
        if key not in tables and value is not None:
            lines.append(f"{json.dumps(key)} = {toml_value(value)}")
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{json.dumps(key)} = {toml_value(value)}" for key, value in table.items() if value is not None]
    return "\n".join(lines) + "\n"


@st.composite
def distribution(draw, quantity: st.SearchStrategy) -> object:
    """A bare number or an inline distribution table with (possibly hostile) parameters."""
    kind = draw(mostly(st.sampled_from(("bare", "constant", "uniform", "lognormal", "zipf", "poisson")),
                       st.just("bogus")))
    if kind == "bare":
        return draw(quantity)
    table: dict = {"dist": kind}
    if kind == "constant":
        table["value"] = draw(quantity)
    elif kind == "uniform":
        table["min"], table["max"] = draw(quantity), draw(quantity)
    elif kind == "lognormal":
        table["mean"], table["sigma"] = draw(st.one_of(quantity, reals())), draw(reals())
    elif kind == "zipf":
        table["alpha"] = draw(st.one_of(st.sampled_from((1.0 + 1e-15, 1.01, 1.5, 3.0)), reals()))
    elif kind == "poisson":
        table["mean"] = draw(st.one_of(quantity, reals()))
    else:
        table["colour"] = draw(json_scalars)
    if kind in ("lognormal", "zipf", "poisson"):
        table["max"] = draw(st.one_of(st.none(), quantity))
    return table


GENERATOR_KEYS = {
    "multi-turn": {"conversations": counts, "turns": lambda: distribution(counts()),
                   "prefix_len": lambda: distribution(lengths()), "user_len": lambda: distribution(lengths()),
                   "answer_len": lambda: distribution(lengths()), "think_steps": lambda: distribution(steps()),
                   "conversation_gap": lambda: distribution(steps()), "eos_share": reals,
                   "common_prefix_len": lengths},
    "shared-prefix": {"groups": counts, "prompts_per_group": counts,
                      "system_prompt_len": lambda: distribution(lengths()),
                      "question_len": lambda: distribution(lengths()), "output_len": lambda: distribution(lengths()),
                      "arrival_gap": lambda: distribution(steps()), "eos_share": reals},
    "spec-decode": {"conversations": counts, "turns": lambda: distribution(counts()),
                    "prompt_len": lambda: distribution(lengths()), "user_len": lambda: distribution(lengths()),
                    "output_len": lambda: distribution(lengths()), "end_on_boundary": reals,
                    "think_steps": lambda: distribution(steps()), "conversation_gap": lambda: distribution(steps())},
    "mooncake": {"path": lambda: st.just("trace.jsonl"), "ms_per_step": reals, "max_requests": counts},
    "sharegpt": {"path": lambda: st.just("chat.json"), "max_conversations": counts, "max_turns": counts,
                 "think_steps": lambda: distribution(steps())},
}
ENGINE_KEYS = {
    "gpu_blocks": lambda: numbers(st.integers(2, 512), (1, 2, 10**20, 2**40)),
    "cpu_chunks": lambda: numbers(st.integers(1, 512), (10**20,)),
    "block_size": lambda: numbers(st.sampled_from((1, 4, 16)), (0, 2**31)),
    "blocks_per_chunk": lambda: numbers(st.sampled_from((1, 2)), (0, 10**9)),
    "spec_tokens": lambda: numbers(st.integers(0, 3), (10**9,)),
    "workers": lambda: numbers(st.integers(1, 4), (1024, 1025, 10**12)),
    "store_completion_steps": lambda: numbers(st.integers(0, 3), (MAX_STEP + 1,)),
    "scheduling": lambda: mostly(st.sampled_from(("sync", "async")), st.sampled_from(("eager", 1))),
}


@st.composite
def definition(draw) -> dict:
    """A workload definition: every key valid, or made hostile, or dropped, or unknown."""
    kind = draw(mostly(st.sampled_from(sorted(GENERATOR_KEYS)), st.just("nonsense")))
    generator: dict = {"kind": kind}
    for key, values in GENERATOR_KEYS.get(kind, {}).items():
        if draw(st.integers(0, 30)):  # a required key goes missing now and then
            generator[key] = draw(values())
    engine = {key: draw(values()) for key, values in ENGINE_KEYS.items() if draw(st.integers(0, 3)) == 0}
    if kind == "spec-decode" and "spec_tokens" not in engine:
        engine["spec_tokens"] = 2
    result = {"name": draw(mostly(st.just("fuzz"), json_scalars, one_in=20)), "description": "fuzzed",
              "seed": draw(mostly(st.integers(0, 9), st.sampled_from(HOSTILE_NUMBERS), one_in=20)),
              "engine": engine, "generator": generator}
    if draw(st.integers(0, 4)) == 0:
        result["aborts"] = {"share": draw(reals()), "after_steps": draw(distribution(steps()))}
    if draw(st.integers(0, 40)) == 0:
        engine["seed"] = 1  # the one seed is the top-level one
    if draw(st.integers(0, 9)) == 0:
        result["unused"] = Raw(draw(st.sampled_from((nested(MAX_JSON_DEPTH + 1), nested(3000)))))
    return result
