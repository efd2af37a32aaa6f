"""An async engine client in the shape mineru-vl-utils 0.1.1-0.1.13 had (written for tests)."""


class VllmAsyncEngineVlmClient:
    def __init__(self, vllm_async_llm, max_tokens=16384):
        self.vllm_async_llm = vllm_async_llm
        if vllm_async_llm.tokenizer is None:
            raise ValueError("vllm_async_llm.tokenizer is None.")
        self.tokenizer = vllm_async_llm.tokenizer.get_lora_tokenizer()
        self.model_max_length = vllm_async_llm.model_config.max_model_len
