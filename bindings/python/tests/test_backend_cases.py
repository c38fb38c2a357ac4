"""``torch.compile(fn, backend="kfuse")`` on the losses, activations and blocks models train with:
torchvision's box losses and sigmoid focal loss, cross-entropy (labels, ignore_index, label
smoothing, class weights, probabilities), smooth L1, Huber, BCE with logits, softmax and
log-softmax, GELU / SiLU / SwiGLU MLP blocks of ``nn.Linear``, ``nn.TransformerEncoderLayer``,
the padded-batch GIoU loss with a per-image box count and the toy detector's training step, each
on odd sizes: the forward outputs and every gradient (of the inputs and of the parameters)
against eager PyTorch in float32, and something of each fused. Dropout in training mode is
random: it is checked statistically (the keep rate, the scale of the kept values, a gradient
that follows the mask; more in test_backend_dropout.py). CPU tier: the fused regions run in kfuse's interpreter."""

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kfuse
from kfuse import _backend
from test_backend import SEED, _check, _randn

try:  # torchvision.ops is the reference of the box losses and the focal loss
    import torchvision.ops as tv_ops
except ImportError:  # the cases that call it skip, saying so
    tv_ops = None


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _fused_since(before):
    return _backend.stats["compiles"] + _backend.stats["reused"] > before


def _fused_count():
    return _backend.stats["compiles"] + _backend.stats["reused"]


# ---------------------------------------------------------------------------------------------
# Inputs.


def _box_pair(gen, *lead):
    """Target boxes (x1, y1, x2, y2) and predictions near them, both valid (x1 < x2, y1 < y2),
    some overlapping their target and some not."""
    xy = torch.rand(*lead, 2, generator=gen) * 4
    target = torch.cat([xy, xy + 0.5 + torch.rand(*lead, 2, generator=gen) * 3], -1)
    pred = target + 0.6 * torch.randn(*lead, 4, generator=gen)
    pred[..., 2:] = torch.maximum(pred[..., 2:], pred[..., :2] + 0.1)
    return [pred, target]


def _labels(gen, n, classes, ignore=None, every=None):
    """int64 class labels; every `every`-th one is `ignore` (the rows cross-entropy skips)."""
    y = torch.randint(0, classes, (n,) if isinstance(n, int) else n, generator=gen)
    if ignore is not None:
        y.view(-1)[::every] = ignore
    return y


def _probs(gen, *shape):
    return torch.softmax(2 * torch.randn(*shape, generator=gen), -1)


def _padded_boxes(gen, batch, slots):
    """A padded batch as the seed's dataset gives it: per image a count of boxes (0 to `slots`,
    some images empty and one full), the boxes in the first slots, zeros after."""
    lengths = torch.randint(0, slots + 1, (batch,), generator=gen)
    lengths[0], lengths[-1] = 0, slots
    pred, target = _box_pair(gen, batch, slots)
    valid = torch.arange(slots)[None, :] < lengths[:, None]
    target = torch.where(valid[..., None], target, torch.zeros(()))
    return pred, target, lengths


# ---------------------------------------------------------------------------------------------
# The functions, as users write them.


def tv_generalized_box_iou_loss(pred, target):
    return tv_ops.generalized_box_iou_loss(pred, target, reduction="mean")


def tv_distance_box_iou_loss(pred, target):
    return tv_ops.distance_box_iou_loss(pred, target, reduction="sum")


def tv_complete_box_iou_loss(pred, target):
    # reduction "none": a loss per box (the "mean" one is in test_backend_norm).
    return tv_ops.complete_box_iou_loss(pred, target, reduction="none")


def tv_sigmoid_focal_loss(logits, targets):
    return tv_ops.sigmoid_focal_loss(logits, targets, alpha=0.25, gamma=2.0, reduction="mean")


def cross_entropy_labels(logits, labels):
    return F.cross_entropy(logits, labels)


def cross_entropy_ignore_smoothing(logits, labels):
    return F.cross_entropy(logits, labels, ignore_index=5, label_smoothing=0.15)


def cross_entropy_spatial_weighted(logits, labels, weight):
    """Classes on axis 1 of [B, C, L] logits (a segmentation's), class weights, ignored labels."""
    return F.cross_entropy(logits, labels, weight=weight, ignore_index=-100)


def cross_entropy_weighted_smoothing(logits, labels, weight):
    """Class weights (gathered per label from the expanded weights), an ignored label, smoothing."""
    return F.cross_entropy(logits, labels, weight=weight, ignore_index=3, label_smoothing=0.1)


def layer_norm_summed(x, w, b):
    """A layer norm summed into the loss: the backward's upstream gradient is the scalar's
    expand, whose sums over the rows are the weight and bias gradients."""
    return F.layer_norm(x, (x.shape[-1],), w, b).sum()


def nan_to_num_of_log(x):
    """NaN (the log of a negative) replaced (`nan_to_num`); its backward masks with a product of
    bools."""
    return torch.nan_to_num(x.log(), nan=0.5, posinf=7.0, neginf=-7.0).mean()


def max_min_along_axes(x):
    """`max(dim)` and `min(dim)` (values and indices) of a computed value: `amax` and `argmax`,
    and in the backward a scatter of each value's gradient to its index."""
    h = torch.tanh(x) * 2
    v, i = h.max(-1)
    return v.mean() + h.min(0).values.sum() + i.float().mean() + h.max(1, keepdim=True)[0].sum()


def rows_with_any_hit(x, hits):
    """The mean square of the rows where any element is a hit (`any` along an axis of a bool
    mask, and over a whole tensor)."""
    keep = hits.any(-1) & hits.any()
    return torch.where(keep, x.square().mean(-1), torch.zeros(())).sum() / keep.sum().clamp(min=1)


def reductions_of_expands(x):
    """Sums, means, maxima and counts of values PyTorch expands (a repeat's sum, a mean loss's
    gradient summed into a bias): computed on the value itself, the sum times the axis's size."""
    n, m = x.shape
    wide = x[:, None, :].expand(n, 5, m)
    counts = (x > 0)[None].expand(3, n, m).sum(0)
    return (x.expand(3, n, m).sum(0) * wide.amax(1) + wide.mean((0, 1), keepdim=True) * counts + wide.sum((1, 2))[:, None]).pow(2).mean()


def crops_and_rolls_of_expands(x):
    """A pad whose gradient crops a broadcast value (the sum's upstream gradient), and a roll and
    a flip of an expanded row statistic: along the axes it is broadcast on, nothing moves."""
    n, m = x.shape
    s = x.sum(-1, keepdim=True).expand(n, m)
    return F.pad(x, (1, 2)).sum(-1).pow(2).sum() + (s.roll(2, -1).flip(0) * x).sin().mean() + F.pad(x, (1, -1)).cos().sum()


def roll_and_flip(x):
    """Cyclic shifts along one and two axes (a shifted window's roll) and flips: gathers at
    positions computed from iota; their backwards are the opposite roll and the same flip."""
    return (x.roll(3, -1) * x.flip(0) + x.roll((1, -2), (0, 1)) * 2 + x.flip((0, 1)).sin()).pow(2).mean()


def index_select_and_embedding(x, rows, table, ids):
    """Rows of `x` picked along its middle axis (`index_select`, and `x[:, idx]` with negative
    indices counting from the end) and an embedding lookup by 1-D ids, each scaled and summed:
    gathers whose index is broadcast over the other axes (their backwards' index_put and
    embedding_dense_backward stay PyTorch's)."""
    picked = torch.index_select(x, 1, rows).sin() * 2
    indexed = x[:, rows - 9].cos()  # the same rows, counted from the end
    looked_up = F.embedding(ids, table) * 3
    return picked.square().mean() + (indexed * picked).mean() + looked_up.tanh().sum()


def nan_ignoring_and_sign_ops(x, y, k):
    """fmax/fmin (a NaN operand gives the other), signbit (of -0.0 too), square, clip, shifts of
    integers and unary plus, in one loss."""
    holes = torch.where(y > 1.0, torch.full_like(y, float("nan")), y)
    picked = torch.fmax(x, holes) + torch.fmin(x * 0.5, holes) * 0.25
    signed = torch.where(torch.signbit(x * 0), -1.0, 1.0)  # x * 0 is -0.0 where x < 0
    shifted = ((k << 2) >> 1).to(x.dtype)
    return (picked.square() * signed + torch.clip(+x, -0.5, 0.75) * shifted).mean()


def hinge_embedding(x, y):
    """PyTorch's rule makes an `empty` tensor for its shape alone (`full_like(empty, 1.0)`)."""
    return F.hinge_embedding_loss(x, y, margin=0.7)


def cross_entropy_probs(logits, probs):
    return F.cross_entropy(logits, probs, label_smoothing=0.05)


def bce_with_logits(logits, targets):
    return F.binary_cross_entropy_with_logits(logits, targets)


def bce_with_logits_weighted(logits, targets, weight, pos_weight):
    return F.binary_cross_entropy_with_logits(logits, targets, weight=weight, pos_weight=pos_weight, reduction="sum")


def smooth_l1_sum(pred, target):
    return F.smooth_l1_loss(pred, target, reduction="sum")  # beta 1


def huber_per_element(pred, target):
    return F.huber_loss(pred, target, reduction="none", delta=1.5)


def softmax_middle_axis(x):
    # With a temperature: a lone softmax is a region of one op, which stays in PyTorch.
    return F.softmax(x / 0.7, dim=1)


