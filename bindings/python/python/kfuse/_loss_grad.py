"""A scalar loss computed with its gradient: the ``torch.compile`` backend's form of kfuse's fused
loss + gradient launch.

The backward of a scalar loss is linear in its one upstream gradient ``t``: every value it
computes from ``t`` is ``t`` times that value at ``t = 1``. :func:`rewrite` moves the top of the
backward (the loss's own backward: what kfuse lowers, before anything it does not, such as the
matmul of a model's last layer) into the forward at ``t = 1``, so that the forward's region
computes the loss and the gradient of its inputs in one program (one launch where kfuse's plan
allows it), and the backward scales that gradient by ``t`` (``kfuse::scale_loss_grad``) before
returning it or handing it to the rest of the backward. The scaling is in place on the device and
writes nothing when ``t`` is 1 (what ``loss.backward()`` passes), with no synchronisation. A
forward that reads the loss's inputs and a backward that reads them again to write the gradient
become one pass that reads them once.

Scaling in place hands the forward's saved tensor over as the gradient, which is right only when
nothing reads it again: a backward through a retained graph (``retain_graph=True``: a second
backward may follow) and a gradient that is a view scale out of place instead.
"""

import torch

from . import _lower
from ._autograd import _scale_in_place
from ._errors import Error

aten = torch.ops.aten

_LIB = torch.library.Library("kfuse", "FRAGMENT")
_LIB.define("scale_loss_grad(Tensor grad, Tensor upstream) -> Tensor")


def _scale_loss_grad(grad, upstream):
    """``grad * upstream`` in `grad`'s dtype, for an unscaled gradient that the forward computed
    and saved for this backward alone: in place where nothing reads it again (see the module)."""
    if _reused(grad) or upstream.numel() != 1:
        return (grad * upstream).to(grad.dtype)
    try:
        _scale_in_place(grad, upstream)
    except Error:  # a dtype pair the scaling kernel lacks, a misaligned tensor: out of place
        return (grad * upstream).to(grad.dtype)
    return grad


def _reused(grad):
    """Whether `grad` may be read again after this backward: a view of something else, or a
    backward whose graph is kept (outside a backward, or if PyTorch cannot say, assume so)."""
    if grad._base is not None or not grad.is_contiguous():
        return True
    try:
        return torch._C._autograd._get_current_graph_task_keep_graph()
    except RuntimeError:
        return True


def _scale_loss_grad_fake(grad, upstream):
    return torch.empty_like(grad)


_LIB.impl("scale_loss_grad", _scale_loss_grad, "CompositeExplicitAutograd")
_LIB.impl("scale_loss_grad", _scale_loss_grad_fake, "Meta")
SCALE = torch.ops.kfuse.scale_loss_grad.default


