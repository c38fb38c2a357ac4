"""Aten graphs to ``.kf`` text: which aten operations kfuse expresses, and the lowering of a
region of them (a small ``torch.fx`` graph) into one ``.kf`` program.

Every value of a region is a ``let`` cast to the dtype PyTorch gives it, so kfuse's typing
never decides a dtype on its own. Shapes are written with one token per dimension: a constant
for a static size of at most :data:`MAX_CONST_DIM` (so that ``x[.., K]`` can read a component),
a symbol ``D<size>`` for a larger static size (a constant again where the region's slices and
cats give that size along their axes, which kfuse types as constants: a program that slices is
made for that size), ``S_<name>`` for a symbolic size of
``torch.compile``'s dynamic shapes (sizes torch knows equal share one token) and ``E_<expression>``
for a size torch computes from symbolic ones (``s0*s1``).

A value may be held *unexpanded*: PyTorch's ``expand``, ``full`` and leading size-1 axes are
broadcasts that the ``.kf`` text leaves to NumPy broadcasting, so the text's shape of a value
(its last dims) may be smaller than torch's. Operations that depend on axes (reductions,
components) need the two to agree, and an output that is still unexpanded is expanded (a view)
after the call. Anything that does not fit raises :class:`Refused`, and its region (or op)
stays in PyTorch.
"""

import contextlib
import contextvars
import hashlib
import math
import operator
import re

import torch

from . import _kfuse
from ._types import KFUSE_DTYPES

aten = torch.ops.aten
prims = torch.ops.prims

# Static sizes up to this are written as constants, larger ones as symbols.
MAX_CONST_DIM = 16

# Static sizes written as constants whatever their size while a region (or one op) is lowered:
# the sizes its slices and cats give along their axes, which kfuse types as constants (see
# `constant_sizes`).
_CONSTANT_SIZES = contextvars.ContextVar("kfuse_constant_sizes", default=frozenset())

_SIZED_ALONG_AXIS = ("slice", "slice_scatter", "cat")

# (`as_strided` of a contiguous tensor as another contiguous shape lowers as a reshape too.)
_RESHAPES = ("view", "_unsafe_view", "reshape", "as_strided")


def regroup(before, after):
    """The groups of a row-major reshape from shape `before` to `after` (sizes or tokens), as
    kfuse's `reshape` forms them: pairs of index ranges ``(from, to)`` holding the same elements,
    a size that is not an int (a symbol) a group of its own on both sides, ints grouped until
    their products agree, a 1 on one side a group with nothing on the other. None when there is
    no such grouping (a symbol would split or merge)."""
    i = j = 0
    groups = []
    while i < len(before) or j < len(after):
        f = before[i] if i < len(before) else None
        t = after[j] if j < len(after) else None
        if f is not None and f == t:
            groups.append((range(i, i + 1), range(j, j + 1)))
            i, j = i + 1, j + 1
        elif f == 1:
            groups.append((range(i, i + 1), range(j, j)))
            i += 1
        elif t == 1:
            groups.append((range(i, i), range(j, j + 1)))
            j += 1
        elif isinstance(f, int) and isinstance(t, int) and f > 0 and t > 0:
            i0, j0, pa, pb = i, j, f, t
            i, j = i + 1, j + 1
            while pa != pb:
                if pa < pb:
                    if i >= len(before) or not isinstance(before[i], int) or before[i] < 1:
                        return None
                    pa, i = pa * before[i], i + 1
                else:
                    if j >= len(after) or not isinstance(after[j], int) or after[j] < 1:
                        return None
                    pb, j = pb * after[j], j + 1
            groups.append((range(i0, i), range(j0, j)))
        else:
            return None
    return groups


def _regrouped_sizes(node):
    """The static sizes of the axes a reshape node splits or merges (kfuse reshapes constant
    axes only, so the region writes them as constants)."""
    t, src = fake(node), fake(bind(node).get("self"))
    if t is None or src is None:
        return set()
    # A size known only at run time (a dynamic batch) is a token of its own: it stays whole, and
    # the static axes around it may still split or merge.
    token = lambda d: d if isinstance(d, int) else str(d)  # noqa: E731
    before, after = tuple(map(token, src.shape)), tuple(map(token, t.shape))
    groups = regroup(before, after) or []
    sizes = set()
    for f, to in groups:
        if len(f) == 1 and len(to) == 1:
            continue
        sizes.update(before[k] for k in f)
        sizes.update(after[k] for k in to)
    return {d for d in sizes if isinstance(d, int) and d > MAX_CONST_DIM}


# kfuse's planner merges the trailing reduced axes of a reduction over several axes into rows of at
# most this many columns where their sizes are constants (`MERGED_ROW_LIMIT` of its stages).
MERGED_ROW_LIMIT = 1024


def _merged_row_sizes(node):
    """The static sizes of the trailing axes a reduction over several axes reduces, from the last
    while their product stays within :data:`MERGED_ROW_LIMIT`: as constants, kfuse reduces them
    as one row (a layer norm over (C, H, W) of 64 x 28 x 28 in rows of 784, then 64), where as
    symbols it reduces one axis per kernel. Not the size of the operand's first axis (a batch),
    which stays a symbol so that a new batch size compiles nothing; the region's program is
    otherwise for these sizes only, as Dynamo's graph is."""
    a = bind(node)
    x, dims = fake(a.get("self")), a.get("dim")
    if x is None or not isinstance(dims, (list, tuple)) or len(dims) < 2 or x.dim() < 2:
        return set()
    n = x.dim()
    reduced = {d % n for d in dims}
    merged, product, k = [], 1, n - 1
    while k >= 1 and k in reduced and isinstance(x.shape[k], int):
        product *= x.shape[k]
        if product > MERGED_ROW_LIMIT:
            break
        merged.append(x.shape[k])
        k -= 1
    if len(merged) < 2:  # one axis is a row as it is
        return set()
    lead = x.shape[0] if isinstance(x.shape[0], int) else None  # a batch known at run time: no size
    return {d for d in merged if d > MAX_CONST_DIM and d != lead}