def log_softmax_last_axis(x):
    return F.log_softmax(x / 2.0, dim=-1)


def padded_giou_loss(pred, target, lengths, eps: float = 1e-7):
    """The seed's loss: 1 - GIoU (torchvision's, intersection clamped at 0) of [B, N, 4] boxes,
    the mean over each image's first `lengths[b]` boxes (the padding is left out)."""
    x1, y1, x2, y2 = pred.unbind(-1)
    a1, b1, a2, b2 = target.unbind(-1)
    inter = (torch.min(x2, a2) - torch.max(x1, a1)).clamp(min=0) * (torch.min(y2, b2) - torch.max(y1, b1)).clamp(min=0)
    union = (x2 - x1) * (y2 - y1) + (a2 - a1) * (b2 - b1) - inter
    iou = inter / (union + eps)
    hull = (torch.max(x2, a2) - torch.min(x1, a1)) * (torch.max(y2, b2) - torch.min(y1, b1))
    loss = 1 - (iou - (hull - union) / (hull + eps))
    valid = torch.arange(pred.shape[1], device=pred.device)[None, :] < lengths[:, None]
    return torch.where(valid, loss, 0).sum() / valid.sum().clamp(min=1)


def slices_and_selects(x):
    # A slice of a middle axis, a select of the first, a transpose: their backwards are
    # slice_scatter, select_scatter and the transpose back.
    return (x[:, 1:5, :].exp() * x[0, 2:6, :]).transpose(-1, -2).sum(-1)


def strided_last_axis(x):
    return x[..., ::2].sigmoid() + x[..., 1:2] * x[..., -1:]


def permuted_attention_scores(q, k):
    # Scores scaled and softmaxed across a permuted layout, then weighted: no matmul, all views.
    return torch.softmax(q.permute(0, 2, 1) * 0.5, dim=-1) * k


