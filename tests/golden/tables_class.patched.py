"""A model class that makes its own session, as older table code does (written for the tests)."""

from onnxruntime import InferenceSession, SessionOptions

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


class OrtInferSession:
    def __init__(self, config):
        self.session = _rocmfix_table_session(
            InferenceSession,
            config["model_path"],
            sess_options=SessionOptions(),
            providers=["CPUExecutionProvider"],
        )

    def __call__(self, feeds):
        return self.session.run(None, feeds)