@contextlib.contextmanager
def constant_sizes(nodes):
    """The static sizes that `nodes`' slices, slice scatters and cats have along their axis (a
    slice of an axis, or the parts of a cat, are constant sizes in kfuse's typing), that their
    reshapes regroup, and that their reductions over several axes merge (see
    :func:`_merged_row_sizes`), as a context
    in which :func:`dim_token` writes them as constants, so that the values of those sizes agree
    with the rest of the region (a gated MLP's `h.chunk(2, -1)` halves of 48 columns: 24)."""
    sizes = set()
    for node in nodes:
        name = getattr(getattr(node, "target", None), "overloadpacket", None)
        if node.op == "call_function" and getattr(name, "__name__", "") in _RESHAPES:
            sizes |= _regrouped_sizes(node)
            continue
        if node.op == "call_function" and name in (aten.sum, aten.mean, aten.amax, aten.amin):
            sizes |= _merged_row_sizes(node)
            continue
        if node.op == "call_function" and getattr(name, "__name__", "") == "constant_pad_nd":
            # The padded axes, before and after: constants, as a cat's are.
            a, t = bind(node), fake(node)
            src, pad = fake(a.get("self")), list(a.get("pad") or [])
            for k in range(len(pad) // 2):
                for u in (t, src):
                    if u is not None and u.dim() > k and isinstance(u.shape[-1 - k], int) and u.shape[-1 - k] > MAX_CONST_DIM:
                        sizes.add(u.shape[-1 - k])
            continue
        if node.op != "call_function" or getattr(name, "__name__", "") not in _SIZED_ALONG_AXIS:
            continue
        a = bind(node)
        # A cat's parts and result; a slice scatter's result and source; a slice and the tensor
        # it slices.
        tensors = list(a["tensors"]) + [node] if "tensors" in a else [node, a.get("src", a.get("self"))]
        for t in tensors:
            t = fake(t)
            if t is not None and t.dim():
                d = t.shape[a.get("dim", 0) % t.dim()]
                if isinstance(d, int) and d > MAX_CONST_DIM:
                    sizes.add(d)
    token = _CONSTANT_SIZES.set(_CONSTANT_SIZES.get() | sizes)
    try:
        yield
    finally:
        _CONSTANT_SIZES.reset(token)


# Views and copies: a region of nothing else computes nothing, and PyTorch runs its views for free
# where a kernel would copy (a matmul's operand transposed in the backward).
TRIVIAL = {
    "view", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "expand", "clone", "alias",
    "permute", "transpose", "t", "slice", "select", "as_strided",
    # A tensor's size: metadata, no work (batch norm's `n / (n - 1)` reads it).
    "sym_size", "sym_numel", "sym_stride",
}


def op_name(node):
    """The aten operation's name of an fx node (`permute`), or ""."""
    return getattr(getattr(node.target, "overloadpacket", None), "__name__", "")


def is_view(node):
    """An op of `TRIVIAL` other than a copy: PyTorch applies it for free."""
    name = op_name(node)
    return name in TRIVIAL and name != "clone"


def is_random(node):
    """Whether fx node `node` draws random numbers (`rand_like`, `bernoulli`, ...)."""
    return node.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


class Refused(Exception):
    """What kfuse cannot express; the message is the reason shown by ``kfuse.explain``."""


class V:
    """A lowered value: its ``.kf`` text (a name or a literal), the text's shape (tokens), its
    kfuse dtype and whether it is a Python scalar (a weak literal)."""

    __slots__ = ("text", "shape", "dtype", "scalar")

    def __init__(self, text, shape=(), dtype=None, scalar=False):
        self.text, self.shape, self.dtype, self.scalar = text, tuple(shape), dtype, scalar


def fake(node):
    """The fake tensor (``meta["val"]``) of an fx node, or None."""
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def dim_token(d):
    """The ``.kf`` token of one torch size (int or SymInt)."""
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        if expr.is_Integer:
            d = int(expr)
        elif expr.is_Symbol:
            return _symbol_token(expr)
        else:
            # A size computed from others (`s0*s1`, where a view merged two axes: the rows of a
            # linear layer's 3-D input) is a symbol of its own, read from the axis of an input
            # that has it, as any other. kfuse relates it to no other size: what would need that
            # (a view splitting it again, a broadcast against its factors) is refused.
            text = str(expr)
            for op, word in (("**", "e"), ("*", "x"), ("+", "p"), ("-", "m"), ("/", "d")):
                text = text.replace(op, f"_{word}_")
            tag = hashlib.sha1(str(expr).encode()).hexdigest()[:6]  # distinct expressions, distinct tokens
            return "E_" + "".join(c if c.isalnum() else "_" for c in text) + "_" + tag
    if not isinstance(d, int) or d < 0:
        raise Refused(f"the size {d!r} is not a size kfuse declares")
    return d if d <= MAX_CONST_DIM or d in _CONSTANT_SIZES.get() else f"D{d}"


def _symbol_token(symbol):
    """The ``.kf`` token of a size symbol of torch's shape environment (``s0`` -> ``S_s0``)."""
    return "S_" + "".join(c if c.isalnum() else "_" for c in str(symbol))


def shape_tokens(t):
    return tuple(dim_token(d) for d in t.shape)


def kf_dtype(dtype):
    kd = KFUSE_DTYPES.get(dtype)
    if kd is None:
        raise Refused(f"dtype {dtype} is not a kfuse dtype (f32, f16, bf16, i32, i64, bool)")
    return kd


def value_dtype(t):
    """The kfuse dtype a region computes the value of fake tensor `t` in: its own, but a float64
    scalar (0-dim: what decompositions compute a mean's divisor in from sizes known only at run
    time, `2.0 / (40 * s0)`, before it scales an f32 tensor) in f32, one rounding apart from
    torch's. A region's inputs and outputs keep their dtypes."""
    if t.dtype == torch.float64 and t.dim() == 0:
        return "f32"
    return kf_dtype(t.dtype)


def literal(x):
    """The ``.kf`` text of a Python scalar."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        if not -(2**31) <= x < 2**31:
            raise Refused(f"the integer {x} is outside the i32 range")
        return f"({x})" if x < 0 else str(x)
    if isinstance(x, float):
        # The text has no literal for NaN or an infinity (decompositions write them: xlogy's NaN
        # test, logsumexp's infinite maximum): an IEEE division of constants gives them, on the
        # GPU and in the interpreter alike.
        if math.isnan(x):
            return "(0.0 / 0.0)"
        if math.isinf(x):
            return "(1.0 / 0.0)" if x > 0 else "(-1.0 / 0.0)"
        s = repr(x)
        if "." not in s and "e" not in s:
            s += ".0"
        return f"({s})" if x < 0 else s
    raise Refused(f"the argument {x!r} is not a tensor or a number")


def broadcast(*shapes):
    """NumPy broadcasting of token shapes (as kfuse does: equal tokens match, 1 stretches)."""
    out = []
    for i in range(1, max((len(s) for s in shapes), default=0) + 1):
        dims = {s[-i] for s in shapes if len(s) >= i} - {1}
        if len(dims) > 1:
            raise Refused(f"shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast in kfuse")
        out.append(dims.pop() if dims else 1)
    return tuple(reversed(out))


def bind(node):
    """An aten node's arguments by schema name, defaults filled in."""
    out = {}
    for i, a in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


# ---------------------------------------------------------------------------------------------
# The rules: each takes (node, args by name, ctx) and returns (text, text shape) of the value,
# where `ctx.v(x)` is the lowered value of an argument. The result is cast to the node's dtype.


def _cast_to(v, dtype):
    return v.text if v.scalar or v.dtype == dtype else f"{dtype}({v.text})"


def _infix(op, cast=True):
    # Of two bools, torch's `*` is their `and` and `+` their `or` (a bool result).
    on_bools = {"*": "and", "+": "or"}.get(op)

    def rule(node, a, ctx):
        x, y = ctx.v(a["self"]), ctx.v(a["other"])
        alpha = a.get("alpha")
        out = ctx.out_dtype
        if out == "bool" and on_bools and alpha in (None, 1):
            return f"bool({x.text}) {on_bools} bool({y.text})", broadcast(x.shape, y.shape)
        xt, yt = (_cast_to(x, out), _cast_to(y, out)) if cast else (x.text, y.text)
        if alpha is not None and alpha != 1:
            yt = f"{yt} * {literal(alpha)}"
        return f"{xt} {op} {yt}", broadcast(x.shape, y.shape)

    return rule


def _rsub(node, a, ctx):
    x, y = ctx.v(a["self"]), ctx.v(a["other"])
    alpha = a.get("alpha")
    xt = _cast_to(x, ctx.out_dtype)
    if alpha is not None and alpha != 1:
        xt = f"{xt} * {literal(alpha)}"
    return f"{_cast_to(y, ctx.out_dtype)} - {xt}", broadcast(x.shape, y.shape)


def _div(node, a, ctx):
    x, y = ctx.v(a["self"]), ctx.size_or_v(a["other"])
    mode = a.get("rounding_mode")
    xt, yt = _cast_to(x, ctx.out_dtype), _cast_to(y, ctx.out_dtype)
    shape = broadcast(x.shape, y.shape)
    if mode is None:
        return f"{xt} / {yt}", shape
    if mode == "floor":
        return f"{xt} // {yt}", shape
    if mode == "trunc" and ctx.out_dtype in ("f32", "f16", "bf16"):
        return f"trunc({xt} / {yt})", shape
    raise Refused(f"division with rounding_mode={mode!r} on {ctx.out_dtype}")


def _call(fn, *names, cast=True):
    def rule(node, a, ctx):
        vs = [ctx.v(a[n]) for n in names]
        texts = [_cast_to(v, ctx.out_dtype) if cast else v.text for v in vs]
        return f"{fn}({', '.join(texts)})", broadcast(*(v.shape for v in vs))

    return rule


def _unary(template, cast=True):
    def rule(node, a, ctx):
        x = ctx.v(a["self"])
        return template.format(x=_cast_to(x, ctx.out_dtype) if cast else x.text), x.shape

    return rule


def _signbit(node, a, ctx):
    """`signbit`: a float's sign bit (of -0.0 and NaNs too, through `copysign`), an integer's sign."""
    x = ctx.v(a["self"])
    if x.dtype in ("f32", "f16", "bf16"):
        return f"copysign(1.0, {x.text}) < 0", x.shape
    return f"{x.text} < 0", x.shape


def _nan_ignoring(fn):
    """`fmax` / `fmin`: `max` / `min`, but a NaN operand gives the other one (NaN only where
    both are)."""

    def rule(node, a, ctx):
        x, y = ctx.v(a["self"]), ctx.v(a["other"])
        xt, yt = _cast_to(x, ctx.out_dtype), _cast_to(y, ctx.out_dtype)
        shape = broadcast(x.shape, y.shape)
        if ctx.out_dtype not in ("f32", "f16", "bf16"):
            return f"{fn}({xt}, {yt})", shape
        return f"where(isnan({xt}), {yt}, where(isnan({yt}), {xt}, {fn}({xt}, {yt})))", shape

    return rule


def _pow(node, a, ctx):
    x, e = ctx.v(a["self"]), ctx.v(a["exponent"])
    xt, et = _cast_to(x, ctx.out_dtype), _cast_to(e, ctx.out_dtype)
    if e.scalar:
        # The exponents PyTorch computes as products and roots.
        special = {1: "{x}", 2: "{x} * {x}", 3: "{x} * {x} * {x}", 0.5: "sqrt({x})", -1: "1 / {x}", -0.5: "rsqrt({x})"}
        ev = a["exponent"]
        if ev in special and not isinstance(ev, bool):
            return special[ev].format(x=xt), x.shape
    return f"pow({xt}, {et})", broadcast(x.shape, e.shape)


def _compare(op):
    def rule(node, a, ctx):
        x, y = ctx.v(a["self"]), ctx.v(a["other"])
        return f"{x.text} {op} {y.text}", broadcast(x.shape, y.shape)

    return rule


def _logical(op):
    def rule(node, a, ctx):
        x, y = ctx.v(a["self"]), ctx.v(a["other"])
        return f"bool({x.text}) {op} bool({y.text})", broadcast(x.shape, y.shape)

    return rule


def _cat(node, a, ctx):
    """`cat` along the last axis of parts whose last axis has size 1 (what stacking the gradients
    of `unbind`'s parts gives): kfuse's `stack` of their components; along any other axis,
    kfuse's `cat` of parts at their full shapes with constant sizes along it."""
    tensors = list(a["tensors"])
    n = fake(node).dim()
    if n == 0:
        raise Refused("a cat of scalars")
    d = a.get("dim", 0) % n
    if d != n - 1 or any(fake(t) is None or fake(t).shape[-1] != 1 for t in tensors):
        parts = [_full({"t": t}, "t", ctx, "a cat")[0] for t in tensors]
        if any(not isinstance(p.shape[d], int) for p in parts):
            raise Refused("a cat along an axis of symbolic size (kfuse joins parts of constant sizes)")
        out = ctx.out_dtype
        full = ctx.shape_of(node)
        return f"cat([{', '.join(_cast_to(p, out) for p in parts)}], axis: {d})", full
    parts = [ctx.v(t) for t in tensors]
    if any(len(p.shape) != n for p in parts):
        raise Refused("a cat of broadcast parts")
    out = ctx.out_dtype
    texts = [_cast_to(V(f"{p.text}[.., 0]", p.shape[:-1], p.dtype), out) for p in parts]
    return "stack(" + ", ".join(texts) + ")", broadcast(*[p.shape[:-1] for p in parts]) + (len(parts),)


def _constant_pad_nd(node, a, ctx):
    """`constant_pad_nd(x, pad, value)` (`F.pad` in constant mode, and its backward, which pads
    by the negated amounts): along each axis it pads (pad lists the last axis's before and after
    first), a negative amount is a slice that crops, a positive one kfuse's `cat` of a block of
    `value`, `x` and another block, each block a column of `value` (`where(true, value,
    x[.., 0:1])`, copied) as many times as the pad; the axes' sizes constants."""
    pad, value = list(a["pad"]), a.get("value", 0)
    if not all(isinstance(p, int) for p in pad) or len(pad) % 2:
        raise Refused(f"a pad of {pad} (kfuse pads by constants)")
    if not isinstance(value, (bool, int, float)):
        raise Refused("a pad value that is not a number")
    x, full = ctx.v(a["self"]), ctx.shape_of(a["self"])
    if not _broadcasts(x.shape, full):
        raise Refused("a pad of a value that does not broadcast to its expanded shape")
    out = ctx.out_dtype
    # A broadcast `x` (PyTorch's expand of a smaller value, as a sum's gradient) keeps its shape:
    # cropping an axis along which it does not vary leaves it as it is.
    text, shape, still, lead = _cast_to(x, out), list(x.shape), _broadcast_axes(x, full), len(full) - len(x.shape)
    for k in range(len(pad) // 2):
        before, after = pad[2 * k], pad[2 * k + 1]
        d = len(full) - 1 - k
        if d < 0:
            raise Refused(f"a pad of {pad} of a tensor of {len(full)} axes")
        if before == 0 and after == 0:
            continue
        if d in still:
            if before > 0 or after > 0:
                raise Refused("a pad of a broadcast (expanded) value along an axis it is broadcast on")
            continue
        d -= lead
        if not isinstance(shape[d], int) or shape[d] < 1:
            raise Refused(f"a pad along an axis of size {shape[d]} (kfuse pads axes of constant sizes from 1)")
        at = lambda item: ", ".join([":"] * d + [item] + [":"] * (len(shape) - d - 1))  # noqa: E731
        start, stop = max(-before, 0), shape[d] - max(-after, 0)
        if stop - start < 1:
            raise Refused(f"a pad of {pad} that crops axis {d} of size {shape[d]} to nothing")
        if (start, stop) != (0, shape[d]):
            text, shape[d] = f"{text}[{at(f'{start}:{stop}')}]", stop - start
        before, after = max(before, 0), max(after, 0)
        if max(before, after) > MAX_CONST_DIM:
            raise Refused(f"a pad of {pad}: kfuse pads by at most {MAX_CONST_DIM} elements a side (a column each)")
        if before + after:
            column = f"where(true, {literal(value)}, {text}[{at('0:1')}])"
            text = f"cat([{', '.join([column] * before + [text] + [column] * after)}], axis: {d})"
            shape[d] += before + after
    return text, tuple(shape)


def _where(node, a, ctx):
    c, x, y = ctx.v(a["condition"]), ctx.v(a["self"]), ctx.v(a["other"])
    out = ctx.out_dtype
    return f"where(bool({c.text}), {_cast_to(x, out)}, {_cast_to(y, out)})", broadcast(c.shape, x.shape, y.shape)


def _clamp(node, a, ctx):
    x = ctx.v(a["self"])
    lo, hi = a.get("min"), a.get("max")
    text, shapes = _cast_to(x, ctx.out_dtype), [x.shape]
    if lo is not None:
        lv = ctx.v(lo)
        text, shapes = f"max({text}, {_cast_to(lv, ctx.out_dtype)})", shapes + [lv.shape]
    if hi is not None:
        hv = ctx.v(hi)
        text, shapes = f"min({text}, {_cast_to(hv, ctx.out_dtype)})", shapes + [hv.shape]
    return text, broadcast(*shapes)


def _gelu(node, a, ctx):
    x = _cast_to(ctx.v(a["self"]), ctx.out_dtype)
    if a.get("approximate") == "tanh":
        return f"0.5 * {x} * (1 + tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))", ctx.v(a["self"]).shape
    return f"0.5 * {x} * (1 + erf({x} * 0.7071067811865476))", ctx.v(a["self"]).shape


def _cast(node, a, ctx):
    x = ctx.v(a["self"] if "self" in a else a["a"])
    if node.target is aten._to_copy.default:
        src = fake(a["self"])
        dev, layout = a.get("device"), a.get("layout")
        if dev is not None and src is not None and torch.device(dev) != src.device:
            raise Refused(f"a copy to another device ({dev})")
        if layout not in (None, torch.strided):
            raise Refused(f"a copy to layout {layout}")
    return x.text, x.shape


def _identity(node, a, ctx):
    x = ctx.v(a["self"])
    return x.text, x.shape


# Tensors whose values are unspecified (`empty`): kfuse's are zeros. PyTorch's decompositions make
# one for its shape alone (hinge_embedding_loss's `full_like(empty_permuted(...), 1.0)`).
_EMPTY = (aten.empty_permuted, aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty)


def _constant(node, a, ctx):
    # full / full_like / zeros_like / scalar_tensor / empty: a broadcast constant.
    value = a.get("fill_value", a.get("s"))
    if node.target in (aten.zeros_like.default,) or node.target.overloadpacket in _EMPTY:
        value = 0
    elif node.target in (aten.ones_like.default,):
        value = 1
    if isinstance(value, torch.fx.Node) and scalar_dtype(value) is not None:
        # A size known only at run time made a tensor (`scalar_tensor(s0)`): the region's size.
        return _cast_to(ctx.v(value), ctx.out_dtype), ()
    if not isinstance(value, (bool, int, float)):
        raise Refused("a fill value that is not a number")
    return literal(value), ()


def _is_zero(x):
    """Whether `x` (an argument) is the number 0 or a node that fills with 0."""
    if isinstance(x, torch.fx.Node):
        if x.op != "call_function" or getattr(x.target, "overloadpacket", None) not in (aten.full, aten.scalar_tensor, aten.zeros_like):
            return False
        a = bind(x)
        x = 0 if x.target is aten.zeros_like.default else a.get("fill_value", a.get("s"))
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def _masked_operand(src, full, ctx):
    """A sum of `where(m, v, 0)` as kfuse's masked sum of `v` (the same value): `(text of v, text
    of m)` when `src` is such a `where` whose `v` has the full shape, else None. Where `m` fails,
    the kernel then loads none of the inputs that only `v` reads (the padding of a batch)."""
    if not (isinstance(src, torch.fx.Node) and src.op == "call_function" and src.target is aten.where.self):
        return None
    w = bind(src)
    if not _is_zero(w["other"]):
        return None
    try:
        c, v = ctx.v(w["condition"]), ctx.v(w["self"])
    except Refused:  # the where's operands are not in the region (`supported` sees one node)
        return None
    if v.shape != full or v.scalar:
        return None
    return _cast_to(v, kf_dtype(fake(src).dtype)), f"bool({c.text})"


# A kernel that would compute reductions again at every element, over more elements than this,
# leaves its region to PyTorch (see `_backend`): the limit `kfuse check --plan` warns above. kfuse
# keeps a last axis's reductions once per row and stores a reduction along other axes once, so
# only what neither covers is counted.
REUSED_EXTENT_LIMIT = _kfuse._RECOMPUTED_EXTENT_LIMIT

# The dtypes whose reductions of a broadcast value `_reduce_broadcast` computes without its copies.
_REDUCIBLE_BROADCAST = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64)


def _broadcast_axes(x, full):
    """The axes of torch shape `full` along which `x` (kfuse keeps it broadcast: PyTorch's expand
    of a smaller value) does not vary: those it lacks (leading) and those of size 1 in it that are
    larger in `full`."""
    lead = len(full) - len(x.shape)
    return {d for d in range(len(full)) if d < lead or (x.shape[d - lead] == 1 and full[d] != 1)}


def _reduce_broadcast(fn, x, full, dims, keep, a, ctx):
    """`fn` (sum, mean, max or min) over axes `dims` of `x`, a value kfuse keeps broadcast to
    torch shape `full`, without the expanded copies: along an axis where `x` does not vary, the
    maximum, minimum and mean are `x` itself and the sum is `x` times the axis's size; the axes `x`
    has are reduced in it (one element along those of size 1). Returns a value that broadcasts
    to the reduction's torch shape."""
    lead = len(full) - len(x.shape)
    spread = [full[d] for d in dims if d in _broadcast_axes(x, full)]
    own = [d - lead for d in dims if d >= lead]  # reduced axes of `x` itself
    text = x.text if a.get("dtype") is None else f"{kf_dtype(a['dtype'])}({x.text})"
    if fn == "sum" and x.dtype == "bool" and a.get("dtype") is None:
        fn = "count"  # torch sums bools as integers; kfuse counts them
        if not own:
            text = f"i64({text})"
    shape = tuple(x.shape)
    if own:
        axis = str(own[0]) if len(own) == 1 else "[" + ", ".join(str(d) for d in own) + "]"
        text = f"{fn}({text}, axis: {axis}{', keepdim: true' if keep else ''})"
        shape = tuple(1 if i in own else s for i, s in enumerate(shape)) if keep else tuple(
            s for i, s in enumerate(shape) if i not in own
        )
    if fn in ("sum", "count") and spread:
        count = " * ".join(_size_i64(ctx, s) for s in spread)
        out = ctx.out_dtype
        text = f"i64({text}) * {count}" if out == "i64" else f"{out}(f32({text}) * f32({count}))"
    return text, shape


def _reduce(fn):
    def rule(node, a, ctx):
        src = fake(a["self"])
        full = ctx.shape_of(a["self"])
        n = src.dim()
        dims = a.get("dim")
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        dims = sorted({d % n for d in dims}) if n else []
        x = ctx.v(a["self"])
        dtype = a.get("dtype") or src.dtype
        reducible = dtype in _REDUCIBLE_BROADCAST or (dtype == torch.bool and fn == "sum")
        if x.shape != full and not x.scalar and fn in ("sum", "mean", "max", "min") and reducible:
            if _broadcasts(x.shape, full):
                return _reduce_broadcast(fn, x, full, dims or list(range(n)), bool(a.get("keepdim")), a, ctx)
        x = _at_full_shape(node, x, full, ctx, "a reduction")
        text, where = x.text, ""
        # Not for sums over leading axes alone (column sums): a row kernel sums unmasked operands
        # as it goes (see `columns::fuse`), which it would not do for a masked one.
        masked = None
        if fn == "sum" and (not dims or n - 1 in dims):
            masked = _masked_operand(a["self"], full, ctx)
        if masked is not None:
            text, where = masked[0], f", where: {masked[1]}"
        if a.get("dtype") is not None:
            text = f"{kf_dtype(a['dtype'])}({text})"
        name = fn
        if fn == "sum" and src.dtype == torch.bool and a.get("dtype") is None:
            name = "count"  # torch sums bools as integers; kfuse counts them
        keep = bool(a.get("keepdim"))
        if not dims:
            dims = list(range(n))
        axis = str(dims[0]) if len(dims) == 1 else "[" + ", ".join(str(d) for d in dims) + "]"
        if dims == list(range(len(dims))):
            # Leading axes (a bias gradient's sum over the batch): the result without them, which
            # broadcasts as torch's size-1 axes do and plans as a split column reduction; the
            # region's output takes those axes back as a view.
            if len(dims) == n:
                return f"{name}({text}{where})", ()
            return f"{name}({text}, axis: {axis}{where})", tuple(full[len(dims):])
        if keep:
            shape = tuple(1 if i in dims else d for i, d in enumerate(full))
            return f"{name}({text}, axis: {axis}, keepdim: true{where})", shape
        return f"{name}({text}, axis: {axis}{where})", tuple(d for i, d in enumerate(full) if i not in dims)

    return rule


def _any(node, a, ctx):
    """`any` of a bool tensor over axes (or every element): its count there is not 0."""
    if fake(a["self"]).dtype != torch.bool:
        raise Refused(f"any of a {fake(a['self']).dtype} tensor (kfuse's lowering takes bools)")
    text, shape = _reduce("sum")(node, a, ctx)  # count(...) of a bool
    return f"{text} > 0", shape


# Python arithmetic on sizes that Dynamo records for dynamic shapes (batch norm's `n / (n - 1)`).
_SIZE_ARITHMETIC = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/"}


def scalar_dtype(node):
    """The kfuse dtype of a node whose value is a Python number or a symbolic one (f32 for a
    float, i64 for an integer), or None for a node of another value."""
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if isinstance(v, (torch.SymFloat, float)) and not isinstance(v, bool):
        return "f32"
    if isinstance(v, (torch.SymInt, int)) and not isinstance(v, bool):
        return "i64"
    return None


def _size_arithmetic(node, a, ctx):
    """`a <op> b` of sizes and numbers, computed in the kernel: in f32 where torch's value is a
    float (torch computes it in float64 on the host, then rounds it to f32 where it scales an f32
    tensor: this may differ from that by one rounding), in i64 for integers."""
    x, y = ctx.v(a["a"]), ctx.v(a["b"])
    op = _SIZE_ARITHMETIC[node.target]
    out = "f32" if op == "/" else ctx.out_dtype
    return f"{_cast_to(x, out)} {op} {_cast_to(y, out)}", ()


def _sym_size(node, a, ctx):
    """`numel(x)` or `x.size(dim)` of a tensor of the region, as the product of kfuse's sizes."""
    tokens = ctx.shape_of(a["self"])
    if node.target is aten.sym_size.int:
        tokens = (tokens[a["dim"] % len(tokens)],) if tokens else ()
    factors = [literal(t) if isinstance(t, int) else f"i64({ctx.size(t)})" for t in tokens]
    return " * ".join(factors) if factors else "1", ()


def _prod(node, a, ctx):
    """`prod` over every element or along one axis, of floats (kfuse refuses a product of
    integers, which torch computes in int64)."""
    dtype = a.get("dtype") or fake(a["self"]).dtype
    if not dtype.is_floating_point:
        raise Refused("a product of integers (kfuse multiplies floats only)")
    return _reduce("prod")(node, a, ctx)


def _drop_leading_ones(src, x, count, ctx):
    """`x` (the value of node `src`) without its first `count` axes, all of size 1 in the text
    (the text has no view that removes leading axes). A reduction with `keepdim` (a weight's
    gradient summed over the batch axes, then viewed as the weight) is written again without
    it; another value is summed over those axes, one element each."""
    if isinstance(src, torch.fx.Node) and src.op == "call_function":
        packet = getattr(src.target, "overloadpacket", None)
        if packet in _REDUCTIONS and bind(src).get("keepdim"):
            try:
                text, shape = RULES[packet](src, dict(bind(src), keepdim=False), _Ctx(ctx.values, x.dtype, ctx.partial))
            except Refused:  # its operand is not in the region (`supported` sees one node)
                text, shape = None, None
            if shape == x.shape[count:]:
                return text, shape
    if x.dtype == "bool":
        raise Refused("a view that removes leading size-1 axes of a bool value")
    axes = "[" + ", ".join(str(i) for i in range(count)) + "]"
    return f"sum({x.text}, axis: {axes})", x.shape[count:]


def _arange(node, a, ctx):
    """`arange(start, end, step)`: its elements written out when its length is a constant of
    at most :data:`MAX_CONST_DIM` (a component axis: what `select`'s and `unbind`'s backward
    compare with an index), else kfuse's `iota` along an axis of that length of a tensor of the
    region (only that tensor's shape is read)."""
    start, step = a.get("start") or 0, a.get("step")
    step = 1 if step is None else step
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, step)):
        raise Refused("an arange whose start or step is not a constant")
    out = ctx.out_dtype
    if out in ("f32", "f16", "bf16") and not all(float(v).is_integer() for v in (start, step)):
        raise Refused("an arange with a fractional start or step (torch rounds each element from float64)")
    n = ctx.shape_of(node)[0]
    if isinstance(n, int):
        if n == 0:
            raise Refused("an empty arange")
        return "stack(" + ", ".join(literal(start + i * step) for i in range(n)) + ")", (n,)
    for v in ctx.values.values():
        if n in v.shape:
            k = v.shape.index(n)
            others = [i for i in range(len(v.shape)) if i != k]
            shaped = v.text
            if others:
                fn = "count" if v.dtype == "bool" else "sum"
                shaped = f"{fn}({v.text}, axis: [{', '.join(map(str, others))}])"
            text = f"{out}(iota({shaped}, axis: 0))"
            if step != 1:
                text = f"{text} * {literal(step)}"
            if start != 0:
                text = f"{text} + {literal(start)}"
            return text, (n,)
    if ctx.partial:
        return "0", (n,)  # whether a tensor of the region has this length is known with the region
    raise Refused(
        f"an arange of length {n}, which no tensor of its region has as an axis: kfuse builds index ranges as "
        f"`iota` along an axis of a tensor (and writes out constant lengths up to {MAX_CONST_DIM})"
    )