def heads_softmax(x):
    # Attention's head views: the embedding split into heads, a softmax over each head's columns
    # in the heads-first layout, then the heads merged again.
    b, s, e = x.shape
    q = x.view(b, s, 4, e // 4).transpose(1, 2)
    return (q.softmax(-1) * 2).transpose(1, 2).reshape(b, s, e)


def pixel_shuffle_sigmoid(x):
    return F.pixel_shuffle(x, 2).sigmoid()


def flatten_normalize(x):
    return F.normalize(x.flatten(1), dim=-1) * 3


def grouped_rows_norm(x):
    # A group norm written with views: the channels' groups as rows, normalised, viewed back.
    n, c = x.shape[:2]
    g = x.view(n, 4, -1)
    mu = g.mean(-1, keepdim=True)
    var = g.var(-1, unbiased=False, keepdim=True)
    return ((g - mu) * torch.rsqrt(var + 1e-5)).view_as(x)


def select_middle_axis(x, w):
    return (x.select(1, 2) * w).tanh() + x[:, -1].square()


def boxes_cxcywh_l1(pred, target):
    # Centre and size to corners along the last axis (a cat of two 2-wide parts), then an L1 loss.
    xy, wh = pred[..., :2], pred[..., 2:]
    return (torch.cat([xy - wh / 2, xy + wh / 2], dim=-1) - target).abs().mean()


def cat_middle_axis(a, b):
    return torch.softmax(torch.cat([a, b * 2], dim=1), dim=-1) * 3


def loss_and_accuracy(logits, labels):
    # A metric beside the loss: the argmax per row is an i64 with no gradient.
    hits = (logits.argmax(dim=-1) == labels).float().mean()
    lows = logits.argmin(dim=0, keepdim=True).float().mean()
    # The flat index of the largest logit (torch's argmax over every element).
    top = logits.argmax().float() / 1000
    return F.cross_entropy(logits, labels) * (1 + hits) + lows + top


def cosine_embedding(a, b):
    # torch.linalg.vector_norm (ord 2) through cosine_similarity, rows of zeros included (the norm
    # clamped at eps), and F.normalize's.
    return (1 - F.cosine_similarity(a, b, dim=-1)).mean() + (F.normalize(a, dim=-1) * b).sum(-1).square().mean()


def norms_of_every_order(x):
    # The vector norm's other orders: 1, infinity (the largest magnitude), -infinity, 3.
    v = torch.linalg.vector_norm
    return v(x, 1, -1) + v(x, math.inf, -1) * v(x, -math.inf, 0).sum() + v(x, 3.0, -1)


def kl_div_distill(student, teacher):
    # KL divergence against a teacher's probabilities with exact zeros: xlogy's decomposition (a
    # NaN constant, the text's 0/0) and its zero branch. The teacher gets no gradient: at its
    # zeros PyTorch's own is NaN.
    p = torch.softmax(teacher, -1) * (teacher > -1)
    p = p / p.sum(-1, keepdim=True)
    return F.kl_div(F.log_softmax(student, -1), p, reduction="batchmean")


def logsumexp_with_infinities(x):
    # torch.logsumexp's decomposition tests the row maximum against infinity.
    return torch.logsumexp(x.masked_fill(x > 1.5, -math.inf), dim=-1) * 2


def gated_halves(h):
    # A gated MLP's `chunk` of a 48-wide axis: halves of 24 (static sizes above 16, which the text
    # writes as constants where slices and cats give them), and the cat of the backward.
    a, b = h.chunk(2, dim=-1)
    return F.silu(a) * b


def split_sizes(x):
    a, b, c = x.split([20, 20, 9], dim=-1)
    return (a.exp() * b).sum(-1) + c.square().mean(-1)


def fmod_hypot_copysign(x, y):
    # torch.fmod (the dividend's sign), torch.hypot and torch.copysign, Tensor and Scalar overloads,
    # with torch's gradients: fmod's divisor gets -trunc(a / b), copysign's sign operand none.
    t = torch.fmod(x * 3, y + 2.5) + torch.fmod(y, -0.75) + torch.hypot(x, y) * torch.copysign(x, y)
    return (t + torch.copysign(y, -1.0)).square().mean()


def special_functions(x):
    # torch.lgamma, torch.digamma and torch.erfinv, and torch.special's names of them (which
    # decompose to them), with torch's gradients: digamma's is polygamma(1, x), kfuse's trigamma.
    # A polygamma(1, x) of a detached value is a trigamma of the forward alone. The arguments stay
    # away from the poles (0 and the negative integers) and from erfinv's ±1.
    t = torch.lgamma(x.abs() + 0.5) + torch.digamma(x.abs() + 0.7) * 0.3 + torch.erfinv(torch.tanh(x) * 0.8)
    t = t + torch.special.gammaln(-0.3 - torch.tanh(x.abs()) * 0.4) * torch.special.psi(x * 0.1 + 2.0)
    t = t * torch.special.polygamma(1, x.detach().abs() + 1.0) + torch.special.erfinv(x * 0.05)
    return t.square().mean()


def erfc_and_its_tail(x):
    # torch.erfc and torch.special.erfc (which decomposes to it), with torch's gradient
    # -2/sqrt(pi) exp(-x^2). The second term reaches erfc's tail (arguments from 3 on), where
    # 1 - erf(x) is 0 in float32 but erfc is not (erfc(4.5) is about 2e-10): scaled into view, each
    # element held to the tolerance.
    t = torch.erfc(x) * (torch.special.erfc(-x * 0.5) + 1.0)
    return t + torch.special.erfc(x.abs() + 3.0) * 1e8


def _zero_rows(t, *rows):
    t = t.clone()
    t[list(rows)] = 0
    return t


# name -> (function, inputs(gen) as a list, which inputs get gradients)
CASES = {
    "gated_halves": (gated_halves, lambda g: [_randn(g, 7, 48)], (0,)),
    "split_sizes": (split_sizes, lambda g: [_randn(g, 9, 49)], (0,)),
    "cosine_embedding": (cosine_embedding, lambda g: [_zero_rows(_randn(g, 13, 37), 3), _randn(g, 13, 37)], (0, 1)),
    "norms_of_every_order": (norms_of_every_order, lambda g: [_randn(g, 11, 29)], (0,)),
    "kl_div_distill": (kl_div_distill, lambda g: [_randn(g, 17, 23) * 2, _randn(g, 17, 23) * 2], (0,)),
    "logsumexp_with_infinities": (logsumexp_with_infinities, lambda g: [_randn(g, 19, 31)], (0,)),
    "loss_and_accuracy": (loss_and_accuracy, lambda g: [_randn(g, 37, 13) * 2, _labels(g, 37, 13)], (0,)),
    "boxes_cxcywh_l1": (boxes_cxcywh_l1, lambda g: [_randn(g, 3, 17, 4), _randn(g, 3, 17, 4)], (0, 1)),
    "cat_middle_axis": (cat_middle_axis, lambda g: [_randn(g, 5, 3, 7), _randn(g, 5, 4, 7)], (0, 1)),
    "slices_and_selects": (slices_and_selects, lambda g: [_randn(g, 3, 7, 5)], (0,)),
    "strided_last_axis": (strided_last_axis, lambda g: [_randn(g, 4, 9)], (0,)),
    "permuted_attention_scores": (permuted_attention_scores, lambda g: [_randn(g, 2, 5, 6), _randn(g, 2, 6, 5)], (0, 1)),
    "heads_softmax": (heads_softmax, lambda g: [_randn(g, 3, 7, 64)], (0,)),
    "pixel_shuffle_sigmoid": (pixel_shuffle_sigmoid, lambda g: [_randn(g, 2, 8, 3, 5)], (0,)),
    "flatten_normalize": (flatten_normalize, lambda g: [_randn(g, 5, 3, 7)], (0,)),
    "grouped_rows_norm": (grouped_rows_norm, lambda g: [_randn(g, 2, 8, 5, 3) * 2 + 1], (0,)),
    "select_middle_axis": (select_middle_axis, lambda g: [_randn(g, 5, 4, 11), _randn(g, 11)], (0, 1)),
    "tv_generalized_box_iou_loss": (tv_generalized_box_iou_loss, lambda g: _box_pair(g, 37), (0, 1)),
    "tv_distance_box_iou_loss": (tv_distance_box_iou_loss, lambda g: _box_pair(g, 5, 13), (0, 1)),
    "tv_complete_box_iou_loss": (tv_complete_box_iou_loss, lambda g: _box_pair(g, 29), (0, 1)),
    "tv_sigmoid_focal_loss": (
        tv_sigmoid_focal_loss,
        lambda g: [_randn(g, 13, 29) * 2, torch.rand(13, 29, generator=g)],  # soft targets: both gradients
        (0, 1),
    ),
    "cross_entropy_labels": (cross_entropy_labels, lambda g: [_randn(g, 37, 13) * 2, _labels(g, 37, 13)], (0,)),
    "cross_entropy_ignore_smoothing": (
        cross_entropy_ignore_smoothing,
        lambda g: [_randn(g, 37, 29) * 2, _labels(g, 37, 29, ignore=5, every=4)],
        (0,),
    ),
    "cross_entropy_spatial_weighted": (
        cross_entropy_spatial_weighted,
        lambda g: [_randn(g, 3, 7, 13) * 2, _labels(g, (3, 13), 7, ignore=-100, every=5), torch.rand(7, generator=g) + 0.5],
        (0,),  # torch gives no gradient of the class weights
    ),
    "cross_entropy_weighted_smoothing": (
        cross_entropy_weighted_smoothing,
        lambda g: [_randn(g, 37, 11) * 2, _labels(g, 37, 11, ignore=3, every=6), torch.rand(11, generator=g) + 0.5],
        (0,),
    ),
    "cross_entropy_probs": (cross_entropy_probs, lambda g: [_randn(g, 29, 13) * 2, _probs(g, 29, 13)], (0, 1)),
    "layer_norm_summed": (layer_norm_summed, lambda g: [_randn(g, 13, 37) * 2 + 1, _randn(g, 37), _randn(g, 37)], (0, 1, 2)),
    "nan_to_num_of_log": (nan_to_num_of_log, lambda g: [_randn(g, 11, 29)], (0,)),
    "max_min_along_axes": (max_min_along_axes, lambda g: [_randn(g, 9, 13)], (0,)),
    "roll_and_flip": (roll_and_flip, lambda g: [_randn(g, 5, 7)], (0,)),
    "reductions_of_expands": (reductions_of_expands, lambda g: [_randn(g, 7, 11)], (0,)),
    "crops_and_rolls_of_expands": (crops_and_rolls_of_expands, lambda g: [_randn(g, 7, 11)], (0,)),
    "index_select_and_embedding": (
        index_select_and_embedding,
        lambda g: [
            _randn(g, 5, 9, 3),
            torch.tensor([8, 0, 3, 3, 5]),
            _randn(g, 11, 6),
            torch.randint(0, 11, (7,), generator=g),
        ],
        (0, 2),
    ),
    "rows_with_any_hit": (rows_with_any_hit, lambda g: [_randn(g, 11, 9), torch.rand(11, 9, generator=g) < 0.08], (0,)),
    "nan_ignoring_and_sign_ops": (
        nan_ignoring_and_sign_ops,
        lambda g: [_randn(g, 13, 29), _randn(g, 13, 29), torch.randint(-5, 6, (13, 29), generator=g)],
        (0, 1),
    ),
    "hinge_embedding": (hinge_embedding, lambda g: [_randn(g, 13, 7), torch.randint(0, 2, (13, 7), generator=g) * 2.0 - 1], (0,)),
    "bce_with_logits": (bce_with_logits, lambda g: [_randn(g, 13, 37) * 3, torch.rand(13, 37, generator=g)], (0, 1)),
    "bce_with_logits_weighted": (
        bce_with_logits_weighted,
        lambda g: [_randn(g, 13, 37) * 3, torch.rand(13, 37, generator=g), torch.rand(37, generator=g), torch.rand(37, generator=g) * 3],
        (0, 1),  # torch gives no gradient of `weight` or `pos_weight`
    ),
    "smooth_l1_sum": (smooth_l1_sum, lambda g: [_randn(g, 13, 29) * 2, _randn(g, 13, 29)], (0, 1)),
    "huber_per_element": (huber_per_element, lambda g: [_randn(g, 3, 13, 29) * 2, _randn(g, 3, 13, 29)], (0, 1)),
    "softmax_middle_axis": (softmax_middle_axis, lambda g: [_randn(g, 5, 13, 7) * 3], (0,)),
    "log_softmax_last_axis": (log_softmax_last_axis, lambda g: [_randn(g, 29, 37) * 3], (0,)),
    "padded_giou_loss": (padded_giou_loss, lambda g: list(_padded_boxes(g, 5, 13)), (0, 1)),
    "fmod_hypot_copysign": (fmod_hypot_copysign, lambda g: [_randn(g, 13, 29), _randn(g, 13, 29)], (0, 1)),
    "special_functions": (special_functions, lambda g: [_randn(g, 13, 29)], (0,)),
    "erfc_and_its_tail": (erfc_and_its_tail, lambda g: [_randn(g, 13, 29)], (0,)),
}


def _case(name):
    """`CASES[name]`'s function, its inputs (seeded) and the indices of those it differentiates;
    a torchvision case skips without torchvision."""
    if name.startswith("tv_") and tv_ops is None:
        pytest.skip("torchvision is not installed")
    fn, make, wrt = CASES[name]
    return fn, make(torch.Generator().manual_seed(SEED)), wrt


# torchvision writes the boxes' intersection through a boolean mask; PyTorch's own backward of
# that write warns so under torch.compile with every backend.
@pytest.mark.filterwarnings("ignore:Error detected in IndexPutBackward0")
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_with_gradients(name):
    fn, inputs, wrt = _case(name)
    before = _fused_count()
    _check(name, fn, inputs, wrt, torch.compile(fn, backend=_backend.backend))
    # Something of every case is fused (the programs come from kfuse, compiled or reused).
    assert _fused_since(before), f"{name}: no region was fused"


@pytest.mark.filterwarnings("ignore:Error detected in IndexPutBackward0")
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_under_dynamic_shapes_at_two_batch_sizes(name):
    # Every size a symbol (dynamic=True), then fewer rows of the inputs that share the first
    # input's leading size: the same programs, eager's values.
    fn, inputs, wrt = _case(name)
    lead = inputs[0].shape[0]
    compiled = torch.compile(fn, backend=_backend.backend, dynamic=True)
    for rows in (lead, max(2, lead - 3)):
        part = [t[:rows] if t.dim() and t.shape[0] == lead else t for t in inputs]
        _check(f"{name} dynamic, {rows} rows", fn, part, wrt, compiled)


@pytest.mark.filterwarnings("ignore:Error detected in IndexPutBackward0")
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_float64(gpu, name):
    # GPU tier: the CUDA kernels of every case against eager in float64 on the same inputs.
    fn, inputs, wrt = _case(name)
    inputs = [t.to(gpu) for t in inputs]
    _check(name, fn, inputs, wrt, torch.compile(fn, backend=_backend.backend), rtol=1e-4, atol=1e-5,
           reference_dtype=torch.float64)


WHOLE = [
    "cross_entropy_labels",
    "cross_entropy_ignore_smoothing",
    "cross_entropy_probs",
    # Class weights: each label's weight gathered from the weights PyTorch expands over the rows.
    "cross_entropy_spatial_weighted",
    "cross_entropy_weighted_smoothing",
    # Sums of PyTorch's expands (a scalar loss's upstream gradient); products of bools.
    "layer_norm_summed",
    "nan_to_num_of_log",
    "hinge_embedding",
    "nan_ignoring_and_sign_ops",
    # max and min along an axis (values and indices), their gradients scattered to the indices.
    "max_min_along_axes",
    # roll and flip: gathers at positions computed with iota.
    "roll_and_flip",
    # Reductions, crops, rolls and flips of values PyTorch expands, without their copies.
    "reductions_of_expands",
    "crops_and_rolls_of_expands",
    # any along an axis and over every element of a bool mask: a count that is not 0.
    "rows_with_any_hit",
    "softmax_middle_axis",
    "log_softmax_last_axis",
    # Slices, selects and permutes on any axis, and their scatters back in the backward.
    "slices_and_selects",
    "strided_last_axis",
    "permuted_attention_scores",
    "select_middle_axis",
    # Views that split and merge axes of static size: attention's heads, flatten, groups of
    # channels as rows. (pixel_shuffle's first view regroups leading axes only: PyTorch's view.)
    "heads_softmax",
    "flatten_normalize",
    "grouped_rows_norm",
    # cat along any axis, and the slices of its backward.
    "boxes_cxcywh_l1",
    "cat_middle_axis",
    # argmax and argmin along an axis and over every element, beside a loss.
    "loss_and_accuracy",
    # chunk of a wide axis: slices and a cat of sizes above 16.
    "gated_halves",
    # Vector norms of every order (torch's decomposition), NaN and infinities as constants.
    "cosine_embedding",
    "norms_of_every_order",
    "kl_div_distill",
    "logsumexp_with_infinities",
    # fmod, hypot and copysign, and their backwards (a truncated quotient, a masked ratio).
    "fmod_hypot_copysign",
    # lgamma, digamma, erfinv and polygamma(1, x) (trigamma), and the backwards that call them.
    "special_functions",
    # erfc (torch.special's name too) and its backward.
    "erfc_and_its_tail",
]


@pytest.mark.parametrize("name", WHOLE)
def test_softmax_and_cross_entropy_leave_nothing_to_pytorch(name):
    # softmax and log_softmax lower along any axis; cross-entropy's pick of each row's label is a
    # gather, and its backward puts the gradient back with a one-index scatter.
    fn, make, wrt = CASES[name]
    inputs = [t.requires_grad_(i in wrt) for i, t in enumerate(make(torch.Generator().manual_seed(SEED)))]
    report = kfuse.explain(fn, *inputs)
    assert not report.fallbacks, str(report)
    # The backward fused too: a region of its own, or (a scalar loss) the gradients computed with the
    # loss in the forward's region and scaled in the backward.
    assert {"forward", "backward"} <= {k.graph for k in report.kernels} | set(report.scaled_gradients), str(report)


def test_index_select_and_embedding_are_gathers_in_the_forward():
    fn, inputs, wrt = _case("index_select_and_embedding")
    inputs = [t.requires_grad_(i in wrt) for i, t in enumerate(inputs)]
    report = kfuse.explain(fn, *inputs)
    fused = {op for k in report.kernels if k.graph == "forward" for op in k.ops}
    assert {"aten.index_select.default", "aten.index.Tensor", "aten.embedding.default"} <= fused, str(report)
    assert not [f for f in report.fallbacks if f.graph == "forward"], str(report)


@pytest.mark.parametrize("case", ["centered", "softmax_dim0", "group_norm"])
def test_a_reduction_used_again_along_other_axes_than_the_last_is_fused(case):
    # kfuse stores a reduction along other axes than the last once and reads it back (a stage of
    # its own), so such reductions are fused at any size, and the result is eager's.
    gen = torch.Generator().manual_seed(SEED)
    if case == "centered":
        fn, inputs, small = (lambda x: (x - x.mean(0)).square().sum(-1)), [_randn(gen, 131, 7)], [_randn(gen, 37, 7)]
    elif case == "softmax_dim0":
        fn, inputs, small = (lambda x: torch.softmax(2 * x, 0) + 1), [_randn(gen, 131, 7)], [_randn(gen, 37, 7)]
    else:
        fn, inputs, small = _affine(nn.GroupNorm(2, 8)), [_randn(gen, 3, 8, 5, 7)], [_randn(gen, 3, 8, 2, 2)]
    for x in (inputs, small):
        x = [t.requires_grad_() for t in x]
        torch._dynamo.reset()
        report = kfuse.explain(fn, *x)
        # Group norm's decomposition views its statistics through `as_strided`: a reshape.
        assert not report.fallbacks, str(report)
        assert {"forward", "backward"} <= {k.graph for k in report.kernels} | set(report.scaled_gradients), str(report)
        torch._dynamo.reset()
        got = torch.compile(fn, backend=_backend.backend)(*x)
        torch.testing.assert_close(got, fn(*x), rtol=1e-5, atol=1e-6)
        (gx,) = torch.autograd.grad(got.sum(), x)
        (wx,) = torch.autograd.grad(fn(*x).sum(), x)
        torch.testing.assert_close(gx, wx, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["batch_norm", "group_norm", "layer_norm_chw"])
def test_the_norms_statistics_read_their_input_once(name):
    # A mean's variance is reduced by the mean's own parts: the first part's kernel computes both
    # (two passes over each row, kept in registers), so the forward reads its input once for its
    # statistics, not once for the mean and again for the variance.
    module = {
        "batch_norm": lambda: nn.BatchNorm2d(24),
        "group_norm": lambda: nn.GroupNorm(4, 24),
        "layer_norm_chw": lambda: nn.LayerNorm((24, 18, 19)),
    }[name]()
    x = _randn(torch.Generator().manual_seed(SEED), 17, 24, 18, 19)
    torch._dynamo.reset()
    report = kfuse.explain(module, x)
    forward = [s for k in report.kernels if k.graph == "forward" for s in k.shapes]
    assert any("2 row reduction phase(s)" in s for s in forward), str(report)


def test_a_norm_over_trailing_static_axes_reduces_them_as_one_row():
    # A layer norm over (C, H, W): H and W are written as constants, so kfuse reduces each
    # sample's H x W positions as one row (then C), not one axis per kernel; the batch and C stay
    # symbols (a new batch size compiles nothing).
    module = nn.LayerNorm((24, 18, 19))
    x = _randn(torch.Generator().manual_seed(SEED), 17, 24, 18, 19).requires_grad_()
    torch._dynamo.reset()
    report = kfuse.explain(module, x)
    assert not report.fallbacks, str(report)
    forward = [k for k in report.kernels if k.graph == "forward"]
    assert len(forward) == 1 and "f32[N0, N1, 18, 19]" in forward[0].source, str(report)
    # The statistics in two kernels (rows of 18 x 19, then of C), the normalised values in one.
    assert len(forward[0].shapes) == 3, str(report)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=_backend.backend)
    _check_module("layer norm over (C, H, W)", module, [x.detach()], compiled)


