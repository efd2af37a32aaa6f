"""The call inside an expression: not a form rocmfix rewrites (written for rocmfix's tests)."""


class VllmAsyncEngineVlmClient:
    def __init__(self, vllm_async_llm):
        self.vocab = len(vllm_async_llm.tokenizer.get_lora_tokenizer())