def _as_strided(node, a, ctx):
    """`as_strided` that is a view of a contiguous tensor as another contiguous shape (what
    decompositions write for a reshape, as group norm's statistics): a reshape. Any other
    layout is refused."""
    src = fake(a["self"])
    # Sizes known only at run time (a dynamic batch) are the graph's size nodes: their values are
    # expressions, compared without guards.
    value = lambda v: v.meta.get("val") if isinstance(v, torch.fx.Node) else v  # noqa: E731
    size, stride = [value(v) for v in a["size"]], [value(v) for v in a["stride"]]
    offset = value(a.get("storage_offset") or 0)
    known = torch.fx.experimental.symbolic_shapes.statically_known_true
    expected, step = [], 1
    for d in reversed(size):
        expected.append(step)
        step *= d
    expected.reverse()
    same = all(known(d == 1) or known(st == e) for d, st, e in zip(size, stride, expected))
    whole = known(src.numel() == step) and src.is_contiguous() and known(src.storage_offset() == 0)
    if not (same and known(offset == 0) and whole):
        raise Refused(f"an as_strided of size {size}, stride {stride} and offset {offset} that is not a reshape")
    return _reshape_by_shapes(node, a, ctx)


def _reshape_by_shapes(node, a, ctx):
    """A view: size-1 axes added or removed where the text can follow it, else kfuse's `reshape`
    of axes of static size (split or merged) between axes that stay whole."""
    src = a["self"]
    x = ctx.v(src)
    before, after = ctx.shape_of(src), ctx.shape_of(node)
    k = len(x.shape)
    if before == after:
        return x.text, x.shape
    if after == before + (1,):
        return f"{x.text}[.., None]", x.shape + (1,)
    if before == after + (1,):
        return (f"{x.text}[.., 0]", x.shape[:-1]) if k else (x.text, x.shape)
    lead = len(after) - len(before)
    if lead > 0 and after[lead:] == before and set(after[:lead]) == {1}:
        return x.text, x.shape
    if lead < 0 and before[-lead:] == after and set(before[:-lead]) == {1}:
        if k <= len(after):
            return x.text, x.shape
        return _drop_leading_ones(src, x, k - len(after), ctx)
    # Size-1 axes removed and inserted anywhere, the others in order: each size-1 axis selected
    # away, then each new one inserted (the value at the full rank only).
    if k == len(before) and [d for d in before if d != 1] == [d for d in after if d != 1]:
        text = x.text
        if 1 in before:
            text = f"{text}[{', '.join('0' if d == 1 else ':' for d in before)}]"
        if 1 in after:
            text = f"{text}[{', '.join('None' if d == 1 else ':' for d in after)}]"
        return text, after
    # Constant axes split and merged between whole axes: kfuse's reshape, of the value at its
    # full shape (the tokens of the region, where `constant_sizes` made the regrouped sizes
    # constants).
    groups = regroup(x.shape, after) if k == len(before) else None
    if groups and len(groups[-1][0]) == 1 and len(groups[-1][1]) == 1:
        # The rows stay as they are: PyTorch gives this view of a region's input or output without
        # a copy, and a kernel reading its rows unchanged keeps them in registers.
        raise Refused(f"a view from {list(before)} to {list(after)} regroups leading axes only (PyTorch's, as a view)")
    names = ctx.names or {}
    shape = tuple(after) if groups is not None else _broadcast_view(x, before, after)
    if shape is not None:
        if shape == tuple(x.shape):
            return x.text, x.shape
        written = ", ".join(str(names.get(d, d)) if isinstance(d, str) else str(d) for d in shape)
        return f"reshape({x.text}, [{written}])", shape
    if k != len(before):
        raise Refused(f"a view from {list(before)} to {list(after)} of a value broadcast along its leading axes")
    raise Refused(
        f"a view from {list(before)} to {list(after)} (kfuse reshapes axes of static size between whole axes; "
        "a symbolic size neither splits nor merges)"
    )