def test_an_as_strided_is_lowered_only_where_it_is_a_reshape():
    gen = torch.Generator().manual_seed(SEED)
    x = _randn(gen, 6, 12)
    reshaped = lambda x: (x * 2).as_strided((3, 2, 3, 4), (24, 12, 4, 1)).sum(-1) + 1  # noqa: E731
    transposed = lambda x: (x * 2).as_strided((12, 6), (1, 12)) + 1  # noqa: E731
    for fn, left in ((reshaped, False), (transposed, True)):
        torch._dynamo.reset()
        report = kfuse.explain(fn, x)
        reasons = [f.reason for f in report.fallbacks if f.op == "aten.as_strided.default"]
        assert bool(reasons) == left, str(report)
        assert all("that is not a reshape" in r for r in reasons), str(report)
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fn, backend=_backend.backend)(x), fn(x), rtol=1e-6, atol=1e-6)


def test_a_reduction_read_back_in_a_kernel_over_other_rows_is_stored_once():
    # No reduction here is over more than 64 elements, but the batch's mean of the rows' sums is
    # read back at each element of a kernel over [16, 8]: 16 x 8 elements again per element. The
    # kernels' own count (`Kernel::recomputed`) makes the planner store it once, so the region is
    # fused.
    def fn(x):
        r = x.sum(-1)
        return x * r.mean(0, keepdim=True)[..., None]

    x = _randn(torch.Generator().manual_seed(SEED), 16, 8, 8)
    report = kfuse.explain(fn, x)
    assert not report.fallbacks, str(report)
    assert any((k.kernels or 0) >= 2 for k in report.kernels), str(report)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend=_backend.backend)(x), fn(x), rtol=1e-5, atol=1e-6)


def test_a_view_that_regroups_leading_axes_only_is_left_to_pytorch_with_its_reason():
    # pixel_shuffle's first view splits the channels and keeps each row of width as it is:
    # PyTorch gives it without a copy, and the region reads the rows it gives. Its second view
    # merges the last axes: kfuse's reshape, inside the region.
    fn, make, wrt = CASES["pixel_shuffle_sigmoid"]
    inputs = [t.requires_grad_(i in wrt) for i, t in enumerate(make(torch.Generator().manual_seed(SEED)))]
    report = kfuse.explain(fn, *inputs)
    reasons = [f.reason for f in report.fallbacks]
    assert reasons and all("regroups leading axes only" in r for r in reasons), str(report)
    texts = [k.source for k in report.kernels]
    assert any("reshape(" in t for t in texts), str(report)


def test_scatter_of_several_indices_falls_back_with_reason():
    def top2_mask(x, idx):
        return torch.zeros_like(x).scatter(-1, idx, 1.0) * x.exp()

    gen = torch.Generator().manual_seed(SEED)
    x, idx = _randn(gen, 7, 13), torch.randint(0, 13, (7, 2), generator=gen)
    report = kfuse.explain(top2_mask, x, idx)
    reasons = [f.reason for f in report.fallbacks if "scatter" in f.op]
    assert reasons and all("more than one index" in r for r in reasons), str(report)
    assert report.kernels, str(report)  # the rest is fused
    torch.testing.assert_close(torch.compile(top2_mask, backend="kfuse")(x, idx), top2_mask(x, idx), rtol=1e-5, atol=1e-6)


def test_erfc_keeps_its_tail_where_one_minus_erf_is_zero():
    def fn(x):
        return torch.special.erfc(x) * 2.0

    x = torch.tensor([0.0, 1.0, -2.0, 4.5, 5.0, 9.0])
    assert torch.equal((1 - torch.erf(x))[3:], torch.zeros(3))  # the cancellation erfc avoids
    report = kfuse.explain(fn, x)
    assert not report.fallbacks and any("erfc(" in k.source for k in report.kernels), str(report)
    got = torch.compile(fn, backend="kfuse")(x)
    # torch.erfc in float64: erfc(0), erfc(1), erfc(-2), erfc(4.5), erfc(5), erfc(9), times 2.
    want = 2.0 * torch.tensor(
        [1.0, 0.15729920705028513, 1.9953222650189528, 1.9661604415428876e-10, 1.537459794428035e-12, 4.13703174651381e-37],
        dtype=torch.float64,
    )
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)


