"""The decompositions the kfuse backend adds to PyTorch's core aten ones, so that what users
write reaches the aten graphs as operations :mod:`kfuse._lower` expresses.

With PyTorch's own rules:
- layer norm (into ``var_mean``, ``rsqrt`` and pointwise ops), and group norm the same way over
  views that take each group's channels and positions as one row (kfuse's ``reshape``);
- ``linalg_vector_norm`` (``F.normalize``, ``cosine_similarity``: powers, a sum and a root, or
  the largest or smallest magnitude);
- batch norm in training mode (``_native_batch_norm_legit_functional``: the statistics over
  every axis but the channels and the running statistics' update; the evaluation-mode op stays
  one op, as its rule is not functional);
- dropout (``native_dropout``) into ``rand_like``, a comparison and products, which
  :mod:`kfuse._lower` draws with kfuse's ``rand_like``; its mask is a forward output that the
  backward reads, so both use the same one;
- the activations that core aten keeps whole: ``elu`` (``selu`` and ``celu`` become it),
  ``leaky_relu`` and ``hardtanh`` (``relu6``), into ``where``, ``expm1`` and products (their
  backwards are core aten's rules already).

With kfuse's: ``split``, ``split_with_sizes`` and ``chunk`` of constant sizes become one slice a
part; ``max.dim`` and ``min.dim`` become ``amax`` and ``argmax`` (``amin``, ``argmin``); the variance and the standard deviation (``var``, ``var_mean``, ``std``, ``std_mean``, every
overload) become two-pass means: the mean, then the sum of the squared deviations over
``max(N - correction, 0)`` (a mean when the correction is 0), as PyTorch computes them.
Half-precision inputs are computed in float32 and rounded once, as PyTorch does.
"""

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

