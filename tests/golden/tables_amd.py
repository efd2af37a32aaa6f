"""A table-session factory that already asks for MIGraphX (written for the tests)."""

import onnxruntime as ort


def table_ort_session(model_path):
    wanted = ["MIGraphXExecutionProvider", "CPUExecutionProvider"]
    return ort.InferenceSession(model_path, providers=wanted)
