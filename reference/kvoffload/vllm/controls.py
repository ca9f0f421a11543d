"""Controls for the release table's stated causes: one vLLM scheduler rule, switched in a release.

docs/fidelity.md ("Real releases against their presets") names, for each row where a release
and its preset differ, the scheduler rule the two engines do not share. A claim like that is
checked by a control: replay the row in a release with only that rule changed, and see the row
move to what the other side measured (``python -m kvoffload.vllm.rows --control NAME ...``).
Each control patches vLLM's classes in this process only, before the replay is built; it names
the releases it applies to and refuses the others (the rule it changes is not there).

- ``no-spec-decode-reservation`` (0.31.0 and later): vLLM 0.31 added two halves of one rule to
  ``Scheduler``: a request admitted with an asynchronous load must leave one spec-decode step's
  blocks free (``_spec_decode_step_blocks``), and every load still in flight counts that step too
  (``_request_remaining_blocks``). Both switched off: the scheduler of 0.30 and earlier.
- ``no-spec-decode-reservation-admitting``, ``...-inflight``: one half each.
- ``skipped-requests-wait-behind-preempted`` (0.30.0 and earlier): up to 0.30 a request the
  waiting loop skipped (its connector lookup said "not yet", or no blocks) sits in
  ``skipped_waiting``, which FCFS serves before ``waiting``, so it goes ahead of a request
  preempted later; from 0.31 a skipped request that holds no blocks goes back to the head of
  ``waiting``, and a later preemption is prepended ahead of it. The control moves 0.30's skipped
  requests the 0.31 way at the end of each ``schedule()``.
- ``preempt-victims-in-flight`` (0.30.0 and later): from 0.30, ``schedule()`` asks
  ``_request_blocks_can_be_freed`` before it preempts a running request, and under async
  scheduling does not take a victim whose step is still in flight (its blocks would be freed only
  after that step); up to 0.29 any running request was a victim. The control answers "yes" to
  that one question (asked from ``schedule`` itself), so victims are taken as up to 0.29; the
  deferred free of their blocks (``_free_request_blocks``) is unchanged.
"""

from __future__ import annotations

import sys
from typing import Callable

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from kvoffload.core.types import ConfigError
from kvoffload.vllm.compat import RELEASE


def _admitting_half_off() -> None:
    built = Scheduler.__init__

    def init(self, *args, **kwargs):
        built(self, *args, **kwargs)
        if RELEASE >= (0, 32, 0):
            self._spec_decode_step_blocks = 0  # 0.32: a value set in __init__
        else:
            self._spec_decode_step_blocks = lambda: 0  # 0.31: a method

    Scheduler.__init__ = init


def _inflight_half_off() -> None:
    counted = Scheduler._request_remaining_blocks

    def remaining(self, request):
        spec_tokens = self.num_spec_tokens
        self.num_spec_tokens = 0  # the half that adds 1 + k + lookahead tokens for a spec step
        try:  # 0.31 adds the step's blocks at the end, 0.32 its tokens first: both read num_spec_tokens
            return counted(self, request)
        finally:
            self.num_spec_tokens = spec_tokens

    Scheduler._request_remaining_blocks = remaining


def _skipped_requests_behind_preempted() -> None:
    scheduled = Scheduler.schedule

    def schedule(self, *args, **kwargs):
        output = scheduled(self, *args, **kwargs)
        without_blocks = [request for request in self.skipped_waiting
                          if request.num_computed_tokens == 0
                          and request.status != RequestStatus.WAITING_FOR_REMOTE_KVS]
        if without_blocks:
            self.skipped_waiting.remove_requests(without_blocks)
            for request in reversed(without_blocks):
                self.waiting.prepend_request(request)
        return output

    Scheduler.schedule = schedule


def _victims_in_flight() -> None:
    can_be_freed = Scheduler._request_blocks_can_be_freed

    def asked(self, request) -> bool:
        if sys._getframe(1).f_code.co_name == "schedule":  # the victim check, not the free itself
            return True
        return can_be_freed(self, request)

    Scheduler._request_blocks_can_be_freed = asked


# name -> (releases it applies to, as (first, last) inclusive, what it switches)
CONTROLS: dict[str, tuple[tuple[tuple[int, int, int], tuple[int, int, int]], list[Callable[[], None]]]] = {
    "no-spec-decode-reservation": (((0, 31, 0), (0, 99, 0)), [_admitting_half_off, _inflight_half_off]),
    "no-spec-decode-reservation-admitting": (((0, 31, 0), (0, 99, 0)), [_admitting_half_off]),
    "no-spec-decode-reservation-inflight": (((0, 31, 0), (0, 99, 0)), [_inflight_half_off]),
    "skipped-requests-wait-behind-preempted": (((0, 25, 0), (0, 30, 99)), [_skipped_requests_behind_preempted]),
    "preempt-victims-in-flight": (((0, 30, 0), (0, 99, 0)), [_victims_in_flight]),
}


def apply_control(name: str) -> None:
    """Patch the installed vLLM with the named control (once per process, before any replay)."""
    try:
        (first, last), patches = CONTROLS[name]
    except KeyError:
        raise ConfigError(f"unknown control {name!r} (known: {', '.join(CONTROLS)})") from None
    if not first <= RELEASE <= last:
        raise ConfigError(f"control {name!r} changes a rule of vLLM {'.'.join(map(str, first))} to "
                          f"{'.'.join(map(str, last))}; this is {'.'.join(map(str, RELEASE))}")
    for patch in patches:
        patch()