def _broadcast_view(x, before, after):
    """The shape of value `x` (broadcast: size 1, or missing leading axes, where the tensor of
    shape `before` it stands for is not) viewed as `after`, when each group of the view (see
    :func:`regroup`) is either broadcast in `x` along all its axes (1s in the result) or held
    whole; None otherwise. The gradient of a sum over merged axes is such a value."""
    xs = (1,) * (len(before) - len(x.shape)) + tuple(x.shape)
    if len(xs) != len(before):
        return None
    groups = regroup(tuple(before), tuple(after))
    if groups is None:
        return None
    shape = list(after)
    for f, to in groups:
        if all(xs[i] == 1 for i in f):
            for j in to:
                shape[j] = 1
        elif any(xs[i] != before[i] for i in f):
            return None
    shape = tuple(shape)
    return shape if regroup(tuple(x.shape), shape) is not None else None


def _unsqueeze(node, a, ctx):
    x = ctx.v(a["self"])
    n = len(ctx.shape_of(a["self"]))
    d = a["dim"] % (n + 1)
    if d == n:
        return f"{x.text}[.., None]", x.shape + (1,)
    k = d - (n - len(x.shape))
    if k <= 0:  # before the value's own axes: it broadcasts there already
        return x.text, x.shape
    return f"{x.text}[{', '.join([':'] * k + ['None', '..'])}]", x.shape[:k] + (1,) + x.shape[k:]


