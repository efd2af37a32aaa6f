"""A video tubelet embed: Conv3d with kernel == stride over a whole clip, not pre-cut patches
(written for rocmfix's tests)."""

from torch import nn


class VisionPatchEmbed(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        kernel = (config.tubelet_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_chans, config.hidden_size, kernel_size=kernel, stride=kernel)

    def forward(self, pixel_values_videos):
        return self.proj(pixel_values_videos).flatten(2).transpose(1, 2)
