"""The hasattr guard upstream shipped from 0.1.14 (written for rocmfix's tests)."""


class VllmAsyncEngineVlmClient:
    def __init__(self, vllm_async_llm):
        tokenizer = vllm_async_llm.tokenizer
        if hasattr(tokenizer, "get_lora_tokenizer"):
            tokenizer = tokenizer.get_lora_tokenizer()
        self.tokenizer = tokenizer
