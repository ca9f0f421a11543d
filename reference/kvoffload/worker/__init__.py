"""The worker side: KV tensors, transfer handlers, and the connector's worker half.

The only part of the package that imports torch.

- ``kv``        KVCache: the GPU block tensor and the offload-tier chunk tensor
- ``copy``      job validation and row planning (TransferJobError), the CPU block copier
- ``handler``   the handler contract, HandlerStats, shared submission bookkeeping
- ``stepped``   SteppedTransferHandler: deterministic, adversarial copies at named points
- ``threaded``  ThreadedCopyHandler: background CPU copies, one thread per direction
- ``cuda``      CudaTransferHandler: side streams, events, pinned host tier
- ``connector`` WorkerConnector: deferred store queue, flush-before-wait fence, statistics
"""

from kvoffload.worker.connector import DirectionTotals, WorkerConnector, WorkerStats
from kvoffload.worker.copy import TransferJobError
from kvoffload.worker.cuda import CudaTransferHandler
from kvoffload.worker.handler import HandlerStats, TransferHandler
from kvoffload.worker.kv import FINGERPRINT_BYTES, KVCache
from kvoffload.worker.stepped import SteppedTransferHandler
from kvoffload.worker.threaded import ThreadedCopyHandler

__all__ = [
    "CudaTransferHandler",
    "DirectionTotals",
    "FINGERPRINT_BYTES",
    "HandlerStats",
    "KVCache",
    "SteppedTransferHandler",
    "ThreadedCopyHandler",
    "TransferHandler",
    "TransferJobError",
    "WorkerConnector",
    "WorkerStats",
]
