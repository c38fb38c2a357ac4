"""The examples' math written in torch (float64), the oracle of the CPU tier."""

import torch

EPS = 1e-7


def giou_terms(pred, target):
    """1 - GIoU per box pair (torchvision's, intersection clamped at 0)."""
    ix1 = torch.maximum(pred[..., 0], target[..., 0])
    iy1 = torch.maximum(pred[..., 1], target[..., 1])
    ix2 = torch.minimum(pred[..., 2], target[..., 2])
    iy2 = torch.minimum(pred[..., 3], target[..., 3])
    inter = (ix2 - ix1).clamp(min=0) * (iy2 - iy1).clamp(min=0)
    area1 = (pred[..., 2] - pred[..., 0]) * (pred[..., 3] - pred[..., 1])
    area2 = (target[..., 2] - target[..., 0]) * (target[..., 3] - target[..., 1])
    union = area1 + area2 - inter
    iou = inter / (union + EPS)
    cw = torch.maximum(pred[..., 2], target[..., 2]) - torch.minimum(pred[..., 0], target[..., 0])
    ch = torch.maximum(pred[..., 3], target[..., 3]) - torch.minimum(pred[..., 1], target[..., 1])
    areac = cw * ch
    return 1 - (iou - (areac - union) / (areac + EPS))


def masked_mean(per, valid):
    """sum(per where valid) / max(count(valid), 1), the mask broadcast to `per` first."""
    valid = valid.expand_as(per)
    return torch.where(valid, per, torch.zeros_like(per)).sum() / max(int(valid.sum()), 1)


def smooth_l1_terms(pred, target, beta=1.0):
    d = pred - target
    ad = d.abs()
    return torch.where(ad < beta, 0.5 * d * d / beta, ad - 0.5 * beta)


def focal(logits, targets, alpha=0.25, gamma=2):
    p = torch.sigmoid(logits)
    ce = logits.clamp(min=0) - logits * targets + torch.log(1 + torch.exp(-logits.abs()))
    p_t = p * targets + (1 - p) * (1 - targets)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (alpha_t * ce * (1 - p_t) ** gamma).mean()


def softmax_xent(logits, targets):
    return (-(targets * torch.log_softmax(logits, -1)).sum(-1)).mean()


def lengths_mask(lengths, n):
    return torch.arange(n)[None, :] < lengths[:, None].long()


def philox_uniform(seed, shape):
    """kfuse's `rand_like` of a tensor of `shape` keyed by `seed`, written out: Philox-4x32-10
    of the counter (the element's flat index, low and high words, 0, 0) under the key (the
    seed's low and high words); output word 0's top 24 bits times 2^-24 (float64, exact)."""
    m32 = 0xFFFFFFFF
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    out = []
    for i in range(int(torch.Size(shape).numel())):
        c = [i & m32, i >> 32, 0, 0]
        k = [s & m32, s >> 32]
        for r in range(10):
            if r:
                k = [(k[0] + 0x9E3779B9) & m32, (k[1] + 0xBB67AE85) & m32]
            p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
            c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & m32, (p0 >> 32) ^ c[3] ^ k[1], p0 & m32]
        out.append((c[0] >> 8) / 2**24)
    return torch.tensor(out, dtype=torch.float64).reshape(shape)
