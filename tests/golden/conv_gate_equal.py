"""conv.py with the 0.11.1-0.13 gate (written for rocmfix's tests)."""


class Conv3dLayer(CustomOp):
    def forward_cuda(self, x):
        if self.enable_linear and is_torch_equal("2.9.0"):
            return self._forward_mulmat(x)
        return self._forward_conv(x)