def test_polygamma_of_another_order_than_one_is_left_to_pytorch_with_its_reason():
    def fn(x):
        return torch.special.polygamma(2, x.abs() + 1.0) * x.exp() + torch.special.polygamma(1, x.abs() + 1.0)

    x = _randn(torch.Generator().manual_seed(SEED), 7, 13)
    report = kfuse.explain(fn, x)
    reasons = [f.reason for f in report.fallbacks if "polygamma" in f.op]
    assert reasons and all("order 2" in r for r in reasons), str(report)
    assert any("trigamma(" in k.source for k in report.kernels), str(report)  # order 1 is fused
    torch.testing.assert_close(torch.compile(fn, backend="kfuse")(x), fn(x), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Modules: the gradients of their parameters too.


class GeluMLP(nn.Module):
    """A transformer's MLP: Linear, GELU, Linear, and the residual."""

    def __init__(self, d, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class SiluMLP(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.silu(self.fc1(x)))


class SwiGLU(nn.Module):
    """LLaMA's MLP: w2(silu(w1 x) * w3 x), no biases."""

    def __init__(self, d, hidden):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _encoder_layer():
    # dropout 0: deterministic, so that it compares with eager elementwise.
    return nn.TransformerEncoderLayer(d_model=15, nhead=3, dim_feedforward=29, dropout=0.0, batch_first=True)


def _affine(module):
    """`module` with its affine parameters drawn away from their ones and zeros (so that a
    gradient that mixes them up shows)."""
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        module.bias.uniform_(-0.5, 0.5)
    return module


# name -> (module(), inputs(gen))
MODULES = {
    "gelu_mlp": (lambda: GeluMLP(29, 37), lambda g: [_randn(g, 3, 13, 29)]),
    "silu_mlp": (lambda: SiluMLP(29, 37), lambda g: [_randn(g, 3, 13, 29)]),
    "swiglu_mlp": (lambda: SwiGLU(29, 37), lambda g: [_randn(g, 3, 13, 29)]),
    "transformer_encoder_layer": (_encoder_layer, lambda g: [_randn(g, 3, 13, 15)]),
    "group_norm": (lambda: _affine(nn.GroupNorm(4, 12)), lambda g: [_randn(g, 3, 12, 5, 7) * 2 + 1]),
}


def _module_grads(module, inputs, upstream):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = module(*inputs)
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * upstream).sum(), inputs + params)
    return out.detach(), grads


def _check_module(name, module, inputs, compiled, rtol=1e-5, atol=1e-6):
    """`compiled` (the module compiled) against the module in eager: the output, the gradients
    of the inputs, then of each parameter (in `named_parameters` order)."""
    names = [f"input {i}" for i in range(len(inputs))] + [n for n, p in module.named_parameters() if p.requires_grad]
    with torch.no_grad():
        shape = module(*inputs).shape
    upstream = torch.randn(shape, generator=torch.Generator().manual_seed(SEED + 1))
    got, got_grads = _module_grads(compiled, inputs, upstream)
    want, want_grads = _module_grads(module, inputs, upstream)
    msg = f"{name} (seed {SEED})"
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{msg}, output: {m}")
    assert len(got_grads) == len(want_grads) == len(names)
    for what, g, w in zip(names, got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=lambda m, what=what: f"{msg}, grad of {what}: {m}")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_matches_eager_with_parameter_gradients(name):
    make_module, make_inputs = MODULES[name]
    torch.manual_seed(SEED)
    module = make_module()
    inputs = make_inputs(torch.Generator().manual_seed(SEED))
    before = _fused_count()
    _check_module(name, module, inputs, torch.compile(module, backend=_backend.backend))
    assert _fused_since(before), f"{name}: no region was fused"


@pytest.mark.parametrize("dims", [(13, 6), (5, 3, 7, 9)], ids=["1d", "2d"])
def test_batch_norm_in_training_mode_matches_eager_with_its_running_statistics(dims):
    # Training-mode batch norm is decomposed with PyTorch's own rule (statistics over every axis
    # but the channels, the running statistics updated functionally): fused, forward and
    # backward, and the module's running mean and variance end where eager's do.
    torch.manual_seed(SEED)
    module = (nn.BatchNorm1d if len(dims) == 2 else nn.BatchNorm2d)(dims[1])
    module.weight.data.uniform_(0.5, 1.5)
    module.bias.data.uniform_(-0.5, 0.5)
    eager, compiled_module, reference = copy.deepcopy(module), copy.deepcopy(module), copy.deepcopy(module)
    gen = torch.Generator().manual_seed(SEED)
    inputs = [_randn(gen, *dims) * 2 + 1]
    report = kfuse.explain(copy.deepcopy(module), *[t.clone().requires_grad_() for t in inputs])
    assert not [f for f in report.fallbacks if "batch_norm" in str(f.op)], str(report)
    # The backward fused too: a region of its own, or (a scalar loss) the gradients computed with the
    # loss in the forward's region and scaled in the backward.
    assert {"forward", "backward"} <= {k.graph for k in report.kernels} | set(report.scaled_gradients), str(report)
    compiled = torch.compile(compiled_module, backend=_backend.backend)
    for step in range(2):
        inputs = [_randn(gen, *dims) * 2 + 1]
        _check_module(f"batch_norm {dims} step {step}", eager, inputs, compiled)
        # The compiled module ran one forward a step, as `reference` does here (the check runs
        # the eager module twice): the same running statistics.
        reference(*inputs)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            got, want = getattr(compiled_module, name), getattr(reference, name)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_batch_norm_under_dynamic_shapes_computes_its_correction_in_the_kernel():
    # With a symbolic batch, the running variance's correction n / (n - 1) is Python arithmetic
    # on sizes (sym_numel, truediv, sub) in the graph: lowered as kfuse arithmetic on `size`, so
    # the normalisation and the statistics' update stay one region, and each new batch size reuses
    # it. The means over the batch (of a size known at run time), used again at every element, are
    # stored once by kernels of their own, in the same region.
    torch.manual_seed(SEED)
    module = nn.BatchNorm2d(6)
    module.weight.data.uniform_(0.5, 1.5)
    compiled_module, reference = copy.deepcopy(module), copy.deepcopy(module)
    gen = torch.Generator().manual_seed(SEED)
    x = (_randn(gen, 3, 6, 5, 7) * 2 + 1).requires_grad_()
    torch._dynamo.mark_dynamic(x, 0)
    report = kfuse.explain(copy.deepcopy(module), x)
    assert not report.fallbacks, str(report)
    assert any("<built-in function truediv>" in k.ops for k in report.kernels if k.graph == "forward"), str(report)
    compiled = torch.compile(compiled_module, backend=_backend.backend, dynamic=True)
    for batch in (3, 5, 2):
        x = (_randn(gen, batch, 6, 5, 7) * 2 + 1).requires_grad_()
        got = compiled(x)
        (gx,) = torch.autograd.grad(got.square().sum(), [x])
        xr = x.detach().clone().requires_grad_()
        want = reference(xr)
        (wx,) = torch.autograd.grad(want.square().sum(), [xr])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m, b=batch: f"batch {b}: {m}")
        torch.testing.assert_close(gx, wx, rtol=1e-4, atol=1e-5, msg=lambda m, b=batch: f"batch {b}: {m}")
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(compiled_module, name), getattr(reference, name), rtol=1e-5, atol=1e-6,
                                       msg=lambda m, n=name, b=batch: f"batch {b}, {n}: {m}")


def test_group_norm_under_a_dynamic_batch_fuses_its_views_and_compiles_no_program_for_a_new_batch():
    # Group norm's decomposition views [N, C, H, W] as [N, G, C / G, H * W] and its statistics
    # through `as_strided`: with the batch a size known only at run time, the static axes around
    # it still split and merge (written as constants), and each `as_strided` of a contiguous
    # tensor is a reshape, so nothing is left to PyTorch and a new batch compiles nothing.
    torch.manual_seed(SEED)
    module = nn.GroupNorm(4, 24)
    module.weight.data.uniform_(0.5, 1.5)
    module.bias.data.uniform_(-0.5, 0.5)
    gen = torch.Generator().manual_seed(SEED)
    x = (_randn(gen, 17, 24, 18, 19) * 2 + 1).requires_grad_()
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.reset()
    report = kfuse.explain(copy.deepcopy(module), x)
    assert not report.fallbacks, str(report)
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(module), backend=_backend.backend, dynamic=True)
    compiles = None
    for batch in (3, 5, 2):
        x = _randn(gen, batch, 24, 18, 19) * 2 + 1
        _check_module(f"group_norm batch {batch}", module, [x], compiled, rtol=1e-4, atol=1e-5)
        if compiles is None:
            compiles = _backend.stats["compiles"]
    assert _backend.stats["compiles"] == compiles


