"""A client that never asks for a LoRA tokenizer (written for rocmfix's tests)."""


class VllmAsyncEngineVlmClient:
    def __init__(self, vllm_async_llm):
        self.tokenizer = vllm_async_llm.get_tokenizer()
