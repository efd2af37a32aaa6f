"""Golden input for transformers-eager-mask-graphs: written for rocmfix's tests, the shapes of
a mask helper's constants."""

import torch


def eager_mask(mask, dtype=torch.float32):
    low = torch.finfo(dtype).min
    # a number sent to the mask's device on each call: rewritten
    # rocmfix: the mask's constant made on the device, not copied from the host: a graph can hold it
    mask = torch.where(mask, torch.full((), 0.0, device=mask.device, dtype=dtype), low)
    # rocmfix: the mask's constant made on the device, not copied from the host: a graph can hold it
    shift = torch.full((), -1, device=mask.device)  # rewritten too
    host = torch.tensor(0.0, dtype=dtype)  # on the host: no copy, stays
    values = torch.tensor([0.0, 1.0], device=mask.device)  # not a number: stays
    return mask + shift + host + values[0]
