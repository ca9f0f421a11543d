"""A documented cost model: modelled seconds per engine step on a named hardware profile.

step time = max(compute, load transfer) + flush transfer

- compute = step_overhead (one pass over the weights) + prefill tokens x prefill cost per token
  + decoding sequences x decode cost per sequence;
- loads overlap the forward (asynchronous DMA), so only the part longer than compute counts;
- flushed stores are waited on before the forward (host-blocking), so their transfer adds up.
Normal stores overlap the next step and are free in this model.

Profile numbers (h100-llama3-8b; sources in notes/anchors-benchmarking.md §5):
- weights 16 GB read per step at 3.35 TB/s HBM3 -> 4.8 ms step overhead;
- prefill 2 x 8e9 FLOP per token at ~50% of 989 TFLOP/s dense bf16 -> 32 us per token;
- decode: KV reads of a ~2k-token context, 128 KiB per token at 3.35 TB/s -> ~80 us per sequence;
- PCIe Gen5 x16 measured ~50 GB/s per direction (vLLM blog), KV 128 KiB per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.core.types import ConfigError


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    step_overhead_s: float
    prefill_s_per_token: float
    decode_s_per_seq: float
    link_bytes_per_s: float
    kv_bytes_per_token: int

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, load_tokens: int, flush_tokens: int) -> float:
        compute = (self.step_overhead_s + prefill_tokens * self.prefill_s_per_token
                   + decode_seqs * self.decode_s_per_seq)
        load = load_tokens * self.kv_bytes_per_token / self.link_bytes_per_s
        flush = flush_tokens * self.kv_bytes_per_token / self.link_bytes_per_s
        return max(compute, load) + flush


PROFILES: dict[str, HardwareProfile] = {
    "h100-llama3-8b": HardwareProfile("h100-llama3-8b", 4.8e-3, 32e-6, 80e-6, 50e9, 131072),
    # Same link; 4.8 TB/s HBM3e makes the weight pass and KV reads cheaper.
    "h200-llama3-8b": HardwareProfile("h200-llama3-8b", 3.3e-3, 32e-6, 56e-6, 50e9, 131072),
}


def profile(name: str) -> HardwareProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown profile {name!r} (known: {', '.join(PROFILES)})") from None
