"""A model class whose session comes from a shared factory (written for the tests)."""

from .runtime import table_ort_session


class OrtInferSession:
    def __init__(self, config):
        self.session = table_ort_session(config["model_path"])