def _expand(node, a, ctx):
    x = ctx.v(a["self"])
    return x.text, x.shape


def _index_text(x, k, item):
    """`x` indexed with `item` at its axis `k`, every other axis whole: ``x[.., item]`` on the
    last axis, else ``x[:, .., item, ..]``."""
    if k == len(x.shape) - 1:
        return f"{x.text}[.., {item}]"
    return f"{x.text}[{', '.join([':'] * k + [item, '..'])}]"


def _view_axis(x, a, ctx, what):
    """Value `x` of argument ``self``, its torch shape, and the axis `k` of `x` that torch's axis
    ``dim`` is (negative where `x` broadcasts along the leading axis it lacks)."""
    full = ctx.shape_of(a["self"])
    if not full:
        raise Refused(f"a {what} of a scalar")
    d = a["dim"] % len(full)
    return full, d, d - (len(full) - len(x.shape))


def _select(node, a, ctx):
    x = ctx.v(a["self"])
    full, d, k = _view_axis(x, a, ctx, "select")
    if k < 0:  # an axis the value is broadcast along: the same value at every index
        return x.text, x.shape
    i = a["index"]
    if x.shape[k] == 1:  # a size-1 axis of the value (torch's may be broadcast): its only element
        i = 0
    elif not isinstance(i, int):
        raise Refused(f"a select at a symbolic index {i}")
    elif i < 0:
        if not isinstance(full[d], int):
            raise Refused(f"a select at index {i} of an axis of symbolic size {full[d]}")
        i += full[d]
    return _index_text(x, k, str(i)), x.shape[:k] + x.shape[k + 1 :]


# torch writes an open end (`x[2:]`) as this end or beyond.
_OPEN_END = 1 << 62


def _picked(a, size, what):
    """The positions a slice (``start``, ``end``, ``step`` of `a`) reads of an axis of `size`, as
    a range, or None for the whole of an axis of symbolic size (`x[:]`, `x[0:]`). Bounds must be
    constants and the step positive; on a symbolic axis, an end must be given (the result's size
    is a constant)."""
    start, end, step = a.get("start"), a.get("end"), a.get("step")
    step = 1 if step is None else step
    if not all(v is None or isinstance(v, int) for v in (start, end, step)) or step < 1:
        raise Refused(f"a {what} {start}:{end}:{step} (kfuse slices with constant bounds and a positive step)")
    if isinstance(size, int):
        picked = range(size)[slice(start, end, step)]
    else:
        start = start or 0
        if end is None or end >= _OPEN_END:
            if start == 0 and step == 1:
                return None
            raise Refused(f"a {what} {start}:{end}:{step} of an axis of symbolic size {size} (kfuse needs an end)")
        if start < 0 or end < 0:
            raise Refused(f"a {what} {start}:{end}:{step} of an axis of symbolic size {size} (kfuse needs bounds >= 0)")
        picked = range(start, end, step)
    if not picked:
        raise Refused(f"an empty {what}")
    return picked


def _slice(node, a, ctx):
    x = ctx.v(a["self"])
    full, d, k = _view_axis(x, a, ctx, "slice")
    picked = _picked(a, full[d], "slice")
    if picked is None or len(picked) == full[d] or k < 0 or x.shape[k] == 1:
        # All of it, or an axis the value is broadcast along.
        return x.text, x.shape
    item = f"{picked.start}:{picked.stop}:{picked.step}"
    return _index_text(x, k, item), x.shape[:k] + (dim_token(len(picked)),) + x.shape[k + 1 :]


def _size_i64(ctx, size):
    """An axis's size as an i64 value's text: a constant, or kfuse's `size` of its symbol."""
    return literal(size) if isinstance(size, int) else f"i64({ctx.size(size)})"


def _roll(node, a, ctx):
    """`roll(x, shifts, dims)`: along each axis, the element `shift` places back, cyclically: a
    gather at `(position - shift) mod size`, positions counted with `iota` of `x` itself. Along an
    axis where a broadcast `x` does not vary, nothing moves."""
    full = ctx.shape_of(a["self"])
    shifts, dims = list(a["shifts"]), list(a.get("dims") or [])
    if not dims or len(dims) != len(shifts):
        raise Refused("a roll of the flattened tensor (kfuse rolls along given axes)")
    x = ctx.v(a["self"])
    if not _broadcasts(x.shape, full):
        raise Refused("a roll of a value that does not broadcast to its expanded shape")
    lead, still = len(full) - len(x.shape), _broadcast_axes(x, full)
    text = x.text
    for shift, d in zip(shifts, dims):
        if not isinstance(shift, int):
            raise Refused("a roll by a shift that is not a constant")
        d %= len(full)
        if d in still:
            continue
        at = f"remainder(i64(iota({text}, axis: {d - lead})) - {shift}, {_size_i64(ctx, full[d])})"
        text = f"gather({text}, {at}, axis: {d - lead})"
    return text, tuple(x.shape)


def _flip(node, a, ctx):
    """`flip(x, dims)`: along each axis, the element at `size - 1 - position` (a gather); along an
    axis where a broadcast `x` does not vary, `x` itself."""
    full = ctx.shape_of(a["self"])
    x = ctx.v(a["self"])
    if not _broadcasts(x.shape, full):
        raise Refused("a flip of a value that does not broadcast to its expanded shape")
    lead, still = len(full) - len(x.shape), _broadcast_axes(x, full)
    text = x.text
    for d in sorted({d % len(full) for d in a["dims"]}) if full else []:
        if d in still:
            continue
        at = f"{_size_i64(ctx, full[d])} - 1 - i64(iota({text}, axis: {d - lead}))"
        text = f"gather({text}, {at}, axis: {d - lead})"
    return text, tuple(x.shape)


def _permute_to(x, n, dims, what):
    """`x` with its axes reordered as torch's `dims` reorders a tensor of rank `n`."""
    dims = [d % n for d in dims]
    if dims == list(range(n)):
        return x.text, x.shape
    if len(x.shape) < n:
        raise Refused(f"a {what} of a value broadcast along leading axes")
    return f"permute({x.text}, [{', '.join(map(str, dims))}])", tuple(x.shape[p] for p in dims)


def _permute(node, a, ctx):
    x = ctx.v(a["self"])
    return _permute_to(x, len(ctx.shape_of(a["self"])), list(a["dims"]), "permute")


def _transpose(node, a, ctx):
    x = ctx.v(a["self"])
    n = len(ctx.shape_of(a["self"]))
    if n < 2:
        return x.text, x.shape
    dims = list(range(n))
    d0, d1 = a["dim0"] % n, a["dim1"] % n
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return _permute_to(x, n, dims, "transpose")


def _t(node, a, ctx):
    x = ctx.v(a["self"])
    n = len(ctx.shape_of(a["self"]))
    return _permute_to(x, n, [1, 0], "transpose") if n == 2 else (x.text, x.shape)


def _broadcasts(shape, full):
    """Whether a value of kfuse shape `shape` broadcasts to `full` (trailing axes aligned, as torch
    and kfuse broadcast)."""
    lead = len(full) - len(shape)
    return lead >= 0 and all(s == f or s == 1 for s, f in zip(shape, full[lead:]))


def _at_full_shape(node, x, full, ctx, what):
    """`x` at its full torch shape `full` where kfuse keeps it broadcast (PyTorch's expand of a
    smaller value): a `where` over the positions of a tensor of the region with that shape, which
    reads `x` at each element and copies nothing."""
    if x.shape == full:
        return x
    if not _broadcasts(x.shape, full):
        raise Refused(f"{what} of a value that does not broadcast to its expanded shape")
    shaped = _positions(node, full, 0, ctx, f"{what} of a broadcast (expanded) value")
    return V(f"where({shaped} >= 0, {x.text}, {x.text})", full, x.dtype, x.scalar)


