"""A scalar loss computed with its gradient: the ``torch.compile`` backend's form of kfuse's fused
loss + gradient launch.

The backward of a scalar loss is linear in its one upstream gradient ``t``: ``grad = t * g`` where
``g`` is the backward at ``t = 1``. When everything the backward computes is a kfuse op
(:func:`_lower.supported`), :func:`rewrite` moves it into the forward at ``t = 1``, so that the
forward's region computes the loss and its unscaled gradients in one program (one launch where
kfuse's plan allows: the loss and a gradient that needs the loss's global scale, the mean's
``1 / count``, are one kernel), and the backward is ``kfuse::scale_loss_grad(g, t)``: the
gradient scaled in place by ``t`` on the device, writing nothing when ``t`` is 1 (what
``loss.backward()`` passes), with no synchronisation. That turns a forward that reads the loss's
inputs and a backward that reads them again and writes the gradients into one pass that reads
them once.

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


def random(node):
    """Whether fx node `node` draws random numbers (`rand_like`, `bernoulli`, ...)."""
    return node.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def rewrite(joint, num_fwd_outputs):
    """Rewrites AOTAutograd's joint graph of a scalar loss whose whole backward kfuse lowers, as
    the module says, in place; returns whether it did. Nothing changes otherwise (several or
    non-scalar upstream gradients, an op kfuse does not lower, a random op, a mutation)."""
    from torch._functorch._aot_autograd.functional_utils import _is_functional_graph

    graph = joint.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    tangents = [n for n in placeholders if n.name.startswith("tangents")]
    if len(tangents) != 1 or _is_functional_graph(graph)[0] is not None:
        return False
    (tangent,) = tangents
    t = tangent.meta.get("val")
    if not isinstance(t, torch.Tensor) or t.dim() != 0 or not t.dtype.is_floating_point:
        return False
    output = next(n for n in graph.nodes if n.op == "output")
    grads = list(output.args[0][num_fwd_outputs:])
    # The backward: what autograd added (tagged so by AOTAutograd) and whatever reads the tangent.
    backward = []
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        if n.meta.get("partitioner_tag") == "is_backward" or any(x is tangent or x in backward for x in n.all_input_nodes):
            backward.append(n)
    members = set(backward)
    if not any(g is not None for g in grads) or any(isinstance(g, torch.fx.Node) and g not in members for g in grads):
        return False
    for n in backward:
        if random(n) or _lower.supported(n) is not None or not isinstance(n.meta.get("val"), torch.Tensor):
            return False
    # The backward again, at t = 1, among the forward's nodes; then each gradient scaled by t.
    with graph.inserting_before(output):
        ones = graph.call_function(aten.full.default, ([], 1.0), {"dtype": t.dtype, "device": t.device})
        ones.meta["val"] = t.new_ones(())
        ones.meta["partitioner_tag"] = "is_forward"
        copies = {tangent: ones}
        for n in backward:
            copy = graph.node_copy(n, lambda x: copies.get(x, x))
            copy.meta["partitioner_tag"] = "is_forward"
            copies[n] = copy
        scaled = {}
        for g in grads:
            if isinstance(g, torch.fx.Node) and g not in scaled:
                s = graph.call_function(SCALE, (copies[g], tangent))
                s.meta["val"] = g.meta["val"]
                s.meta["partitioner_tag"] = "is_backward"
                scaled[g] = s
    output.args = ((*output.args[0][:num_fwd_outputs], *[scaled.get(g, g) for g in grads]),)
    for n in reversed(backward):
        graph.erase_node(n)
    graph.lint()
    joint.recompile()
    return True
