"""A model class that makes its own session, as older table code does (written for the tests)."""

from onnxruntime import InferenceSession, SessionOptions


class OrtInferSession:
    def __init__(self, config):
        self.session = InferenceSession(
            config["model_path"],
            sess_options=SessionOptions(),
            providers=["CPUExecutionProvider"],
        )

    def __call__(self, feeds):
        return self.session.run(None, feeds)