def _full(a, name, ctx, what):
    """The value of argument `name` at its full torch shape (an axis-wise op reads it whole)."""
    x = ctx.v(a[name])
    full = ctx.shape_of(a[name])
    if x.shape != full:
        raise Refused(f"{what} of a broadcast (expanded) value")
    return x, full


def _softmax(fn):
    """`_softmax` / `_log_softmax` along one axis: kfuse's `softmax` / `log_softmax` (shifted by
    the axis's maximum, as PyTorch computes them)."""

    def rule(node, a, ctx):
        x, full = _full(a, "self", ctx, f"a {fn}")
        if not full:
            raise Refused(f"a {fn} of a scalar")
        axis = a["dim"] % len(full)
        return f"{fn}({_cast_to(x, ctx.out_dtype)}, axis: {axis})", x.shape

    return rule


def _arg_extremum(fn):
    """`argmax` / `argmin` along one axis, or over every element (torch's flat index): kfuse's,
    an i64."""

    def rule(node, a, ctx):
        x, full = _full(a, "self", ctx, f"an {fn}")
        if not full:
            raise Refused(f"an {fn} of a scalar")
        keep = bool(a.get("keepdim"))
        if a.get("dim") is None:
            return f"{fn}({x.text}{', keepdim: true' if keep else ''})", (1,) * len(full) if keep else ()
        d = a["dim"] % len(full)
        shape = full[:d] + ((1,) if keep else ()) + full[d + 1 :]
        return f"{fn}({x.text}, axis: {d}{', keepdim: true' if keep else ''})", shape

    return rule


def _gather(node, a, ctx):
    """`gather(self, dim, index)`: kfuse's `gather` (the index has the result's shape, equal to
    the source's on every other axis). A source PyTorch expanded (a class weight per label:
    `weight[None].expand(B, C)`) is read at its full shape (see `_at_full_shape`)."""
    full = ctx.shape_of(a["self"])
    x = _at_full_shape(node, ctx.v(a["self"]), full, ctx, "a gather")
    i, ifull = _full(a, "index", ctx, "a gather")
    n = len(full)
    if n == 0 or len(ifull) != n:
        raise Refused("a gather whose index has another rank than its source")
    d = a["dim"] % n
    if any(ifull[k] != full[k] for k in range(n) if k != d):
        raise Refused("a gather whose index is smaller than its source on an axis it does not gather along")
    return f"gather({_cast_to(x, ctx.out_dtype)}, {i.text}, axis: {d})", ifull


def _index_select(node, a, ctx):
    """`index_select(self, dim, index)`: the rows of `self` along `dim` at a 1-D index (see
    :func:`_rows_at`)."""
    full = ctx.shape_of(a["self"])
    if not full:
        raise Refused("an index_select of a scalar")
    i, ifull = _full(a, "index", ctx, "an index_select")
    return _rows_at(node, a, ctx, a["dim"] % len(full), i, ifull, "an index_select")


def _index_tensor(node, a, ctx):
    """`x[..., idx, ...]` (`index.Tensor`) with one 1-D integer index on one axis and every other
    axis whole: the rows of `x` along that axis at `idx`, a negative index counting from the end
    as in PyTorch (see :func:`_rows_at`). Boolean masks (a result whose size depends on values)
    and indices on several axes stay in PyTorch."""
    full = ctx.shape_of(a["self"])
    indices = list(a["indices"] or [])
    given = [d for d, t in enumerate(indices) if t is not None]
    if len(given) != 1 or not full or given[0] >= len(full):
        raise Refused("advanced indexing on other than one axis")
    d = given[0]
    t = fake(indices[d])
    if t is None or t.dtype not in (torch.int32, torch.int64):
        raise Refused("advanced indexing by a mask or a tensor that is not of integers")
    i, ifull = ctx.v(indices[d]), ctx.shape_of(indices[d])
    if i.shape != ifull:
        raise Refused("advanced indexing by a broadcast (expanded) index")
    size = _size_i64(ctx, full[d])
    wrapped = V(f"where(i64({i.text}) < 0, i64({i.text}) + {size}, i64({i.text}))", ifull, "i64", i.scalar)
    return _rows_at(node, a, ctx, d, wrapped, ifull, "an indexing")


def _rows_at(node, a, ctx, d, i, ifull, what):
    """The rows of argument `self` along axis `d` at the 1-D index value `i` (torch shape
    `ifull`): a gather whose index is `i` broadcast over the other axes (added to the zeros that
    `iota` counts along a size-1 slice of `self`, so nothing is materialised)."""
    full = ctx.shape_of(a["self"])
    if len(ifull) > 1:
        raise Refused(f"{what} by an index of more than one axis")
    x = _at_full_shape(node, ctx.v(a["self"]), full, ctx, what)
    zeros = f"i64(iota({_index_text(x, d, '0:1')}, axis: {d}))"
    at = f"i64({i.text})" + "[.., None]" * (len(full) - 1 - d)
    shape = full[:d] + (ifull[0] if ifull else 1,) + full[d + 1 :]
    return f"gather({_cast_to(x, ctx.out_dtype)}, {zeros} + {at}, axis: {d})", shape


def _embedding(node, a, ctx):
    """`embedding(weight, indices)` by 1-D indices: the rows of the 2-D `weight` at them (see
    :func:`_rows_at`). `padding_idx` and the other arguments concern only the gradient, which
    PyTorch computes."""
    if len(ctx.shape_of(a["weight"])) != 2:
        raise Refused("an embedding of a weight that is not 2-D")
    i, ifull = _full(a, "indices", ctx, "an embedding")
    if len(ifull) != 1:
        raise Refused("an embedding by indices of other than one axis")
    return _rows_at(node, {"self": a["weight"]}, ctx, 0, i, ifull, "an embedding")


def _scatter_value(node, a, ctx):
    """`scatter(self, dim, index, value)` with one index along `dim` (what the backward of
    `gather`, and so of `nll_loss` and `cross_entropy`, gives): `value` where the position along
    `dim` equals the index, `self` elsewhere. The positions are kfuse's `iota` along that axis of
    a tensor of the region with the result's shape. `scatter(self, dim, index, src)` with `src` of
    the index's shape (the backward of `max.dim`) is the same with `src` as the value, broadcast
    along `dim`."""
    if node.target not in (aten.scatter.value, aten.scatter.src):
        raise Refused(f"{node.target} (kfuse writes a single value, as scatter.value)")
    full = ctx.shape_of(node)
    n = len(full)
    # The index (and a source) need only broadcast over the positions: an unsqueezed index is one.
    i, ifull = ctx.v(a["index"]), ctx.shape_of(a["index"])
    if not _broadcasts(i.shape, ifull):
        raise Refused("a scatter of an index that does not broadcast to its shape")
    if n == 0 or len(ifull) != n:
        raise Refused("a scatter whose index has another rank than its destination")
    d = a["dim"] % n
    if ifull[d] != 1 or any(ifull[k] != full[k] for k in range(n) if k != d):
        raise Refused("a scatter of more than one index along its axis (kfuse writes one, as gather's backward)")
    if node.target is aten.scatter.src and ctx.shape_of(a["src"]) != ifull:
        raise Refused("a scatter whose source is not the index's shape")
    c = _positions(node, full, d, ctx, "a scatter")
    x, v = ctx.v(a["self"]), ctx.v(a["value" if node.target is aten.scatter.value else "src"])
    out = ctx.out_dtype
    hit = f"{c} == i64({i.text})"
    return f"where({hit}, {_cast_to(v, out)}, {_cast_to(x, out)})", full


def _positions(node, full, d, ctx, what):
    """The text of each element's position along axis `d` of the result (kfuse's `iota` of a
    tensor of the region with the result's shape `full`), as an i64."""
    shaped = next((v.text for v in ctx.values.values() if v.shape == full), None)
    if shaped is None:
        if not ctx.partial:
            raise Refused(f"{what} into {list(full)}, a shape no tensor of its region has (kfuse counts positions with iota)")
        shaped = "0"  # whether a tensor of the region has this shape is known with the region
    return f"i64(iota({shaped}, axis: {d}))"


def _slice_scatter(node, a, ctx):
    """`slice_scatter(self, src, dim, start, end, step)` (a slice's backward): `src` at the
    positions the slice reads, `self` elsewhere; `src` is read at position `(c - start) / step`."""
    full = ctx.shape_of(node)
    if not full:
        raise Refused("a slice_scatter into a scalar")
    d = a["dim"] % len(full)
    src, sfull = _full(a, "src", ctx, "a slice_scatter")
    picked = _picked(a, full[d], "slice_scatter")
    if picked is None and tuple(sfull) == tuple(full):
        # The whole of an axis of symbolic size (the backward of `x[:, ...]`): the source.
        return _cast_to(src, ctx.out_dtype), full
    if picked is None or len(sfull) != len(full) or sfull[d] != len(picked):
        raise Refused("a slice_scatter whose source is not the slice's shape")
    c = _positions(node, full, d, ctx, "a slice_scatter")
    b0, m, s = picked.start, len(picked), picked.step
    inside = f"({c} >= {b0}) and ({c} <= {b0 + (m - 1) * s})"
    if s != 1 and m > 1:
        inside += f" and (({c} - {b0}) % {s} == 0)"
    j = f"clamp({c} - {b0}, 0, {m - 1})" if s == 1 else f"clamp(({c} - {b0}) // {s}, 0, {m - 1})"
    out = ctx.out_dtype
    x = ctx.v(a["self"])
    return f"where({inside}, gather({_cast_to(src, out)}, {j}, axis: {d}), {_cast_to(x, out)})", full


