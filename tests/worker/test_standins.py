"""The CPU stand-ins for a connector's GPU calls (``kvoffload.vllm.standins``) keep the stock
replay's rule: a copy submitted and not waited on lands after the step's forward, an event
completes when its copy has (``completion_steps`` steps after it landed), a wait lands and
completes at once. No vLLM needed: the stand-ins import torch only.

Each story plays one worker step as the replay does: submit, forward (writes KV),
``after_forward()`` (the replay's copy hook), then the connector polls its events.
"""

from __future__ import annotations

import pytest
import torch

from kvoffload.vllm.standins import Patches, StandInsMissing, dma, streams, threads
from kvoffload.vllm.standins.timeline import CopyTimeline, active

NUM_BLOCKS, BLOCK_BYTES = 8, 16


@pytest.fixture
def timeline():
    built = CopyTimeline(completion_steps=1)
    with active(built):
        yield built


def regions():
    gpu = {"layer": torch.zeros(NUM_BLOCKS, BLOCK_BYTES, dtype=torch.int8)}
    cpu = {"layer": torch.zeros(NUM_BLOCKS, BLOCK_BYTES, dtype=torch.int8)}
    return gpu, cpu


def test_a_store_reads_what_the_forward_wrote_after_its_submission(timeline):
    gpu, cpu = regions()
    stream = streams.Stream()
    params = dma.build_params(gpu, cpu, stream)
    gpu["layer"][5] = 1  # the finished request's KV
    dma.copy_blocks([5], [3], params)
    assert not cpu["layer"][3].any(), "submitting must not copy"

    gpu["layer"][5] = 2  # the forward of the block's new owner
    timeline.after_forward()

    assert (cpu["layer"][3] == 2).all()


def test_an_event_completes_completion_steps_after_its_copy_landed(timeline):
    gpu, cpu = regions()
    stream = streams.Stream()
    dma.copy_blocks([1], [1], dma.build_params(gpu, cpu, stream))
    event = streams.Event()
    event.record(stream)
    assert not event.query()

    timeline.after_forward()  # the copy lands here ...
    assert not event.query()
    timeline.after_forward()  # ... and completes one step later (completion_steps=1)
    assert event.query()


def test_synchronize_lands_and_completes_before_the_forward(timeline):
    """A wait is a fence: the copy reads the KV as it was, whatever the forward writes next."""
    gpu, cpu = regions()
    stream = streams.Stream()
    gpu["layer"][4] = 7
    dma.copy_blocks([4], [0], dma.build_params(gpu, cpu, stream))
    event = streams.Event()
    event.record(stream)

    event.synchronize()
    gpu["layer"][4] = 9
    timeline.after_forward()

    assert event.query() and (cpu["layer"][0] == 7).all()


def test_a_wait_on_one_stream_lands_no_copy_of_another(timeline):
    gpu, cpu = regions()
    loads, stores = streams.Stream(), streams.Stream()
    dma.copy_blocks([2], [2], dma.build_params(cpu, gpu, loads))
    cpu["layer"][2] = 3
    dma.copy_blocks([6], [6], dma.build_params(gpu, cpu, stores))
    stores.synchronize()

    assert not gpu["layer"][2].any() and stores.query() and not loads.query()


def test_an_event_on_the_compute_stream_and_an_unrecorded_one_are_complete(timeline):
    recorded, unrecorded = streams.Event(), streams.Event()
    recorded.record(streams.current_stream())
    assert recorded.query() and unrecorded.query()


def test_a_copy_out_of_its_region_raises_at_submission(timeline):
    """On a GPU such a DMA writes someone else's memory; here it names the block."""
    gpu, cpu = regions()
    params = dma.build_params(gpu, cpu, streams.Stream())
    with pytest.raises(RuntimeError, match="destination block 8 outside its region of 8 blocks"):
        dma.copy_blocks([0], [NUM_BLOCKS], params)


def test_the_copy_thread_runs_its_loop_on_each_put_until_the_queue_is_empty():
    seen = []

    def loop(queue, tag):
        while True:
            item = queue.get()
            if item is None:
                return
            seen.append((tag, item))

    queue = threads.InlineQueue()
    thread = threads.InlineThread(target=loop, args=(queue, "t"), daemon=True)
    thread.start()
    queue.put(1)
    queue.put(2)
    assert seen == [("t", 1), ("t", 2)] and thread.is_alive()
    queue.put(None)
    assert not thread.is_alive()


def test_an_exception_in_the_copy_thread_reaches_the_caller():
    """A real thread would die silently and its events never complete: here it is a crash."""
    def loop(queue):
        queue.get()
        raise ValueError("planted: copy loop broke")

    queue = threads.InlineQueue()
    threads.InlineThread(target=loop, args=(queue,)).start()
    with pytest.raises(ValueError, match="planted"):
        queue.put("item")


def test_patches_replace_names_and_undo_them():
    import json

    patches = Patches()
    original = json.dumps
    patches.replace("json", dumps=len)
    assert json.dumps is len
    patches.undo()
    assert json.dumps is original


def test_a_module_without_the_name_is_a_release_the_stand_ins_do_not_cover():
    with pytest.raises(StandInsMissing, match="do not cover json: it has no 'cudaHostRegister'"):
        Patches().replace("json", cudaHostRegister=None)


def test_the_torch_facade_changes_only_streams_and_events():
    facade = streams.torch_facade()
    assert facade.cuda.Stream is streams.Stream and facade.Event is streams.Event
    assert facade.zeros is torch.zeros and facade.int8 is torch.int8 and facade.cuda.is_available is torch.cuda.is_available
    assert facade.cuda.Stream.priority_range() == (0, 0)


def test_finish_all_asks_for_one_more_step_to_report_what_it_completed(timeline):
    """At a run's end the replay waits for the copies (finish_all) and steps once more, so that
    the connector polls the events it completed; then there is nothing left."""
    gpu, cpu = regions()
    dma.copy_blocks([1], [1], dma.build_params(gpu, cpu, streams.Stream()))
    assert timeline.finish_all()  # landed and completed now
    assert timeline.finish_all()  # ... and reported only by the next step's poll
    timeline.after_forward()
    assert not timeline.finish_all()
