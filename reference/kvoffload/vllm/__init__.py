"""vLLM in the loop: the only package that imports vllm (the optional ``vllm`` extra).

- ``connector``  KVOffloadConnector: the reference connector as a vLLM V1 KV connector
- ``stock``      vLLM's stock OffloadingConnector with a worker that copies without a GPU
- ``regions``    vLLM's paged KV caches as block regions for the project's transfer handlers
- ``build``      VllmConfig, scheduler, KV caches and worker connector for a replay
- ``model``      the fake model runner's pieces: fingerprint cells, scripted sequences
- ``observe``    timing and admission bookkeeping around the connector's scheduler calls
- ``replay``     VllmSchedulerReplay: a workload through vLLM's Scheduler / AsyncScheduler
- ``engine``     the ``vllm-scheduler`` engine as the runner sees it
- ``llm_engine``  the ``vllm`` engine: a workload through vLLM's real engine and a real model
  (``llm_start`` starts and stops that engine; ``scheduled_writes`` feeds its store delays)
"""

import os

# vLLM logs every config decision at INFO; a replay driver wants warnings only. Without effect
# when vLLM was imported first (inside a vLLM deployment the factory imports this package late).
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
