"""A text predictor in the shape of PaddleOCR's ports (written for rocmfix's tests): the model
is ``self.net``, called under inference mode, once per path."""
import numpy as np
import torch


class TinyPredictor:
    def __init__(self, net, device="cpu"):
        self.net = net.eval()
        self.device = device

    def __call__(self, batch):
        with torch.inference_mode():
            inp = torch.from_numpy(np.ascontiguousarray(batch)).to(self.device)
            outputs = self.net(inp)  # the whole batch at once
        return outputs["maps"].cpu().numpy()

    def one_by_one(self, images):
        found = []
        for image in images:
            with torch.inference_mode():

                scores = self.net(torch.from_numpy(image[None]).to(self.device))
            found.append(scores)
        return found

    def features(self, batch):
        # Part of the model: not the forward the rewrite replays.
        return self.net.backbone(torch.from_numpy(batch))
