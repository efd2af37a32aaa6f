"""A table-session factory in the shape rocmfix's table patch knows (written for the tests)."""

import os

import onnxruntime as ort

# rocmfix: tables ask for MIGraphX, then ROCm, where onnxruntime lists them (issue 42)
def _rocmfix_table_session(session_type, model_path, *args, **kwargs):
    """MinerU's table session with the AMD providers first; slanet-plus keeps MinerU's
    (it crashes MIGraphX: AMDMIGraphX#5078). Any failure here is MinerU's own call."""
    stock = kwargs.get("providers")
    asked = stock
    name = str(model_path)
    try:
        import os
        import onnxruntime

        name = os.path.basename(name)
        setting = os.environ.get("MINERU_TABLE_DEVICE", "").strip().lower()
        if "slanet" not in name.lower() and setting not in ("cpu", "cuda"):
            rest = list(stock) if stock else ["CPUExecutionProvider"]
            have = [p if isinstance(p, str) else p[0] for p in rest]
            available = onnxruntime.get_available_providers()
            amd = ["MIGraphXExecutionProvider", "ROCMExecutionProvider"]
            first = [p for p in amd if p in available and p not in have]
            asked = first + rest if first else stock
    except Exception:
        asked = stock
    try:
        from loguru import logger as log
    except Exception:
        import logging

        log = logging.getLogger("rocmfix")
    if asked is stock:
        session = session_type(model_path, *args, **kwargs)
    else:
        try:
            session = session_type(model_path, *args, **dict(kwargs, providers=asked))
        except Exception as exc:
            log.warning("rocmfix: table model %s: %s failed (%s); MinerU's own providers"
                        % (name, asked[0], exc))
            session = session_type(model_path, *args, **kwargs)
    try:
        log.info("rocmfix: table model %s runs on %s" % (name, session.get_providers()))
    except Exception:
        pass
    return session


def cpu_providers():
    return [("CPUExecutionProvider", {})]


def table_ort_session(model_path, *, sess_options=None):
    opts = sess_options or ort.SessionOptions()
    providers = cpu_providers()
    if "CUDAExecutionProvider" in ort.get_available_providers():
        providers = ["CUDAExecutionProvider", *providers]
    try:
        session = _rocmfix_table_session(ort.InferenceSession, model_path, sess_options=opts, providers=providers)
    except Exception:
        session = ort.InferenceSession(model_path, sess_options=opts, providers=cpu_providers())
    print(os.getpid(), session.get_providers())
    return session
