"""vllm.LLM end to end with KVOffloadConnector: two rounds of the same prompts, the prefix cache
reset between them, so round two's hits can only come from the connector's host tier.

Run as a script (vLLM spawns its engine core, which re-imports __main__). Prints one line,
``ROUND_TRIP {json}``, among vLLM's own output.
"""

import json
import sys

if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from kvoffload.vllm.build import TINY_MODEL_DIR

    kv = KVTransferConfig(kv_connector="KVOffloadConnector", kv_connector_module_path="kvoffload.vllm.connector",
                          kv_role="kv_both", kv_connector_extra_config={
                              "cpu_bytes_to_use": 64 << 20, "block_size": 64, "offload_prompt_only": False})
    # CPU attention needs GPU blocks of a multiple of 32 tokens; chunks here are 2 blocks.
    llm = LLM(model=str(TINY_MODEL_DIR), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              block_size=32, enforce_eager=True, enable_prefix_caching=True, kv_transfer_config=kv, max_model_len=512,
              gpu_memory_utilization=0.5)
    prompts = [TokensPrompt(prompt_token_ids=[100 + 7 * i + j for j in range(96)]) for i in range(4)]
    params = SamplingParams(max_tokens=32, ignore_eos=True, detokenize=False, temperature=0)
    first = llm.generate(prompts, params, use_tqdm=False)
    llm.reset_prefix_cache()
    second = llm.generate(prompts, params, use_tqdm=False)
    sys.stdout.write("ROUND_TRIP ")
    json.dump({"cached_first": [o.num_cached_tokens for o in first],
               "cached_second": [o.num_cached_tokens for o in second],
               "same_output": [a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(first, second)]},
              sys.stdout)
    print()
