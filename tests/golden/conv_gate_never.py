"""conv.py edited to always call the conv (written for rocmfix's tests)."""


class Conv3dLayer(CustomOp):
    def forward_cuda(self, x):
        return self._forward_conv(x)
