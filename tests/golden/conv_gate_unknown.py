"""conv.py with a gate rocmfix has never seen (written for rocmfix's tests)."""


class Conv3dLayer(CustomOp):
    def forward_cuda(self, x):
        if self.enable_linear and current_platform.has_fast_gemm():
            return self._forward_mulmat(x)
        return self._forward_conv(x)
