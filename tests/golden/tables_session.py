"""A table-session factory in the shape rocmfix's table patch knows (written for the tests)."""

import os

import onnxruntime as ort


def cpu_providers():
    return [("CPUExecutionProvider", {})]


def table_ort_session(model_path, *, sess_options=None):
    opts = sess_options or ort.SessionOptions()
    providers = cpu_providers()
    if "CUDAExecutionProvider" in ort.get_available_providers():
        providers = ["CUDAExecutionProvider", *providers]
    try:
        session = ort.InferenceSession(model_path, sess_options=opts, providers=providers)
    except Exception:
        session = ort.InferenceSession(model_path, sess_options=opts, providers=cpu_providers())
    print(os.getpid(), session.get_providers())
    return session