@pytest.mark.parametrize("dynamic", [False, True])
def test_instance_norm_fuses_its_statistics_and_matches_eager(dynamic):
    # nn.InstanceNorm2d: batch norm without running statistics over [1, N * C, H, W], its weight
    # repeated N times; kfuse computes the statistics and the normalization, PyTorch the views.
    torch.manual_seed(SEED)
    module = nn.InstanceNorm2d(8, affine=True)
    module.weight.data.uniform_(0.5, 1.5)
    module.bias.data.uniform_(-0.5, 0.5)
    gen = torch.Generator().manual_seed(SEED)
    x = (_randn(gen, 37, 8, 5, 7) * 2 + 1).requires_grad_()
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.reset()
    report = kfuse.explain(copy.deepcopy(module), x)
    left = {f.op for f in report.fallbacks}
    assert left <= {"aten.view.default", "<built-in function mul>"}, str(report)
    assert {"forward", "backward"} <= {k.graph for k in report.kernels}, str(report)
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(module), backend=_backend.backend, dynamic=dynamic or None)
    for n in (37, 5) if dynamic else (37,):
        x = _randn(gen, n, 8, 5, 7) * 2 + 1
        _check_module(f"instance_norm batch {n}", module, [x], compiled, rtol=1e-4, atol=1e-4)


PADS = {
    "pad_last_axis": (lambda x: F.pad(x, (1, 2)) * 2, (5, 40)),
    "pad_two_axes_with_a_value": (lambda x: F.pad(x * 3, (2, 1, 1, 0), value=-1.5).sigmoid(), (3, 7, 20)),
    "pad_then_softmax": (lambda x: F.pad(x, (1, 1)).softmax(-1), (4, 17)),
    # A shift: one side padded, the other cropped by as much (the amounts sum to 0).
    "pad_one_side_crop_the_other": (lambda x: F.pad(x, (1, -1)) * 2 + F.pad(x, (-2, 2)), (5, 9)),
}


@pytest.mark.parametrize("name", sorted(PADS))
@pytest.mark.parametrize("dynamic", [False, True])
def test_constant_pads_and_their_crops_fuse_and_match_eager(name, dynamic):
    # F.pad in constant mode: a cat of columns of the value and the tensor; its backward pads by
    # the negated amounts, a slice that crops.
    fn, shape = PADS[name]
    gen = torch.Generator().manual_seed(SEED)
    x = _randn(gen, *shape).requires_grad_()
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.reset()
    report = kfuse.explain(fn, x)
    assert not report.fallbacks, str(report)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=_backend.backend, dynamic=dynamic or None)
    for n in (shape[0], shape[0] + 4) if dynamic else (shape[0],):
        _check(f"{name} batch {n}", fn, [_randn(gen, n, *shape[1:])], (0,), compiled)


# Functions whose graphs change once the batch is a size known only at run time (what Dynamo's
# automatic dynamic shapes make it after a second batch size): a mean's divisor computed in
# float64 from the batch (mse, smooth L1), a slice of a whole batch axis and its gradient
# (SwiGLU's halves), a sum over merged axes whose gradient views a broadcast value, a variance's
# correction from the batch as a float.
DYNAMIC_BATCH = {
    "mse_loss": (lambda a, b: F.mse_loss(a, b), lambda g, n: [_randn(g, n, 40), _randn(g, n, 40)]),
    "smooth_l1_loss": (lambda a, b: F.smooth_l1_loss(a, b), lambda g, n: [_randn(g, n, 4) * 2, _randn(g, n, 4)]),
    "swiglu": (lambda x: F.silu(x[:, :20]) * x[:, 20:], lambda g, n: [_randn(g, n, 40)]),
    "flatten_sum": (lambda x: (x * 2).flatten(1).sum(-1), lambda g, n: [_randn(g, n, 8, 5, 7)]),
    # The correction n / (n - 1) of a variance over the batch: the batch as a float.
    "var_std": (lambda x: x.var(-1).mean() + x.std(0).sum(), lambda g, n: [_randn(g, n, 40)]),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC_BATCH))
def test_a_dynamic_batch_leaves_nothing_to_pytorch_and_compiles_no_program_for_a_new_batch(name):
    fn, make = DYNAMIC_BATCH[name]
    gen = torch.Generator().manual_seed(SEED)
    inputs = [t.requires_grad_(i == 0) for i, t in enumerate(make(gen, 37))]
    for t in inputs:
        torch._dynamo.mark_dynamic(t, 0)
    torch._dynamo.reset()
    report = kfuse.explain(fn, *inputs)
    assert not report.fallbacks, str(report)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=_backend.backend, dynamic=True)
    compiles = None
    for n in (37, 5, 66):
        _check(f"{name} batch {n}", fn, make(gen, n), (0,), compiled, rtol=1e-5, atol=1e-6)
        if compiles is None:
            compiles = _backend.stats["compiles"]
    assert _backend.stats["compiles"] == compiles, f"{name}: a new batch compiled a program"


# ---------------------------------------------------------------------------------------------
# The seed's toy detector and its training step, scaled down: four conv blocks and two linear
# layers predicting `SLOTS` boxes per image, trained on the padded GIoU loss.

SLOTS = 13


