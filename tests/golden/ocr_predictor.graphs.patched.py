"""A text predictor in the shape of PaddleOCR's ports (written for rocmfix's tests): the model
is ``self.net``, called under inference mode, once per path."""
import numpy as np
import torch

# rocmfix: rocmfix_graphs was dropped here by rocmfix; revert removes it
try:
    from .rocmfix_graphs import forward as _rocmfix_graph_forward
except (ImportError, OSError):
    _rocmfix_graph_forward = None


class TinyPredictor:
    def __init__(self, net, device="cpu"):
        self.net = net.eval()
        self.device = device

    def __call__(self, batch):
        with torch.inference_mode():
            inp = torch.from_numpy(np.ascontiguousarray(batch)).to(self.device)
            # rocmfix: CUDA/HIP graph replay per input shape (rocmfix_graphs)
            if _rocmfix_graph_forward is not None:
                outputs = _rocmfix_graph_forward(self.net, inp)  # the whole batch at once
            else:
                outputs = self.net(inp)  # the whole batch at once
        return outputs["maps"].cpu().numpy()

    def one_by_one(self, images):
        found = []
        for image in images:
            with torch.inference_mode():

                # rocmfix: CUDA/HIP graph replay per input shape (rocmfix_graphs)
                if _rocmfix_graph_forward is not None:
                    scores = _rocmfix_graph_forward(self.net, torch.from_numpy(image[None]).to(self.device))
                else:
                    scores = self.net(torch.from_numpy(image[None]).to(self.device))
            found.append(scores)
        return found

    def features(self, batch):
        # Part of the model: not the forward the rewrite replays.
        return self.net.backbone(torch.from_numpy(batch))
