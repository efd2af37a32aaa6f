"""conv.py with the gate of 0.19 and later (written for rocmfix's tests)."""


class Conv3dLayer(CustomOp):
    def forward_cuda(self, x):
        if self.enable_linear and is_torch_equal_or_newer("2.9.0"):
            return self._forward_mulmat(x)
        return self._forward_conv(x)