def _select_scatter(node, a, ctx):
    """`select_scatter(self, src, dim, index)` (a select's backward): `src` at `index` along
    `dim`, `self` elsewhere."""
    full = ctx.shape_of(node)
    n = len(full)
    if not n:
        raise Refused("a select_scatter into a scalar")
    d = a["dim"] % n
    src, _ = _full(a, "src", ctx, "a select_scatter")
    i = a["index"]
    if not isinstance(i, int) or (i < 0 and not isinstance(full[d], int)):
        raise Refused(f"a select_scatter at index {i}")
    i = i % full[d] if i < 0 else i
    c = _positions(node, full, d, ctx, "a select_scatter")
    placed = f"{src.text}[.., None]" if d == n - 1 else f"{src.text}[{', '.join([':'] * d + ['None', '..'])}]"
    out = ctx.out_dtype
    x = ctx.v(a["self"])
    return f"where({c} == {i}, {_cast_to(V(placed, full, src.dtype), out)}, {_cast_to(x, out)})", full


# The name of the region input that keys every random draw of a region (see `_rand_like`).
SEED = "seed"


def _rand_like(node, a, ctx):
    """`rand_like(self)`: kfuse's `rand_like` of the region's seed (an i64 input the backend
    draws from torch's default generator on each call) plus the draw's number in the region, so
    that two draws of one region differ. The value at each element depends on its flat index in
    the torch shape, so the operand must be held at that shape."""
    x, _ = _full(a, "self", ctx, "a rand_like")
    if a.get("layout") not in (None, torch.strided) or a.get("memory_format") not in (None, torch.preserve_format):
        raise Refused("a rand_like with a layout or memory format kfuse does not express")
    if ctx.out_dtype not in ("f32", "f16", "bf16"):
        raise Refused(f"a rand_like of dtype {ctx.out_dtype}")
    k = len(ctx.draws)
    ctx.draws.append(node)
    seed = SEED if k == 0 else f"{SEED} + {k}"
    return f"rand_like({x.text}, {seed})", x.shape


RULES = {
    aten.slice: _slice,
    aten.permute: _permute,
    aten.transpose: _transpose,
    aten.t: _t,
    aten.slice_scatter: _slice_scatter,
    aten.roll: _roll,
    aten.flip: _flip,
    aten.argmax: _arg_extremum("argmax"),
    aten.argmin: _arg_extremum("argmin"),
    aten.select_scatter: _select_scatter,
    aten.add: _infix("+"),
    aten.sub: _infix("-"),
    aten.rsub: _rsub,
    aten.mul: _infix("*"),
    aten.constant_pad_nd: _constant_pad_nd,
    aten.div: _div,
    aten.true_divide: _div,
    aten.pow: _pow,
    aten.remainder: _infix("%"),
    aten.floor_divide: _infix("//"),
    aten.maximum: _call("max", "self", "other"),
    aten.minimum: _call("min", "self", "other"),
    aten.atan2: _call("atan2", "self", "other"),
    aten.fmod: _call("fmod", "self", "other"),
    aten.hypot: _call("hypot", "self", "other"),
    aten.copysign: _call("copysign", "self", "other"),
    aten.fmax: _nan_ignoring("max"),
    aten.fmin: _nan_ignoring("min"),
    aten.signbit: _signbit,
    aten.bitwise_left_shift: _call("bitwise_left_shift", "self", "other"),
    aten.bitwise_right_shift: _call("bitwise_right_shift", "self", "other"),
    aten.__lshift__: _call("bitwise_left_shift", "self", "other"),
    aten.__rshift__: _call("bitwise_right_shift", "self", "other"),
    aten.square: _unary("{x} * {x}"),
    aten.positive: _unary("{x}"),
    aten.eq: _compare("=="),
    aten.ne: _compare("!="),
    aten.lt: _compare("<"),
    aten.le: _compare("<="),
    aten.gt: _compare(">"),
    aten.ge: _compare(">="),
    aten.logical_and: _logical("and"),
    aten.logical_or: _logical("or"),
    aten.logical_xor: _logical("!="),
    aten.logical_not: _unary("not bool({x})"),
    aten.bitwise_and: _infix("&", cast=False),
    aten.bitwise_or: _infix("|", cast=False),
    aten.bitwise_xor: _infix("^", cast=False),
    aten.bitwise_not: _unary("~{x}"),
    aten.where: _where,
    aten.clamp: _clamp,
    aten.clip: _clamp,
    aten.clamp_min: lambda n, a, c: _clamp(n, {"self": a["self"], "min": a["min"], "max": None}, c),
    aten.clamp_max: lambda n, a, c: _clamp(n, {"self": a["self"], "min": None, "max": a["max"]}, c),
    aten.neg: _unary("-{x}"),
    aten.reciprocal: _unary("1 / {x}"),
    aten.relu: _unary("max({x}, 0)"),
    aten.silu: _unary("{x} * sigmoid({x})"),
    aten.gelu: _gelu,
    aten.clone: _identity,
    aten.alias: _identity,
    aten._to_copy: _cast,
    prims.convert_element_type: _cast,
    aten.arange: _arange,
    aten.full: _constant,
    aten.full_like: _constant,
    aten.zeros_like: _constant,
    aten.ones_like: _constant,
    aten.scalar_tensor: _constant,
    **dict.fromkeys(_EMPTY, _constant),
    aten.sum: _reduce("sum"),
    aten.mean: _reduce("mean"),
    aten.amax: _reduce("max"),
    aten.amin: _reduce("min"),
    aten.any: _any,
    aten.prod: _prod,
    aten.view: _reshape_by_shapes,
    aten.as_strided: _as_strided,
    aten._unsafe_view: _reshape_by_shapes,
    aten.reshape: _reshape_by_shapes,
    aten.squeeze: _reshape_by_shapes,
    aten.unsqueeze: _unsqueeze,
    aten.expand: _expand,
    aten.select: _select,
    aten.cat: _cat,
    aten._softmax: _softmax("softmax"),
    aten._log_softmax: _softmax("log_softmax"),
    aten.gather: _gather,
    aten.index_select: _index_select,
    aten.index: _index_tensor,
    aten.embedding: _embedding,
    aten.scatter: _scatter_value,
    aten.rand_like: _rand_like,
    aten.sym_numel: _sym_size,
    aten.sym_size: _sym_size,
}
_REDUCTIONS = (aten.sum, aten.mean, aten.amax, aten.amin, aten.prod)
for _name in (
    "abs exp log sqrt rsqrt sigmoid tanh erf sin cos floor ceil trunc sign log1p expm1 atan tan asin acos "
    "sinh cosh asinh acosh atanh round lgamma digamma erfinv erfc"
).split():
    RULES[getattr(aten, _name)] = _unary(_name + "({x})")
# Powers of 2 and logarithms of bases 2 and 10, through e (within an ulp or two of torch's).
RULES[aten.exp2] = _unary("exp({x} * 0.6931471805599453)")
RULES[aten.log2] = _unary("log({x}) * 1.4426950408889634")
RULES[aten.log10] = _unary("log({x}) * 0.4342944819032518")
for _name in ("isnan", "isinf", "isfinite"):
    RULES[getattr(aten, _name)] = _unary(_name + "({x})", cast=False)


_TRIGAMMA = _unary("trigamma({x})")


def _polygamma(node, a, ctx):
    """torch.special.polygamma of order 1 (digamma's backward) is kfuse's trigamma."""
    if a["n"] != 1:
        raise Refused(f"polygamma of order {a['n']} (kfuse computes order 1, trigamma)")
    return _TRIGAMMA(node, a, ctx)


RULES[aten.polygamma] = _polygamma


def rule_of(node):
    """The rule for an fx node, or raises :class:`Refused` with the reason."""
    if node.op != "call_function":
        raise Refused(f"{node.op} nodes stay in PyTorch")
    if node.target in _SIZE_ARITHMETIC and len(node.args) == 2 and not node.kwargs:
        if scalar_dtype(node) is None:
            raise Refused("arithmetic on values that are not numbers")
        return _size_arithmetic, {"a": node.args[0], "b": node.args[1]}
    if node.target is torch.sym_float and len(node.args) == 1 and not node.kwargs:
        # A size as a float (a variance's correction `n / (n - 1)` over an axis of a size known
        # only at run time): f32, as the arithmetic on it is.
        return (lambda node, a, ctx: (_cast_to(ctx.v(a["a"]), "f32"), ())), {"a": node.args[0]}
    packet = getattr(node.target, "overloadpacket", None)
    rule = RULES.get(packet)
    if rule is None:
        raise Refused("kfuse has no lowering of this operation")
    a = bind(node)
    if a.get("out") is not None or a.get("decimals") not in (None, 0):
        raise Refused("an overload with arguments kfuse does not express")
    return rule, a


class _Ctx:
    """What a rule sees: the lowered values of the region's nodes and the output dtype."""

    def __init__(self, values, out_dtype, partial=False, draws=None, names=None):
        # `partial`: `values` holds a node's own operands only, not its whole region.
        self.values, self.out_dtype, self.partial = values, out_dtype, partial
        # The region's random draws so far (shared by its nodes' contexts, see `_rand_like`).
        self.draws = [] if draws is None else draws
        self.names = names  # size token -> the symbol's name in the text (None: `partial`)

    def size(self, token):
        """The text of the size `token` (of a tensor of the region) as a value."""
        if self.names is None:
            return f"size({token})"
        if token not in self.names:
            raise Refused(f"the size `{token}` is no axis of the region's inputs")
        return f"size({self.names[token]})"

    def v(self, x):
        if isinstance(x, torch.fx.Node):
            got = self.values.get(x)
            if got is None:
                raise Refused(f"the argument `{x.name}` is not a tensor kfuse reads")
            return got
        if isinstance(x, (bool, int, float)):
            return V(literal(x), (), None, scalar=True)
        raise Refused(f"the argument {x!r} is not a tensor or a number")

    def size_or_v(self, x):
        """`v(x)`, but an integer literal that is a product of static sizes as that size (see
        :func:`static_size`)."""
        size = static_size(x, self.names)
        return V(size, (), "i64") if size is not None else self.v(x)

    def shape_of(self, node):
        t = fake(node)
        if t is None:
            raise Refused(f"`{node}` has no tensor metadata")
        return shape_tokens(t)


