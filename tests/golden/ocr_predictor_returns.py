"""A predictor that returns its model's output straight away (written for rocmfix's tests)."""
import torch


class TinyPredictor:
    def __init__(self, net):
        self.net = net

    def __call__(self, batch):
        with torch.inference_mode():
            return self.net(torch.as_tensor(batch))
