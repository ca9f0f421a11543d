"""``sharegpt``: replay ShareGPT-style conversations as multi-turn follow-up chains.

Input: a JSON array (or JSONL) of records ``{"id": ..., "conversations": [{"from", "value"}]}``,
read offline through Hugging Face ``datasets`` (``load_dataset("json", data_files=...)``; the
loader sets ``HF_DATASETS_OFFLINE=1`` and ``HF_HUB_OFFLINE=1`` before importing it, and turns off
its progress bars).

Roles: ``human``/``user`` messages are user turns; ``gpt``/``assistant``/``chatgpt``/``bard``/
``bing``/``model`` messages are answers; ``system`` messages open the first prompt. Answers before
the first user message are dropped (ShareGPT's split records often start mid-conversation),
consecutive messages of one role are joined, and a final user message without an answer is
dropped. A record left without a single (user, answer) pair is an error.

Text becomes token ids through :class:`~kvoffload.workloads.tokens.StandInTokenizer`, a
deterministic stand-in, not a real tokenizer. A stand-in chat template wraps each turn::

    turn 0:    [system text] USER user-text ASSISTANT          -> answer-text EOS
    turn k+1:  prompt k + answer k + USER user-text ASSISTANT  -> answer-text EOS

Answers end naturally, so every request stops on EOS. Conversations start ``conversation_gap``
steps apart (default Poisson, mean 40) and turn k+1 arrives ``think_steps`` after turn k finished
(default Poisson, mean 150), both drawn from the workload seed.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvoffload import long_numbers
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads.distributions import Distribution, parse_distribution, poisson
from kvoffload.workloads.limits import MAX_JSON_DEPTH, MAX_REQUESTS, MAX_STEP, json_depth_at_most
from kvoffload.workloads.registry import GenerateContext, register
from kvoffload.workloads.schema import TableReader, WorkloadError, fail, json_problem, require_regular_file, show
from kvoffload.workloads.tokens import ASSISTANT_ID, EOS_ID, USER_ID, StandInTokenizer

USER_ROLES = frozenset({"human", "user"})
ANSWER_ROLES = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model"})
SYSTEM_ROLES = frozenset({"system"})
_ROLES = ", ".join(sorted(USER_ROLES | ANSWER_ROLES | SYSTEM_ROLES))


@dataclass(frozen=True)
class Conversation:
    record: int  # 1-based position in the file
    system: str
    turns: tuple[tuple[str, str], ...]  # (user text, answer text)


@register("sharegpt")
@dataclass(frozen=True)
class ShareGPT:
    path: str  # relative to the definition's folder (or the working directory for sharegpt:FILE)
    max_conversations: int | None
    max_turns: int | None
    conversation_gap: Distribution
    think_steps: Distribution

    @classmethod
    def from_table(cls, table: TableReader) -> "ShareGPT":
        return cls(
            path=table.string("path"),
            max_conversations=table.optional_integer("max_conversations", minimum=1),
            max_turns=table.optional_integer("max_turns", minimum=1),
            conversation_gap=parse_distribution(table, "conversation_gap", floor=0, ceiling=MAX_STEP,
                                                default=poisson(40.0)),
            think_steps=parse_distribution(table, "think_steps", floor=0, ceiling=MAX_STEP, default=poisson(150.0)),
        )

    def generate(self, ctx: GenerateContext) -> list[RequestSpec]:
        path = ctx.base_dir / self.path
        records = read_records(path, display=str(path))
        if self.max_conversations is not None:
            records = records[: self.max_conversations]
        conversations = [to_conversation(record, index, display=str(path)) for index, record in enumerate(records, 1)]
        rng = random.Random(ctx.seed)
        tokenizer = StandInTokenizer()
        width = len(str(len(conversations)))
        requests: list[RequestSpec] = []
        arrival = 0
        for position, conversation in enumerate(conversations):
            if position:
                arrival += self.conversation_gap.sample(rng)
            name = f"sg{conversation.record:0{width}d}"
            history = tokenizer.encode(conversation.system)
            parent: str | None = None
            for turn, (user, answer) in enumerate(conversation.turns[: self.max_turns]):
                prompt = history + (USER_ID,) + tokenizer.encode(user) + (ASSISTANT_ID,)
                output = tokenizer.encode(answer) + (EOS_ID,)
                ctx.budget.add(f"record {conversation.record} turn {turn}", len(prompt), len(output))
                spec = RequestSpec(
                    req_id=f"{name}-t{turn:02d}",
                    prompt_token_ids=prompt,
                    output_token_ids=output,
                    stop="eos",
                    arrival_step=arrival if parent is None else 0,
                    parent=parent,
                    think_steps=0 if parent is None else self.think_steps.sample(rng),
                    conversation=name,
                    turn=turn,
                )
                requests.append(spec)
                parent = spec.req_id
                history = prompt + spec.output_token_ids
        return requests


def read_records(path: Path, *, display: str) -> list[Any]:
    """The records of a local JSON/JSONL file, through ``datasets``, offline.

    The file is checked first (UTF-8 text, nested at most ``MAX_JSON_DEPTH`` deep): pyarrow's
    JSON reader behind ``datasets`` crashes the whole process on deeply nested input, and logs
    its own lines about undecodable files."""
    require_regular_file(path, display, "a ShareGPT JSON file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WorkloadError(f"{display}: cannot read the file ({exc.strerror})") from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise WorkloadError(f"{display}: line {line}: expected UTF-8 JSON text, got undecodable bytes") from None
    if not json_depth_at_most(data):
        raise WorkloadError(f"{display}: expected ShareGPT records, got JSON nested deeper than {MAX_JSON_DEPTH} levels")
    first = data.lstrip()[:1]
    if first not in (b"[", b"{"):  # pyarrow's reader crashes the process on a bare `null`
        shown = repr(data.lstrip()[:20].decode("utf-8")) if first else "an empty file"
        raise WorkloadError(f"{display}: expected a JSON array of conversation records or one record per line, "
                            f"got {shown}")
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets  # heavy (about a second): imported only when a ShareGPT file is read

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL + 1)  # our one line says what was wrong
    try:
        dataset = datasets.load_dataset("json", data_files=str(path), split="train")
    except Exception as exc:  # datasets raises many types; explain from the JSON itself
        raise _explain_unreadable(path, display, exc) from None
    if dataset.num_rows > MAX_REQUESTS:
        raise WorkloadError(f"{display}: expected at most {MAX_REQUESTS:,} records (10**7; the workload must "
                            f"fit memory), got {dataset.num_rows:,}")
    records = dataset.to_list()
    if not records:
        raise WorkloadError(f"{display}: expected at least one conversation record, got none")
    return records


def _explain_unreadable(path: Path, display: str, exc: Exception) -> WorkloadError:
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        return WorkloadError(f"{display}: expected a JSON array of conversation records, got an empty file")
    try:
        json.loads(text)
    except json.JSONDecodeError as whole:
        if text.lstrip().startswith("["):
            return WorkloadError(f"{display}: line {whole.lineno}: expected valid JSON, got invalid JSON "
                                 f"({json_problem(whole)})")
        for number, line in enumerate(text.splitlines(), start=1):  # JSONL: the first bad line
            problem = _json_problem(line)
            if problem is not None:
                return WorkloadError(f"{display}: line {number}: expected one JSON record per line, got {problem}")
    except ValueError as whole:  # not a JSONDecodeError: a number too long to convert
        if not long_numbers.is_too_long(whole):
            raise
        return WorkloadError(f"{display}: expected {long_numbers.EXPECTED}, got {long_numbers.describe(text)}")
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return WorkloadError(f"{display}: expected a JSON array of {{id, conversations}} records, got "
                         f"something datasets cannot read ({detail})")


def _json_problem(line: str) -> str | None:
    """What is wrong with one JSONL line as JSON, or None."""
    if not line.strip():
        return None
    try:
        json.loads(line)
    except json.JSONDecodeError as error:
        return f"invalid JSON ({json_problem(error)})"
    except ValueError as error:
        if not long_numbers.is_too_long(error):
            raise
        return long_numbers.describe(line, line=False)
    return None


def to_conversation(record: Any, index: int, *, display: str) -> Conversation:
    """Validate one record and fold its messages into (user, answer) turns."""
    where = f"record {index}"
    if not isinstance(record, dict):
        fail(display, where, "a JSON object with a 'conversations' list", record)
    if record.get("id") is not None:
        where += f" (id {show(record['id'])})"
    messages = record.get("conversations")
    if not isinstance(messages, list):
        fail(display, f"{where}: key conversations", "a list of {from, value} messages", messages)
    system: list[str] = []
    merged: list[tuple[str, str]] = []  # (role class, text), consecutive roles joined
    for position, message in enumerate(messages):
        role, text = _message(message, display=display, where=f"{where}: key conversations[{position}]")
        if role == "system":
            system.append(text)
        elif merged and merged[-1][0] == role:
            merged[-1] = (role, merged[-1][1] + "\n" + text)
        elif merged or role == "user":  # answers before the first user message are dropped
            merged.append((role, text))
    turns = tuple((merged[i][1], merged[i + 1][1]) for i in range(0, len(merged) - 1, 2))
    if not turns:
        raise WorkloadError(f"{display}: {where}: expected at least one human message followed by a gpt "
                            f"answer, got none ({len(messages)} messages)")
    return Conversation(record=index, system="\n".join(system), turns=turns)


def _message(message: Any, *, display: str, where: str) -> tuple[str, str]:
    if not isinstance(message, dict):
        fail(display, where, "a {from, value} object", message)
    role, text = message.get("from"), message.get("value")
    if not isinstance(role, str) or role.lower() not in (USER_ROLES | ANSWER_ROLES | SYSTEM_ROLES):
        fail(display, f"{where}.from", f"one of {_ROLES}", role)
    if not isinstance(text, str):
        fail(display, f"{where}.value", "a string", text)
    lowered = role.lower()
    kind = "user" if lowered in USER_ROLES else "answer" if lowered in ANSWER_ROLES else "system"
    return kind, text