class TinyDetector(nn.Module):
    """examples/ddp_giou.py's `Net` on 17x17 images (1x1 after the four pools) with a hidden
    width of 37: the same layers, small enough for the CPU tier."""

    def __init__(self, side=17, hidden=37):
        super().__init__()
        layers = []
        for i in range(4):
            layers += [nn.Conv2d(4**i, 4 ** (i + 1), 3, padding="same"), nn.MaxPool2d(2, 2), nn.ReLU()]
        self.conv_layers = nn.Sequential(*layers)
        self.features = 256 * (side // 16) ** 2
        self.lin1 = nn.Linear(self.features, hidden)
        self.lin2 = nn.Linear(hidden, SLOTS * 4)

    def forward(self, x):
        x = self.conv_layers(x.float())
        x = self.lin2(F.relu(self.lin1(x.view((-1, self.features)))))
        return x.view((-1, SLOTS, 4))


class DetectorLoss(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, images, target, lengths):
        return padded_giou_loss(self.net(images), target, lengths)


def _detector_batch(gen, batch, side=17):
    """uint8 images and, as the seed draws them, clip(floor(|N(0, 3)|)) boxes per image (at most
    SLOTS) of integer corners inside the image, padded with zeros."""
    images = torch.randint(0, 256, (batch, 1, side, side), dtype=torch.uint8, generator=gen)
    lengths = (torch.randn(batch, generator=gen) * 3).abs().floor().clamp(0, SLOTS).long()
    lengths[0] = SLOTS
    sizes = torch.randint(1, side, (batch, SLOTS, 2), generator=gen)
    top_left = torch.randint(0, side - 1, (batch, SLOTS, 2), generator=gen)
    boxes = torch.cat([top_left, (top_left + sizes).clamp(0, side - 1)], -1).float()
    valid = torch.arange(SLOTS)[None, :] < lengths[:, None]
    return images, torch.where(valid[..., None], boxes, torch.zeros(())), lengths


def test_detector_training_step_matches_eager():
    """Two SGD steps of the detector on the padded GIoU loss, compiled and eager side by side:
    the loss and every parameter's gradient agree at each step (the second step starts from the
    weights the first one updated)."""
    torch.manual_seed(SEED)
    eager = DetectorLoss(TinyDetector())
    fused = copy.deepcopy(eager)
    compiled = torch.compile(fused, backend=_backend.backend)
    opts = [torch.optim.SGD(m.parameters(), lr=1e-3) for m in (eager, fused)]
    gen = torch.Generator().manual_seed(SEED)
    before = _fused_count()
    for step in range(2):
        images, target, lengths = _detector_batch(gen, 5)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        want = eager(images, target, lengths)
        want.backward()
        got = compiled(images, target, lengths)
        got.backward()
        msg = f"detector step {step} (seed {SEED})"
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{msg}, loss: {m}")
        for (n, p), q in zip(fused.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{msg}, grad of {n}: {m}")
        for opt in opts:
            opt.step()
    assert _fused_since(before), "detector step: no region was fused"


# ---------------------------------------------------------------------------------------------
# Dropout in training mode: random, so checked statistically.

P = 0.3


def gelu_dropout(x, b):
    return F.dropout(F.gelu(x + b), p=P, training=True)


def test_dropout_in_training_mode_statistically():
    gen = torch.Generator().manual_seed(SEED)
    x, b = _randn(gen, 101, 203) * 0.7, _randn(gen, 203) * 0.5  # |x + b| < 5: gelu is never 0
    upstream = _randn(gen, 101, 203)
    compiled = torch.compile(gelu_dropout, backend=_backend.backend)
    before = _fused_count()

    def run():
        xs, bs = x.clone().requires_grad_(), b.clone().requires_grad_()
        out = compiled(xs, bs)
        return (out.detach(), *torch.autograd.grad((out * upstream).sum(), [xs, bs]))

    torch.manual_seed(SEED)
    out, gx, gb = run()
    assert _fused_since(before), "dropout: no region was fused"
    msg = f"dropout p={P} (seed {SEED})"
    # The same seed draws the same mask; another draw, another mask.
    torch.manual_seed(SEED)
    again = run()
    for a, w in zip(again, (out, gx, gb)):
        assert torch.equal(a, w), f"{msg}: the same seed gave other results"
    assert not torch.equal(run()[0] != 0, out != 0), f"{msg}: two draws gave the same mask"
    # The keep rate is 1 - p within 5 standard deviations, in all and per column (a mask is not
    # shared along an axis).
    h = F.gelu(x + b)
    assert (h != 0).all()
    kept = out != 0
    n = kept.numel()
    rate = kept.double().mean().item()
    assert abs(rate - (1 - P)) <= 5 * math.sqrt(P * (1 - P) / n), f"{msg}: keep rate {rate:.4f}"
    col = kept.double().mean(0)
    assert (col - (1 - P)).abs().max().item() <= 5 * math.sqrt(P * (1 - P) / kept.shape[0]), f"{msg}: a column's keep rate"
    # The kept values are eager's scaled by 1 / (1 - p), the dropped ones exactly 0.
    torch.testing.assert_close(out[kept], h[kept] / (1 - P), rtol=1e-5, atol=1e-6, msg=lambda m: f"{msg}, kept values: {m}")
    # The gradients are eager's through the same mask and scale, in float64 (b's sums 101 rows:
    # eager's float32 sum is further from it than kfuse's).
    xs, bs = x.double().requires_grad_(), b.double().requires_grad_()
    wx, wb = torch.autograd.grad((F.gelu(xs + bs) * (upstream.double() * kept / (1 - P))).sum(), [xs, bs])
    torch.testing.assert_close(gx.double(), wx, rtol=1e-5, atol=1e-6, msg=lambda m: f"{msg}, grad of x: {m}")
    torch.testing.assert_close(gb.double(), wb, rtol=1e-5, atol=5e-6, msg=lambda m: f"{msg}, grad of b: {m}")


# ---------------------------------------------------------------------------------------------
# What the forward stores for the backward.


def _saved(fn, inputs):
    """The tensors the forward graph hands to the backward under the backend's partition (the
    forward graph's outputs after the function's own), as (name, shape)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    saved = []

    def forward(gm, _):
        outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        saved.extend((o.name, tuple(o.meta["val"].shape)) for o in outs[1:] if "val" in o.meta)
        return make_boxed_func(gm)

    backend = aot_autograd(
        fw_compiler=forward,
        bw_compiler=lambda gm, _: make_boxed_func(gm),
        decompositions=kfuse._decomp.decompositions(),
        partition_fn=_backend._partition,
    )
    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend)(*inputs)
    out.backward(torch.ones_like(out))
    return saved


def test_the_forward_stores_no_row_sized_value_the_backward_can_recompute():
    # A cross-entropy's forward keeps its log-softmax for the backward under AOTAutograd's
    # default partition (a [B, C] write and read); kfuse's recomputes it in the backward's region
    # from the logits, which are saved anyway, so only labels, counts and per-row values remain.
    gen = torch.Generator().manual_seed(SEED)
    b, c = 37, 101
    logits, labels = _randn(gen, b, c).requires_grad_(), torch.randint(0, c, (b,), generator=gen)
    # Per-row losses (a tensor output, so the backward is not the scaled gradient of a scalar).
    saved = _saved(lambda x, y: F.cross_entropy(x, y, reduction="none", ignore_index=5, label_smoothing=0.15),
                   [logits, labels])
    big = [(name, shape) for name, shape in saved if math.prod(shape) >= b * c and not name.startswith("primals")]
    assert saved and not big, saved
    # The matmul of a Linear + GELU is stored (kfuse does not recompute it); GELU's input is the
    # matmul's output, so nothing else of its size is.
    lin = nn.Linear(64, 96)
    x = _randn(gen, 33, 64).requires_grad_()
    saved = _saved(lambda x: F.gelu(lin(x)), [x])
    names = [name for name, shape in saved if shape == (33, 96)]
    assert len(names) == 1 and "addmm" in names[0], saved
    # Summed into a loss, the GELU's backward joins the forward (the gradient at the matmul's
    # output, computed with the loss): that gradient is stored in the matmul's output's place.
    saved = _saved(lambda x: F.gelu(lin(x)).sum(), [x])
    names = [name for name, shape in saved if shape == (33, 96)]
    assert len(names) == 1 and "addmm" not in names[0], saved


def test_a_linear_block_on_3d_inputs_fuses_its_bias_gradients_and_copies_no_view():
    # nn.Linear on [B, T, D] views its input as [B*T, D]: under dynamic shapes that size is
    # `s0*s1`, a symbol of its own in the text, so the bias gradients (sums over those rows) are
    # fused; and no region writes a view (the transposes the backward's matmuls read) as a copy.
    torch.manual_seed(SEED)
    block = nn.Sequential(nn.Linear(24, 40), nn.GELU(), nn.Linear(40, 24))
    x = torch.randn(3, 5, 24, requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(x, 1)
    report = kfuse.explain(block, x)
    assert not [f for f in report.fallbacks if "computed from other sizes" in f.reason], str(report)
    views = {"aten.permute.default", "aten.t.default", "aten.transpose.int", "aten.view.default"}
    assert any("aten.sum.dim_IntList" in k.ops for k in report.kernels if k.graph == "backward"), str(report)
    for k in report.kernels:
        assert not set(k.ops) <= views, f"a region of views only: {k.ops}\n{report}"
    compiled = torch.compile(block, backend="kfuse", dynamic=True)
    for shape in [(3, 5, 24), (2, 9, 24), (4, 7, 24)]:
        x = torch.randn(*shape, requires_grad=True)
        got = compiled(x)
        got_grads = torch.autograd.grad(got.square().sum(), [x, *block.parameters()])
        want = block(x)
        want_grads = torch.autograd.grad(want.square().sum(), [x, *block.parameters()])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-6, msg=lambda m, s=shape: f"{s}: {m}")


def target_masked_giou_loss(pred, target):
    """The padded layout's loss: a box whose target y2 is 0 is padding."""
    valid = target[..., 3] != 0
    x1, y1, x2, y2 = pred.unbind(-1)
    a1, b1, a2, b2 = target.unbind(-1)
    inter = (torch.min(x2, a2) - torch.max(x1, a1)).clamp(min=0) * (torch.min(y2, b2) - torch.max(y1, b1)).clamp(min=0)
    union = (x2 - x1) * (y2 - y1) + (a2 - a1) * (b2 - b1) - inter
    loss = 1 - inter / (union + 1e-7)
    return torch.where(valid, loss, torch.zeros(())).sum() / valid.sum().clamp(min=1)


@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("fn", [padded_giou_loss, target_masked_giou_loss])
def test_a_sum_of_a_masked_value_skips_the_padding_and_keeps_eagers_values(fn, on_gpu, request):
    # `where(valid, loss, 0).sum()` is lowered as kfuse's masked sum of `loss` (the same value),
    # so the forward's kernel reads the boxes of valid positions only. The padding's predictions
    # here are NaN: the loss ignores them as eager's does, and the gradient there is eager's
    # (NaN, from 0 times the NaN terms of the padding).
    pred, target, lengths = _padded_boxes(torch.Generator().manual_seed(SEED), 6, 11)
    valid = torch.arange(11)[None, :] < lengths[:, None]
    pred = torch.where(valid[..., None], pred, torch.full((), float("nan")))
    args = (pred, target, lengths) if fn is padded_giou_loss else (pred, target)
    report = kfuse.explain(fn, pred.clone().requires_grad_(), *args[1:])
    forward = [k.source for k in report.kernels if k.graph == "forward"]
    assert any(", where: bool(" in s for s in forward), str(report)
    if on_gpu:
        device = request.getfixturevalue("gpu")
        pred, valid, args = pred.to(device), valid.to(device), tuple(a.to(device) for a in args)
    torch._dynamo.reset()
    got_pred, want_pred = pred.clone().requires_grad_(), pred.clone().requires_grad_()
    got = torch.compile(fn, backend="kfuse")(got_pred, *args[1:])
    want = fn(want_pred, *args[1:])
    assert torch.isfinite(want), "the data must give eager a finite loss"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    got.backward()
    want.backward()
    torch.testing.assert_close(got_pred.grad, want_pred.grad, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch.isnan(want_pred.grad).any() and torch.isfinite(want_pred.grad[valid]).all()


@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "gpu"])
def test_bias_gradients_are_column_sums_in_the_region_of_the_gradient_they_sum(on_gpu, request):
    # AOTAutograd writes a Linear's bias gradient as sum(grad, [0], keepdim=True) viewed as the
    # bias: kfuse sums over the leading axis as a split column reduction (the keepdim axis comes
    # back as a view), not as one thread per column looping over every row. The GELU's input
    # gradient and its bias gradient are one region: the views of the matmuls' results that no
    # fused op reads do not pull the sum into another region.
    torch.manual_seed(SEED)
    block = nn.Sequential(nn.Linear(24, 40), nn.GELU(), nn.Linear(40, 24))
    x = torch.randn(37, 24, requires_grad=True)
    report = kfuse.explain(block, x)
    backward = [k for k in report.kernels if k.graph == "backward"]
    shapes = [s for k in backward for s in k.shapes]
    assert sum("as columns" in s for s in shapes) == 2, str(report)
    assert not [s for s in shapes if s.startswith("[1, ")], str(report)
    assert any("aten.gelu.default" in k.ops and "aten.sum.dim_IntList" in k.ops for k in backward), str(report)
    if on_gpu:
        # On the GPU: the rows' kernel sums the bias gradient's columns as it stores the
        # gradient, and the column kernel folds those sums (at 4099 rows, odd).
        device = request.getfixturevalue("gpu")
        block = block.to(device)
        x = torch.randn(4099, 24, device=device, requires_grad=True)
    compiled = torch.compile(block, backend="kfuse")
    got = compiled(x)
    got_grads = torch.autograd.grad(got.square().sum(), [x, *block.parameters()])
    want = block(x)
    want_grads = torch.autograd.grad(want.square().sum(), [x, *block.parameters()])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        assert g.shape == w.shape and g.is_contiguous()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-6)


