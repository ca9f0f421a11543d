"""The CPU stand-ins for SimpleCPUOffloadConnector's GPU calls (``kvoffload.vllm.standins``), in
the stories its worker relies on beyond one stream and one step (tests/worker/test_standins.py
has those): a copy ordered after another stream's event waits for it, a slower copy engine
completes later, and a DMA far past its region is refused as one just past it is. No vLLM
needed: the stand-ins import torch only."""

from __future__ import annotations

import pytest
import torch

from kvoffload.vllm.standins import dma, streams
from kvoffload.vllm.standins.timeline import CopyTimeline, active

NUM_BLOCKS, BLOCK_BYTES = 8, 16


def regions():
    gpu = {"layer": torch.zeros(NUM_BLOCKS, BLOCK_BYTES, dtype=torch.int8)}
    cpu = {"layer": torch.zeros(NUM_BLOCKS, BLOCK_BYTES, dtype=torch.int8)}
    return gpu, cpu


def test_a_copy_ordered_after_another_streams_event_lands_that_streams_copy_first():
    """``Stream.wait_event``: the worker orders its loads after the stores whose event it waits
    on; a wait on the load stream then lands the store it was ordered after, not only its own."""
    with active(CopyTimeline(completion_steps=1)):
        gpu, cpu = regions()
        stores, loads = streams.Stream(), streams.Stream()
        gpu["layer"][3] = 5
        dma.copy_blocks([3], [3], dma.build_params(gpu, cpu, stores))
        stored = streams.Event()
        stored.record(stores)
        loads.wait_event(stored)
        loads.wait_event(streams.Event())  # never recorded: nothing to wait for
        dma.copy_blocks([3], [6], dma.build_params(cpu, gpu, loads))

        loads.synchronize()

        assert (cpu["layer"][3] == 5).all() and (gpu["layer"][6] == 5).all()


def test_copies_complete_completion_steps_forwards_after_the_one_they_landed_in():
    """Two-step copies: the copy lands at the first forward after its submission and completes
    at the third, not earlier (each forward is one step of the replay)."""
    with active(CopyTimeline(completion_steps=2)) as timeline:
        gpu, cpu = regions()
        stream = streams.Stream()
        dma.copy_blocks([1], [1], dma.build_params(gpu, cpu, stream))
        event = streams.Event()
        event.record(stream)
        done = []
        for _ in range(3):
            timeline.after_forward()
            done.append(event.query())
        assert done == [False, False, True]


@pytest.mark.parametrize("block", [-1, NUM_BLOCKS, NUM_BLOCKS + 1, 10 * NUM_BLOCKS])
def test_a_source_block_anywhere_outside_its_region_is_refused(block):
    """A GPU DMA from any block past the region (not only the first one past it) reads someone
    else's memory: refused at submission, naming the block."""
    with active(CopyTimeline()):
        gpu, cpu = regions()
        params = dma.build_params(gpu, cpu, streams.Stream())
        with pytest.raises(RuntimeError, match=f"source block {block} outside its region of {NUM_BLOCKS} blocks"):
            dma.copy_blocks([block], [0], params)
