"""A deliberately broken connector for the oracle test: the reference connector with the
finished-request watermark fix (vLLM PR #54288) switched off in code, loaded by module path."""

from kvoffload.vllm.connector import KVOffloadConnector


class WatermarkOffConnector(KVOffloadConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        if self.core is not None:
            self.core.fixes = self.core.fixes.without("final_token_watermark")


class CrashOnFirstCompletionConnector(KVOffloadConnector):
    """Dies like a connector with a broken assert: the run must stop there and say so."""

    def update_connector_output(self, connector_output) -> None:
        if connector_output.kv_connector_worker_meta is not None:
            raise AssertionError("planted: completion bookkeeping broke")
        super().update_connector_output(connector_output)