def test_a_column_sum_of_a_masked_value_stays_a_sum_of_the_where():
    # Over the leading axis alone, `where(m, v, 0).sum(0)` stays a sum of the `where` (no `where:`
    # reduction), which a row kernel can add as it goes beside its other work; over the last
    # axis it becomes the masked sum.
    def columns_and_rows(x, y):
        v = torch.where(y > 0, x * y, 0)
        return v.sum(0), v.sum(-1)

    gen = torch.Generator().manual_seed(SEED)
    x, y = _randn(gen, 33, 40), _randn(gen, 33, 40)
    report = kfuse.explain(columns_and_rows, x, y)
    lines = [line for k in report.kernels for line in k.source.splitlines() if "sum(" in line]
    assert any("axis: 0" in line and "where:" not in line for line in lines), lines
    assert any("axis: 1" in line and "where: bool(" in line for line in lines), lines
    got = torch.compile(columns_and_rows, backend="kfuse")(x, y)
    for g, w in zip(got, columns_and_rows(x, y)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_a_scalar_loss_is_computed_with_its_gradient_in_the_forward():
    # Cross-entropy's mean: the forward's region computes the loss and the logits' gradient at an
    # upstream gradient of 1 (one read of the logits), saves the gradient alone, and the backward
    # only scales it by the upstream gradient.
    gen = torch.Generator().manual_seed(SEED)
    b, c = 37, 101
    logits, labels = _randn(gen, b, c).requires_grad_(), torch.randint(0, c, (b,), generator=gen)
    saved = _saved(cross_entropy_ignore_smoothing, [logits, labels])
    assert [shape for _, shape in saved if math.prod(shape) >= b * c] == [(b, c)], saved
    report = kfuse.explain(cross_entropy_ignore_smoothing, logits, labels)
    assert not report.fallbacks and report.scaled_gradients == ["backward"], str(report)
    assert [k.graph for k in report.kernels] == ["forward"], str(report)


@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("upstream", [1.0, 2.5, 0.0, -3.0])
def test_the_fused_gradient_is_scaled_by_any_upstream_gradient(upstream, on_gpu, request):
    # On CUDA the scaling is kfuse's kernel, in place, which writes nothing at an upstream of 1.
    device = request.getfixturevalue("gpu") if on_gpu else torch.device("cpu")
    gen = torch.Generator().manual_seed(SEED)
    logits, labels = _randn(gen, 19, 23), torch.randint(0, 23, (19,), generator=gen)
    ref = logits.double().requires_grad_()
    want = torch.autograd.grad(cross_entropy_ignore_smoothing(ref, labels), ref, torch.tensor(upstream, dtype=torch.float64))[0]
    torch._dynamo.reset()
    x = logits.to(device).requires_grad_()
    out = torch.compile(cross_entropy_ignore_smoothing, backend="kfuse")(x, labels.to(device))
    (got,) = torch.autograd.grad(out, x, torch.tensor(upstream, device=device))
    assert torch.allclose(got.double().cpu(), want, rtol=1e-5, atol=1e-7), (got.double().cpu() - want).abs().max()
    # A model's last layer below the loss: the loss's gradient joins the forward, the matmul's
    # backward reads it scaled.
    torch.manual_seed(SEED)
    lin = nn.Linear(17, 23).to(device)
    h = _randn(gen, 19, 17).to(device).requires_grad_()
    step = lambda h, y: cross_entropy_ignore_smoothing(lin(h), y)  # noqa: E731
    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(step, backend="kfuse")(h, labels.to(device)), [h, *lin.parameters()],
                              torch.tensor(upstream, device=device))
    lin64 = nn.Linear(17, 23).double()
    lin64.load_state_dict({k: v.double().cpu() for k, v in lin.state_dict().items()})
    h64 = h.detach().double().cpu().requires_grad_()
    want = torch.autograd.grad(cross_entropy_ignore_smoothing(lin64(h64), labels), [h64, *lin64.parameters()],
                               torch.tensor(upstream, dtype=torch.float64))
    for g, w in zip(got, want):
        assert torch.allclose(g.double().cpu(), w, rtol=1e-4, atol=1e-6), (g.double().cpu() - w).abs().max()


@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "gpu"])
def test_a_retained_graph_gives_the_same_gradient_twice(on_gpu, request):
    # The first backward would scale the saved gradient in place; with the graph retained it scales
    # a copy, so a second backward through the same graph reads the unscaled one again.
    device = request.getfixturevalue("gpu") if on_gpu else torch.device("cpu")
    gen = torch.Generator().manual_seed(SEED)
    logits, labels = _randn(gen, 11, 13), torch.randint(0, 13, (11,), generator=gen)
    ref = logits.double().requires_grad_()
    want = torch.autograd.grad(cross_entropy_ignore_smoothing(ref, labels), ref)[0]
    torch._dynamo.reset()
    x = logits.to(device).requires_grad_()
    out = torch.compile(cross_entropy_ignore_smoothing, backend="kfuse")(x, labels.to(device))
    first = torch.autograd.grad(out, x, torch.tensor(3.0, device=device), retain_graph=True)[0].clone()
    second = torch.autograd.grad(out, x, torch.tensor(0.5, device=device))[0]
    assert torch.allclose(first.double().cpu(), 3 * want, rtol=1e-5, atol=1e-7)
    assert torch.allclose(second.double().cpu(), 0.5 * want, rtol=1e-5, atol=1e-7)


# A maximum's backward finds the elements that attain it by comparing its operand, which the
# backward may compute again, with the maximum the forward saved; both must be the same values
# (f32 as the kernels compute, f16 and bf16 compared rounded to their dtype), or no element
# attains it and the gradient is 0 / 0.
RECOMPUTED_MAXIMA = {
    "scaled_amax": lambda x: (x * 1.1 + 0.3).amax(-1),
    "amax_after_a_column_sum": lambda x: (x.sum(0, keepdim=True) * 0.5 + x).amax(0, keepdim=True) * x,
    "shifted_by_its_row_maximum": lambda x: (x * 1.7).amax(-1, keepdim=True) - x,
}


@pytest.mark.parametrize("name", sorted(RECOMPUTED_MAXIMA))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "gpu"])
def test_a_maximums_gradient_reaches_the_elements_that_attain_it(name, dtype, on_gpu, request):
    fn = RECOMPUTED_MAXIMA[name]
    device = request.getfixturevalue("gpu") if on_gpu else torch.device("cpu")
    gen = torch.Generator().manual_seed(SEED)
    x = _randn(gen, 6, 33).to(device, dtype).requires_grad_()
    torch._dynamo.reset()
    got = torch.compile(fn, backend=_backend.backend)(x)
    upstream = torch.randn(got.shape, generator=gen).to(device, dtype)
    (grad,) = torch.autograd.grad(got, x, upstream)
    (want,) = torch.autograd.grad(fn(x), x, upstream)
    assert not grad.isnan().any(), f"{name} {dtype} (seed {SEED}): NaN in the gradient"
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]
    scale = want.float().abs().max().item()
    torch.testing.assert_close(grad.float(), want.float(), rtol=tol, atol=tol * scale, msg=lambda m: f"{name} {dtype}: {m}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "gpu"])
def test_half_precision_ops_round_their_results_as_eager_does(dtype, on_gpu, request):
    # Every op of an f16/bf16 region rounds its result to the dtype, as eager PyTorch does: where
    # each step is exact in f32 before that rounding (products and sums of half values), kfuse
    # gives eager's bits. Without the rounding, `x * y + z` would keep the product's low bits.
    device = request.getfixturevalue("gpu") if on_gpu else torch.device("cpu")
    gen = torch.Generator().manual_seed(SEED)
    x, y, z, w = (_randn(gen, 13, 29).to(device, dtype) for _ in range(4))

    def fn(x, y, z, w):
        return ((x * y + z) * w - x).abs()

    torch._dynamo.reset()
    got = torch.compile(fn, backend=_backend.backend)(x, y, z, w)
    assert torch.equal(got, fn(x, y, z, w)), f"{dtype} (seed {SEED}): {(got.float() - fn(x, y, z, w).float()).abs().max()}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "gpu"])
def test_a_half_precision_minimums_gradient_survives_a_region_split(dtype, on_gpu, request):
    # topk (left to PyTorch) splits the forward, and the backward computes the minimum's operand
    # again from values another region stored: each op's result rounded as eager rounds it, that
    # operand equals the one the forward reduced, and the minimum is found (no 0 / 0).
    device = request.getfixturevalue("gpu") if on_gpu else torch.device("cpu")

    def fn(x):
        x = torch.cat([x, x * 2], 0)
        x = (x.topk(1, 0)[0] * x).pow(2)
        x = x - x.amin(0, keepdim=True)
        return x.index_select(0, torch.tensor([0, 9, 0], device=x.device)).exp().clamp(max=5)

    gen = torch.Generator().manual_seed(142)
    x = torch.randn(5, generator=gen).to(device, dtype).requires_grad_()
    upstream = torch.randn(3, generator=gen).to(device, dtype)
    torch._dynamo.reset()
    (grad,) = torch.autograd.grad(torch.compile(fn, backend=_backend.backend)(x), x, upstream)
    (want,) = torch.autograd.grad(fn(x), x, upstream)
    assert not grad.isnan().any(), f"{dtype}: NaN in the gradient: {grad}"
    torch.testing.assert_close(grad.float(), want.float(), rtol=2e-2, atol=2e-2 * want.float().abs().max().item())