def check_tensor(t, what):
    if t is None:
        raise Refused(f"{what} is not a tensor with metadata")
    value_dtype(t)
    shape_tokens(t)


def size_value(d, names):
    """The value of a size passed as a scalar (a SymInt of dynamic shapes, as `N` in layer norm's
    backward): kfuse's `size` of the symbol, which an input of the region must have as an axis
    (`names`: token -> symbol name; None when that is checked later)."""
    tok = dim_token(d)
    if isinstance(tok, int):
        return V(literal(tok), (), None, scalar=True)
    if names is None:
        return V(f"size({tok})", (), "i32")
    if tok not in names:
        raise Refused(f"the size `{d}` is no axis of the region's inputs")
    return V(f"size({names[tok]})", (), "i32")


def _size_product(symbols, coeff, names):
    """The canonical text of the size `coeff * prod(symbols)` (symbols: names in the text, each
    once per power), or None when it has no symbol: the constant is first divided by the static
    sizes of the region's inputs it holds (each at most once, in the symbols' order: a static
    size is a symbol too), then the factors are written in the symbols' order, what is left of
    the constant last. A static graph and a dynamic one write a size they compute (a mean's
    divisor, `numel`) with this text, so that they lower to one program."""
    symbols = list(symbols)
    for tok, name in names.items():
        if isinstance(tok, str) and tok.startswith("D") and tok[1:].isdigit():
            size = int(tok[1:])
            if size > 1 and coeff % size == 0:
                symbols.append(name)
                coeff //= size
    if not symbols:
        return None
    order = {n: i for i, n in enumerate(names.values())}
    factors = [f"i64(size({n}))" for n in sorted(symbols, key=order.__getitem__)]
    if coeff != 1:
        factors.append(literal(int(coeff)))
    return "(" + " * ".join(factors) + ")"


def symbolic_size(value, names):
    """The canonical text (see :func:`_size_product`) of a SymInt that is a product of sizes of
    the region's inputs and a positive constant, or None."""
    if not isinstance(value, torch.SymInt) or names is None:
        return None
    coeff, factors = value.node.expr.as_coeff_mul()
    symbols = []
    for f in factors:
        base, exp = f.as_base_exp()
        if not (base.is_Symbol and exp.is_Integer and int(exp) > 0):
            return None
        tok = _symbol_token(base)
        if tok not in names:
            return None
        symbols += [names[tok]] * int(exp)
    if not symbols or not coeff.is_Integer or int(coeff) < 1:
        return None
    return _size_product(symbols, int(coeff), names)


def static_size(x, names):
    """The canonical text (see :func:`_size_product`) of an integer literal that is a product of
    static sizes of the region's inputs and a constant (a static graph's mean divisor), or None.
    A static graph runs at its own sizes only (Dynamo guards them), where the two agree."""
    if isinstance(x, bool) or not isinstance(x, int) or x < 2 or not names:
        return None
    return _size_product([], x, names)


def supported(node):
    """None if kfuse can express `node` alone (its operands at their full shapes), else the
    reason it cannot."""
    try:
        with constant_sizes([node]):
            rule, a = rule_of(node)
            out = scalar_dtype(node)
            if out is None:
                check_tensor(fake(node), "its result")
                out = value_dtype(fake(node))
            values = {}
            for x in node.all_input_nodes:
                t = fake(x)
                if t is not None:
                    check_tensor(t, f"`{x.name}`")
                    values[x] = V(x.name, shape_tokens(t), value_dtype(t))
                elif x.op == "placeholder" and isinstance(x.meta.get("val"), torch.SymInt):
                    values[x] = size_value(x.meta["val"], None)
                elif x.op == "call_function" and scalar_dtype(x) is not None:
                    values[x] = V(x.name, (), scalar_dtype(x))  # arithmetic on sizes, in the region
            rule(node, a, _Ctx(values, out, partial=True))
    except Refused as e:
        return str(e)
    except Exception as e:  # anything unexpected: the op stays in PyTorch
        return f"unexpected {type(e).__name__}: {e}"
    return None


class Lowered:
    """A region as ``.kf`` text: `inputs` are (placeholder position, input name), `outputs` per
    region output its torch shape tokens and whether the program's result needs expanding to it;
    `symbols` maps each symbol to (placeholder position, axis) to read its size at run time;
    `views` holds the outputs torch itself gives as broadcast views (a zero stride): the others are
    written in full once expanded (a caller may write into them, as into `zeros_like`'s);
    `seeded` says whether the program takes the i64 input :data:`SEED`, drawn on each call."""

    def __init__(self, text, inputs, outputs, symbols, ops, views=frozenset(), seeded=False):
        self.text, self.inputs, self.outputs, self.symbols, self.ops = text, inputs, outputs, symbols, ops
        self.views, self.seeded = views, seeded


def _stored_unrounded(lines):
    """`lines` without the `rounded` of values that only outputs read: storing an f16/bf16 value
    rounds it the same way, so the kernel need not round it first."""
    read = {}
    for line in lines:
        if line.startswith("let "):
            for name in set(re.findall(r"\bt\d+\b", line.split(" = ", 1)[1])):
                read[name] = read.get(name, 0) + 1
    out = []
    for line in lines:
        name, _, text = line[len("let "):].partition(" = ") if line.startswith("let ") else ("", "", "")
        if text.startswith("rounded(") and text.endswith(")") and not read.get(name):
            line = f"let {name} = {text[len('rounded('):-1]}"
        out.append(line)
    return out


def lower_region(gm):
    """The ``.kf`` program of an fx graph module whose nodes are all supported ops. Symbols are
    named ``N0, N1, ...`` in order of appearance, so that the same region at other static sizes
    has the same text (and program)."""
    with constant_sizes(gm.graph.nodes):
        return _lower_region(gm)


def _lower_region(gm):
    decls, lines, values, inputs, symbols, ops = [], [], {}, [], {}, []
    names = {}  # token -> the symbol's name in the text
    sizes = []  # placeholders of sizes, not yet given a value
    outputs_node = None
    devices = set()
    draws = []  # the region's rand_like nodes, numbered in order
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # Every input first: a submodule's placeholders come where a node first reads them, and a
    # rule may read an input's shape before that (arange's `iota`).
    for node in placeholders + [n for n in gm.graph.nodes if n.op != "placeholder"]:
        if node.op == "placeholder":
            t = fake(node)
            if t is None:
                if isinstance(node.meta.get("val"), torch.SymInt):
                    sizes.append(node)  # a size argument: its symbol's name is known once all inputs are
                continue
            name = f"a{len(inputs)}"
            tokens = shape_tokens(t)
            devices.add(t.device)
            for axis, tok in enumerate(tokens):
                if isinstance(tok, str) and tok not in names:
                    names[tok] = f"N{len(names)}"
                    symbols[names[tok]] = (placeholders.index(node), axis)
            dims = ", ".join(str(names.get(d, d)) for d in tokens)
            decls.append(f"input {name}: {kf_dtype(t.dtype)}[{dims}]" if tokens else f"input {name}: {kf_dtype(t.dtype)}")
            values[node] = V(name, tokens, kf_dtype(t.dtype))
            inputs.append((placeholders.index(node), name))
        elif node.op == "call_function":
            for x in sizes:
                try:
                    values[x] = size_value(x.meta["val"], names)
                except Refused:
                    pass  # a rule that reads it says why
            sizes = []
            size = symbolic_size(node.meta.get("val"), names)
            if size is not None:
                # A size the graph computes: written where it is used, in one canonical form.
                values[node] = V(size, (), "i64")
                ops.append(str(node.target))
                continue
            try:
                rule, a = rule_of(node)
                t = fake(node)
                dtype = scalar_dtype(node)
                if dtype is None:
                    check_tensor(t, f"the result of `{node.name}`")
                    dtype = value_dtype(t)
                text, shape = rule(node, a, _Ctx(values, dtype, draws=draws, names=names))
                if t is not None and broadcast(shape, shape_tokens(t)) != shape_tokens(t):
                    raise Refused(f"the value would have shape {list(shape)} where torch has {list(shape_tokens(t))}")
            except Refused as e:
                e.node = node.name  # the op to partition again without
                raise
            name = f"t{len(lines)}"
            if dtype in ("f16", "bf16"):
                # Rounded to its dtype as PyTorch rounds every op's result: a value that one
                # program stores and another computes again is then the same (see `rounded`;
                # kfuse drops it where the value already is: an input, a rounded value).
                lines.append(f"let {name} = rounded({dtype}({text}))")
            else:
                lines.append(f"let {name} = {dtype}({text})")
            values[node] = V(name, shape, dtype)
            ops.append(str(node.target))
        elif node.op == "output":
            outputs_node = node
        else:
            raise Refused(f"a {node.op} node inside the region")
    if len(devices) > 1:
        raise Refused(f"inputs on several devices ({', '.join(sorted(map(str, devices)))})")

    def named(shape):
        if any(isinstance(d, str) and d not in names for d in shape):
            raise Refused(f"an output of shape {list(shape)} has a size no input has")
        return tuple(names.get(d, d) for d in shape)

    result = outputs_node.args[0]
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    outputs = []
    for i, o in enumerate(outs):
        v = values.get(o)
        if v is None or fake(o) is None:
            e = Refused("a region output that is not a tensor computed in the region")
            e.node = getattr(o, "name", None)  # partition again without it
            raise e
        lines.append(f"output o{i} = {v.text}")
        full = shape_tokens(fake(o))
        try:
            outputs.append((named(full), v.shape != full, kf_dtype(fake(o).dtype), named(v.shape)))
        except Refused as e:
            e.node = getattr(o, "name", None)  # partition again without the op that makes it
            raise
    lines = _stored_unrounded(lines)
    views = frozenset(i for i, o in enumerate(outs) if any(isinstance(st, int) and st == 0 for st in fake(o).stride()))
    if draws:
        decls.append(f"input {SEED}: i64")
    return Lowered("\n".join(decls + lines) + "\n", inputs, outputs, symbols, ops, views, seeded=bool(draws))