aten = torch.ops.aten

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _dims(x, dim):
    """The reduced axes, non-negative and sorted (None or [] reduce every axis, as for `var`)."""
    if dim is None:
        return list(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return list(range(x.dim()))
    n = max(x.dim(), 1)
    return sorted({d % n for d in dims})


def _moments(x, dim, correction, keepdim, want_mean):
    """(variance, mean or None) of `x` over `dim` with PyTorch's meaning of `correction`."""
    dims = _dims(x, dim)
    c = 1 if correction is None else correction
    dtype = x.dtype
    if dtype in _LOW_PRECISION:
        x = aten._to_copy.default(x, dtype=torch.float32)
    n = 1
    for d in dims:
        n = n * x.shape[d]
    mean_kept = aten.mean.dim(x, dims, True)
    dev = aten.sub.Tensor(x, mean_kept)
    sq = aten.mul.Tensor(dev, dev)
    if c == 0:
        var = aten.mean.dim(sq, dims, keepdim)
    else:
        denom = n - c
        if isinstance(denom, (int, float)):
            denom = max(denom, 0)
        var = aten.div.Tensor(aten.sum.dim_IntList(sq, dims, keepdim), denom)
    mean = None
    if want_mean:
        mean = mean_kept if keepdim else aten.mean.dim(x, dims, False)
    if dtype in _LOW_PRECISION:
        var = aten._to_copy.default(var, dtype=dtype)
        mean = None if mean is None else aten._to_copy.default(mean, dtype=dtype)
    return var, mean


def _unbiased(unbiased):
    return 1 if unbiased is None or unbiased else 0


def _var_correction(x, dim=None, *, correction=None, keepdim=False):
    return _moments(x, dim, correction, keepdim, False)[0]


def _var_dim(x, dim=None, unbiased=True, keepdim=False):
    return _moments(x, dim, _unbiased(unbiased), keepdim, False)[0]


def _var_default(x, unbiased=True):
    return _moments(x, None, _unbiased(unbiased), False, False)[0]


def _var_mean_correction(x, dim=None, *, correction=None, keepdim=False):
    return _moments(x, dim, correction, keepdim, True)


def _var_mean_dim(x, dim=None, unbiased=True, keepdim=False):
    return _moments(x, dim, _unbiased(unbiased), keepdim, True)


def _var_mean_default(x, unbiased=True):
    return _moments(x, None, _unbiased(unbiased), False, True)


def _std(var_fn):
    def rule(*args, **kwargs):
        return aten.sqrt.default(var_fn(*args, **kwargs))

    return rule


def _std_mean(var_mean_fn):
    def rule(*args, **kwargs):
        var, mean = var_mean_fn(*args, **kwargs)
        return aten.sqrt.default(var), mean

    return rule


MOMENTS = {
    aten.var.correction: _var_correction,
    aten.var.dim: _var_dim,
    aten.var.default: _var_default,
    aten.var_mean.correction: _var_mean_correction,
    aten.var_mean.dim: _var_mean_dim,
    aten.var_mean.default: _var_mean_default,
    aten.std.correction: _std(_var_correction),
    aten.std.dim: _std(_var_dim),
    aten.std.default: _std(_var_default),
    aten.std_mean.correction: _std_mean(_var_mean_correction),
    aten.std_mean.dim: _std_mean(_var_mean_dim),
    aten.std_mean.default: _std_mean(_var_mean_default),
}


# Core aten decompositions the backend leaves out, each kept as the one op PyTorch runs.
EXCLUDED = (
    # CPU attention (scaled_dot_product_attention, nn.MultiheadAttention): its rule computes the
    # math variant, whose second output is the attention weights where the op's is the
    # logsumexp; the backward AOTAutograd traces is the op's own, which reads that output as the
    # logsumexp, so the gradients of q, k and v come out wrong. (Inductor leaves it out too.)
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    # roll: its rule is an index_select at arange-computed positions (no lowering); kfuse lowers
    # the op itself as a gather at (position - shift) mod size, and PyTorch runs it where not.
    aten.roll.default,
)


def _split_with_sizes(x, split_sizes, dim=0):
    """`split_with_sizes` (and `split`, `chunk`) as one slice a part, which kfuse lowers (a gated
    MLP's `a, b = h.chunk(2, -1)`); sizes that are not constants keep the op."""
    if not all(isinstance(s, int) for s in split_sizes):
        return NotImplemented
    dim = dim % max(x.dim(), 1)
    parts, start = [], 0
    for size in split_sizes:
        parts.append(aten.slice.Tensor(x, dim, start, start + size))
        start += size
    return parts


def _split(x, split_size, dim=0):
    n = x.shape[dim % x.dim()] if x.dim() else 1
    if not isinstance(n, int) or not isinstance(split_size, int) or split_size < 1 or n == 0:
        return NotImplemented
    return _split_with_sizes(x, [min(split_size, n - start) for start in range(0, n, split_size)], dim)


SPLITS = {aten.split_with_sizes.default: _split_with_sizes, aten.split.Tensor: _split}


def _extremum_dim(amax, argmax):
    """`max.dim` / `min.dim` (values and indices along one axis) as `amax` and `argmax` (`amin`,
    `argmin`): the same values, and the index of the first extreme (NaN counting as it), as
    PyTorch's `max.dim` gives."""

    def rule(x, dim, keepdim=False):
        if x.dim() == 0:
            return NotImplemented
        return amax(x, [dim], keepdim), argmax(x, dim, keepdim)

    return rule


EXTREMA = {
    aten.max.dim: _extremum_dim(aten.amax.default, aten.argmax.default),
    aten.min.dim: _extremum_dim(aten.amin.default, aten.argmin.default),
}


def _build_table():
    table = core_aten_decompositions()
    for op in EXCLUDED:
        table.pop(op, None)
    table.update(
        get_decompositions(
            [
                aten.native_layer_norm,
                aten.native_group_norm,
                aten.native_dropout,
                aten.linalg_vector_norm,
                aten._native_batch_norm_legit_functional,
                # Instance norm: batch norm without running statistics over [1, N * C, H, W],
                # its weight repeated N times.
                aten._native_batch_norm_legit.no_stats,
                aten.repeat,
                aten.elu,
                aten.leaky_relu,
                aten.hardtanh,
            ]
        )
    )
    table.update(MOMENTS)
    table.update(SPLITS)
    table.update(EXTREMA)
    return table


def decompositions():
    """The table the backend gives AOTAutograd: core aten's (less :data:`EXCLUDED`), layer
    and group norm's forwards, dropout's, the vector norm's, training-mode batch norm's (and
    instance norm's: batch norm without statistics, `repeat`), the activations
    core aten keeps whole, the splits, the moments, the extrema along an axis. Built once, when the backend is imported (a few
    hundred milliseconds, as Inductor builds its own table on import), and shared by every
    compiled graph (AOTAutograd reads it; copying it cost 80 ms a graph)."""
    return _TABLE


_TABLE = _build_table()
