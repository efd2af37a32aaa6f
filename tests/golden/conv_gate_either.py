"""conv.py with the 0.14-0.18 gate (written for rocmfix's tests)."""


class Conv3dLayer(CustomOp):
    def forward_cuda(self, x):
        if self.enable_linear and (is_torch_equal("2.9.0") or is_torch_equal("2.9.1")):
            return self._forward_mulmat(x)
        return self._forward_conv(x)
