"""A conv layer module in sglang's shape: GEMM when kernel == stride (for rocmfix's tests)."""
import torch.nn.functional as F


class Conv3dLayer:
    def _forward_mulmat(self, x):
        return F.linear(x.flatten(1), self.weight.flatten(1), self.bias)

    def forward_cuda(self, x):
        if self.enable_linear:
            return self._forward_mulmat(x)
        return F.conv3d(x, self.weight, self.bias, self.stride)
