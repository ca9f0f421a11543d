"""The catalogue gates against any connector, in vLLM's real scheduler (``--engine vllm-scheduler``)::

    pytest -p kvoffload.gates.plugin --pyargs kvoffload.gates --kv-connector stock|reference|MODULE:CLASS [--kv-preset vllm-0.29]

Each gate replays one catalogued bug's story (``kvoffload.gates.bugs``) through vLLM's own
``Scheduler`` / ``AsyncScheduler`` with the named connector and asserts what a correct connector
must show from outside: no poisoned load, no crash, the chunk served. A gate that needs a hook a
foreign connector lacks (the reference manager's lifecycle record) is skipped with a one-line
reason. ``plugin.py`` adds the options (loaded with ``-p``: as a ``pytest11`` entry point it would make
pytest rewrite the asserts of the whole package). The project's own suite keeps running the finer simulator gates
in tests/gates; tests/gates/README.md holds the gate x connector matrix (scripts/gates_table).
"""
