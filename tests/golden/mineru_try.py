"""A hand-made try/except guard (written for rocmfix's tests)."""


class VllmAsyncEngineVlmClient:
    def __init__(self, vllm_async_llm):
        try:
            self.tokenizer = vllm_async_llm.tokenizer.get_lora_tokenizer()
        except AttributeError:
            self.tokenizer = vllm_async_llm.tokenizer
