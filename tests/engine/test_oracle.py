"""The KV content oracle's fingerprints (engine/oracle.py): the fingerprint of a prefix is the
polynomial hash the module states, ``fp[i] = fp[i-1] * B + (token[i] + 1) mod 2**64``, whether it
is computed for a whole sequence at once (a forward's writes) or one token at a time (drafts)."""

from __future__ import annotations

import numpy as np

from kvoffload.engine.oracle import extend_fingerprint, prefix_fingerprints


def test_a_whole_sequence_at_once_equals_the_recurrence_token_by_token():
    tokens = [5, 0, 7, 29_999, 5, 5, 123, 0]
    expected, fingerprint = [], 0
    for token in tokens:
        fingerprint = extend_fingerprint(fingerprint, token)
        expected.append(fingerprint)
    assert prefix_fingerprints(np.array(tokens, dtype=np.int64)).tolist() == expected
    assert expected[0] == 5 + 1  # B**0 * (token + 1): the first prefix is its token, plus one


def test_equal_prefixes_agree_and_one_differing_token_differs_at_every_later_position():
    a = prefix_fingerprints(np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.int64))
    b = prefix_fingerprints(np.array([3, 1, 4, 7, 5, 9, 2, 6], dtype=np.int64))
    assert (a[:3] == b[:3]).all()
    assert (a[3:] != b[3:]).all()


def test_an_oracle_over_a_device_cache_never_asks_for_a_host_view():
    """The numpy view of the slots is a CPU shortcut: a CUDA tensor has no host memory to view
    (``.numpy()`` raises), so over a device cache the oracle must index through torch. CI has no
    GPU; a cache on the ``meta`` device (storage nowhere, like a device's from the host) stands in
    for one."""
    from types import SimpleNamespace

    import torch

    from kvoffload.engine.oracle import KVOracle
    from kvoffload.worker.kv import KVCache

    host = KVCache(num_gpu_blocks=4, num_cpu_chunks=2, block_size=2, blocks_per_chunk=1, slot_bytes=16)
    device_cache = SimpleNamespace(gpu=torch.empty(host.gpu.shape, dtype=host.gpu.dtype, device="meta"),
                                   cpu=host.cpu, num_gpu_blocks=4, num_cpu_chunks=2, slot_bytes=16)
    oracle = KVOracle(device_cache, [], block_size=2, tokens_per_chunk=2)
    assert oracle._slot_fp.device.type == "meta"
