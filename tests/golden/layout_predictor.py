"""A layout predictor in the shape of MinerU's (written for rocmfix's tests): the whole
detector called once per batch, under torch.no_grad()."""
import torch


class PPDocLayoutV2LayoutModel:
    def __init__(self, model, device):
        self.model = model
        self.device = device

    def batch_predict(self, images):
        results = []
        with torch.no_grad():
            for image in images:
                batch = torch.stack([image]).to(self.device)
                outputs = self.model(pixel_values=batch)
                results.append(outputs.logits.cpu())
        return results


class Other:
    def run(self, x):
        y = self.model(pixel_values=x)
        return y
