"""A patch embed in sglang's up-to-0.5.9 shape (written for rocmfix's tests)."""
import torch
from torch import nn
# rocmfix: rocmfix_patch_embed was dropped here by rocmfix; revert removes it
try:
    from .rocmfix_patch_embed import triton_conv3d_patchify
except Exception:  # the kernel must never break the model's import: the stock op
    def triton_conv3d_patchify(x, weight, bias=None):
        import torch.nn.functional as F
        return F.conv3d(x, weight, bias, stride=tuple(weight.shape[2:]))


class Qwen2VisionPatchEmbed(nn.Module):
    def __init__(self, p=14, t=2, c=3, dim=64):
        super().__init__()
        self.patch_size, self.temporal_patch_size, self.embed_dim = p, t, dim
        ks = [t, p, p]
        self.proj = nn.Conv3d(c, dim, kernel_size=ks, stride=ks, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x = x.view(n, -1, self.temporal_patch_size, self.patch_size, self.patch_size)
        # rocmfix: Conv3d with kernel == stride is a GEMM; MIOpen has no fast kernel
        return triton_conv3d_patchify(x, self.proj.weight, self.proj.bias).view(n, self.embed_dim)