def rewrite(joint, num_fwd_outputs):
    """Rewrites AOTAutograd's joint graph of a scalar loss, in place, as the module says; returns
    whether it did. The part of the backward moved into the forward is its top: the nodes that
    kfuse lowers and that read only forward values, the upstream gradient and one another (the
    loss's own backward; a matmul's backward below it stays in the backward, reading the scaled
    gradient of its output). Nothing changes when the graph has several or non-scalar upstream
    gradients or a mutation, when that top reads no upstream gradient in a computed tensor (only
    a view of it), or when the joint graph does not list its forward before its backward."""
    from torch._functorch._aot_autograd.functional_utils import _is_functional_graph

    graph = joint.graph
    nodes = list(graph.nodes)
    tangents = [n for n in nodes if n.op == "placeholder" and n.name.startswith("tangents")]
    if len(tangents) != 1 or _is_functional_graph(graph)[0] is not None:
        return False
    (tangent,) = tangents
    t = tangent.meta.get("val")
    if not isinstance(t, torch.Tensor) or t.dim() != 0 or not t.dtype.is_floating_point:
        return False
    output = nodes[-1]
    # The backward: what autograd added (tagged so by AOTAutograd) and whatever reads the tangent.
    backward, linear = [], {tangent}  # linear: the values that are the upstream gradient times something
    for n in nodes:
        if n.op != "call_function":
            continue
        reads = n.all_input_nodes
        if n.meta.get("partitioner_tag") == "is_backward" or any(x in linear or x in backward for x in reads):
            backward.append(n)
            if any(x in linear for x in reads):
                linear.add(n)
    if not backward:
        return False
    members = set(backward)
    # Its top, in graph order.
    top = []
    for n in backward:
        ok = not _lower.is_random(n) and isinstance(n.meta.get("val"), torch.Tensor) and _lower.supported(n) is None
        if ok and all(x is tangent or x not in members or x in top for x in n.all_input_nodes):
            top.append(n)
    # Of the values the top computes without the upstream gradient, only those its gradients read:
    # the others (a GELU's derivative below a matmul's backward) stay where the backward reads them.
    moved = set(top)
    needed = set()
    for n in reversed(top):
        if n in linear or n in needed:
            needed.add(n)
            needed.update(x for x in n.all_input_nodes if x in moved)
    top = [n for n in top if n in needed]
    moved = set(top)
    rest = [n for n in backward if n not in moved]
    grads = list(output.args[0][num_fwd_outputs:])
    # The values the rest of the backward and the outputs read from the top. A view of the upstream
    # gradient among them is made again in the backward, of the scaled value it views (no pass
    # over memory), which is handed on in its place.
    edge = {n for n in top if any(u is output or u not in moved for u in n.users)}
    views = set()
    for n in reversed(top):
        if n in edge and n in linear and _lower.is_view(n):
            views.add(n)
            edge.update(x for x in n.all_input_nodes if x in moved)
    scaled_edge = [n for n in top if n in edge and n in linear and n not in views]
    if not scaled_edge:
        return False
    # The new graph: the joint's nodes in order, but at the first node of the rest of the backward
    # (or the output), the top at t = 1 with every forward value it reads that comes later, then
    # each value it hands on, scaled by t; the rest reads those. Built aside and swapped in whole,
    # so that a failure leaves the joint graph as it came.
    at = rest[0] if rest else output
    position = {n: i for i, n in enumerate(nodes)}
    early = set(top)
    stack = list(top)
    while stack:
        for x in stack.pop().all_input_nodes:
            if x not in early and position[x] > position[at] and x is not tangent:
                if x in members or x.op != "call_function":
                    return False
                early.add(x)
                stack.append(x)
    if any(n.meta.get("partitioner_tag") == "is_forward" and n not in early for n in nodes[position[at]:]):
        return False  # a forward value after the backward starts, which the partition would misplace
    new = torch.fx.Graph()
    new._codegen = graph._codegen
    env, handed = {}, {}

    def copy(n, read):
        env[n] = new.node_copy(n, read)
        return env[n]

    def read_handed(x):  # what the backward reads: a value the top hands on, else the copy
        return handed[x] if x in handed else env[x]

    for n in nodes:
        if n is at:
            ones = new.call_function(aten.full.default, ([], 1.0), {"dtype": t.dtype, "device": t.device})
            ones.meta.update(val=t.new_ones(()), partitioner_tag="is_forward")
            for m in sorted(early, key=position.__getitem__):
                made = copy(m, lambda x: ones if x is tangent else env[x])
                made.meta["partitioner_tag"] = "is_forward"
            for m in top:
                if m not in edge:
                    continue
                if m in views:
                    made = new.node_copy(m, read_handed)
                elif m in linear:
                    made = new.call_function(SCALE, (env[m], env[tangent]))
                    made.meta["val"] = m.meta["val"]
                else:  # a forward value the backward computed: the forward's copy, saved
                    handed[m] = env[m]
                    continue
                made.meta["partitioner_tag"] = "is_backward"
                handed[m] = made
        if n in early:
            continue
        if n is output:
            outs = [read_handed(g) if isinstance(g, torch.fx.Node) else g for g in grads]
            fwd = [torch.fx.node.map_arg(o, env.__getitem__) for o in output.args[0][:num_fwd_outputs]]
            env[n] = new.output((*fwd, *outs))
            env[n].meta = dict(output.meta)
            continue
        copy(n, read_handed)
    new.lint()
    joint.graph = new
    joint.recompile()
    return True
