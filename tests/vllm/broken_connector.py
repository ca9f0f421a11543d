"""A deliberately broken connector for the oracle test: the reference connector with the
finished-request watermark fix (vLLM PR #54288) switched off in code, loaded by module path."""

from kvoffload.vllm.connector import KVOffloadConnector


class WatermarkOffConnector(KVOffloadConnector):
    def choose_fixes(self, configured):
        return configured.without("final_token_watermark")


class CrashOnFirstCompletionConnector(KVOffloadConnector):
    """Dies like a connector with a broken assert: the run must stop there and say so."""

    def update_connector_output(self, connector_output) -> None:
        if connector_output.kv_connector_worker_meta is not None:
            raise AssertionError("planted: completion bookkeeping broke")
        super().update_connector_output(connector_output)


class FenceRemovedConnector(KVOffloadConnector):
    """The reference with the worker fence removed: a store whose source blocks are handed to
    another request in this step is not waited for before the forward."""

    def register_kv_caches(self, kv_caches) -> None:
        super().register_kv_caches(kv_caches)
        self.worker.handler.wait = lambda job_ids: None
