"""The catalogue gates against any connector, in vLLM's real scheduler (``--engine vllm-scheduler``)::

    pytest -p kvoffload.gates.plugin --pyargs kvoffload.gates --kv-connector stock|reference|MODULE:CLASS \\
        [--kv-preset vllm-0.29] [--kv-disable FIX,...]

Every gate class of the simulator's catalogue (tests/gates, K01-K30) has a class of the same name
here: its story replayed through vLLM's own ``Scheduler`` / ``AsyncScheduler`` with the named
connector, asserting what a correct connector shows from outside (no poisoned load, no crash,
nothing leaked, the chunk served), or a skip with a one-line reason (the hook a foreign
connector or vLLM's scheduler lacks; for the bugs no story can show, the catalogue's reason,
``catalogue.py``). ``plugin.py`` adds the options (loaded with ``-p``: as a ``pytest11`` entry
point it would make pytest rewrite the asserts of the whole package). tests/gates/README.md holds
the gate x connector matrix (scripts/gates_table --matrix).
"""
