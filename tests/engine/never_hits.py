"""A connector for engine stories: present (so the engine defers block frees as vLLM does with a
connector) but it never has a hit. Tests subclass it to count or script one call."""

from __future__ import annotations


class NeverHits:
    def on_new_request(self, req) -> None:
        pass

    def get_num_new_matched_tokens(self, req, num_local):
        return 0, False

    def update_state_after_alloc(self, req, block_ids, num_external_tokens) -> None:
        pass

    def request_finished(self, req, block_ids=()) -> bool:
        return False
