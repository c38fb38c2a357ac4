"""kfuse as a ``torch.compile`` backend: ``torch.compile(fn, backend="kfuse")``.

AOTAutograd traces the forward and the backward into aten graphs (with PyTorch's core
decompositions and :mod:`kfuse._decomp`'s, so losses, norms and activation backwards arrive as
pointwise aten ops and reductions). In each graph
a capability-based partitioner groups the ops kfuse expresses (:mod:`kfuse._lower`) into
regions; each region becomes one ``.kf`` program, compiled once per text (the programs are
generic over the symbols' sizes) and called in place of the region: CPU tensors through the
reference interpreter, CUDA tensors through the fused kernels on the current stream. Everything
else, and every region kfuse refuses or fails to compile, runs as PyTorch runs it; the reasons
are kept for :func:`kfuse.explain`.
"""

import functools
import logging
import operator
import re
import threading

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler, make_boxed_func
from torch._functorch.partitioners import default_partition
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule, fuse_by_partitions

from . import _compiled, _loss_grad, _lower
from ._decomp import decompositions
from ._errors import Error
from ._program import compile as _compile_kf
from ._types import _KD

log = logging.getLogger("kfuse.backend")

# Partitioning is retried without an op that a region could not lower, at most this often.
MAX_ROUNDS = 32
PREFIX = "kfuse_region_"

# ---------------------------------------------------------------------------------------------
# Programs, one per distinct text.

_PROGRAMS = {}
_PROGRAMS_LOCK = threading.Lock()
stats = {"compiles": 0, "reused": 0}


def _program(text, name):
    """The program of `text` (compiled on first sight) and whether it came from this cache."""
    with _PROGRAMS_LOCK:
        hit = _PROGRAMS.get(text)
        if hit is not None:
            stats["reused"] += 1
            return hit, True
        prog = _compile_kf(text, name)
        stats["compiles"] += 1
        _PROGRAMS[text] = prog
        return prog, False


def _kernel_shapes(prog):
    """Each CUDA kernel's shape as its header states it (how its threads cover the work), or None
    when the program has no generated code to read."""
    try:
        source = prog.cuda_source()
    except Exception:  # no code generator for this program: nothing to read
        return None
    # A kernel's other entry points (rows in registers, a column kernel's fold) are units of
    # their own with a header each: one line per kernel.
    shapes, names, name = [], set(), None
    for line in source.splitlines():
        if line.startswith("// kernel "):
            name = _kernel_of(line.split()[2])
        elif line.startswith("// domain: ") and name not in names:
            names.add(name)
            shapes.append(line[len("// domain: "):])
    return shapes


# ---------------------------------------------------------------------------------------------
# What explain reports.


class Kernel:
    """One fused region: the `graph` it is in, the aten `ops` it holds, its ``.kf`` `source`,
    the `shapes` of the CUDA kernels it runs as (one line each: how the kernel's threads cover
    its work, e.g. a row reduction computed once per row; None when unknown), their number
    `kernels`, whether its program came from the backend's cache (`cached`), and `builds`: for
    each entry point of those kernels (a row kernel has a second one, ``<name>_regs``, for rows
    kept in registers, and a column kernel may have ``<name>_fold``, each compiled as a unit of
    its own), ``(name, how, seconds)``, how kfuse's
    kernel cache made it ready
    (``"compiled"`` by NVRTC, or found on ``"disk"`` or in ``"memory"``) and how long that took;
    None when nothing was built (CPU inputs and no `arch` given to :func:`explain`)."""

    def __init__(self, graph, ops, source, shapes, cached, builds=None):
        self.graph, self.ops, self.source, self.shapes, self.cached = graph, ops, source, shapes, cached
        self.kernels = None if shapes is None else len(shapes)
        self.builds = builds

    def __repr__(self):
        return f"Kernel({self.graph}: {len(self.ops)} ops, {self.kernels} CUDA kernel(s))"


class Fallback:
    """An op left to PyTorch: the `graph` it is in, its `op` name and the `reason`."""

    def __init__(self, graph, op, reason):
        self.graph, self.op, self.reason = graph, op, reason

    def __repr__(self):
        return f"Fallback({self.graph}: {self.op}: {self.reason})"


class Report:
    """What the kfuse backend did with the graphs of one compiled function."""

    def __init__(self, arch=None):
        self.kernels = []
        self.fallbacks = []
        self.graphs = []  # graph names in compile order
        self.arch = arch  # what CPU graphs' kernels are built for (None: not built)
        # The graphs whose gradients kfuse computed with the loss in the forward (a scalar loss
        # whose whole backward it lowers): they only scale them by the upstream gradient.
        self.scaled_gradients = []

    def __str__(self):
        out = []
        for g in self.graphs:
            ks = [k for k in self.kernels if k.graph == g]
            fs = [f for f in self.fallbacks if f.graph == g]
            out.append(f"== {g} graph: {len(ks)} fused region(s), {len(fs)} op(s) left to PyTorch")
            if g in self.scaled_gradients:
                out.append("-- the loss's gradients, computed with it in the forward's region, scaled here by the"
                           " upstream gradient (kfuse::scale_loss_grad: in place, nothing written when it is 1)")
            for i, k in enumerate(ks):
                count = "?" if k.kernels is None else k.kernels
                cached = ", program reused" if k.cached else ""
                out.append(f"-- region {i}: {len(k.ops)} ops, {count} CUDA kernel(s){cached}")
                out.append("   ops: " + ", ".join(k.ops))
                builds = _by_kernel(k.builds or [])
                for j, shape in enumerate(k.shapes or []):
                    notes = "".join(_build_note(b) for b in builds[j]) if j < len(builds) else ""
                    out.append(f"   kernel {j}: {shape}{notes}")
                out.extend("   | " + line for line in k.source.rstrip("\n").split("\n"))
            for f in fs:
                out.append(f"-- left to PyTorch: {f.op}: {f.reason}")
        return "\n".join(out) if out else "(no graph was compiled)"

    __repr__ = __str__


# The suffixes of a kernel's other entry points, and what a report calls each.
_ENTRIES = {"_regs": " (rows in registers)", "_fold": " (fold of the column sums)"}


def _kernel_of(entry):
    """The kernel an entry point belongs to: its name without an entry suffix."""
    return next((entry[: -len(x)] for x in _ENTRIES if entry.endswith(x)), entry)


def _by_kernel(builds):
    """The builds of each kernel in order: its own entry's, then its other entries'."""
    grouped = []
    for build in builds:
        if grouped and _kernel_of(build[0]) == _kernel_of(grouped[-1][0][0]):
            grouped[-1].append(build)
        else:
            grouped.append([build])
    return grouped


def _build_note(build):
    """How one entry point was made ready, for a report line."""
    name, how, seconds = build
    ms = seconds * 1e3
    which = next((w for x, w in _ENTRIES.items() if name.endswith(x)), "")
    if how == "compiled":
        return f" [compiled by NVRTC in {ms:.1f} ms{which}]"
    if how == "repaired":
        return f" [a bad cache entry, compiled again in {ms:.1f} ms{which}]"
    return f" [from the kernel cache ({how}), {ms:.2f} ms{which}]"


def _builds(prog, gm, report):
    """The kernels of `prog` built for the device of `gm`'s inputs, or for the report's arch when
    they are on the CPU (see :class:`Kernel`'s `builds`); None when there is nothing to build
    for, or the build failed (the run then says why)."""
    device = next((v.device for v in (n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder")
                   if isinstance(v, torch.Tensor) and v.device.type == "cuda"), None)
    try:
        if device is not None:
            return prog.build_kernels(ordinal=device.index if device.index is not None else torch.cuda.current_device())
        if report.arch is not None:
            return prog.build_kernels(arch=report.arch)
    except Error as e:
        log.warning("kfuse backend: building the kernels of a region for explain failed: %s", e)
    return None

# ---------------------------------------------------------------------------------------------
# Partitioning and fusing one aten graph.


class _Support(OperatorSupportBase):
    def __init__(self, excluded):
        self.excluded = excluded
        self.reasons = {}
        self._why = {}  # node -> `_lower.supported(node)`, asked once a round

    def is_node_supported(self, submodules, node):
        if node.op != "call_function":
            return False
        if node in self.excluded:
            return False
        reason = self._refusal(node)
        if reason is not None:
            self.reasons[node] = reason
            return False
        if _lower.is_view(node) and not self._feeds_compute(node):
            # A view that no fused op reads (a matmul's result transposed for the output) would
            # join regions that a matmul separates and then be taken out again (see
            # `_strip_output_views`): PyTorch applies it for free.
            return False
        return True

    def _refusal(self, node):
        if node not in self._why:
            self._why[node] = _lower.supported(node)
        return self._why[node]

    def _feeds_compute(self, node, seen=None):
        """Whether a supported op other than a view reads `node`, directly or through views."""
        seen = set() if seen is None else seen
        for user in node.users:
            if user in seen or user.op != "call_function" or user in self.excluded:
                continue
            seen.add(user)
            if self._refusal(user) is not None:
                continue
            if _is_compute(user) or self._feeds_compute(user, seen):
                return True
        return False


def _is_compute(node):
    return _lower.op_name(node) not in _lower.TRIVIAL


def _strip_output_views(partition):
    """Takes out of `partition` the views that only the rest of the graph reads (the transpose
    of an activation that the backward's matmul takes): PyTorch applies them to the region's
    output for free, where the region would write each as one more tensor. A copy (`clone`)
    stays: kfuse writes its value once either way."""
    changed = True
    while changed:
        changed = False
        for node in list(partition.nodes):
            if _lower.is_view(node) and not any(u in partition.nodes for u in node.users):
                partition.remove_node(node)
                changed = True
    return partition


def _reads_a_tensor(partition):
    """Whether a node of `partition` takes a tensor from outside it: a region of constants alone
    has no input to say which device its outputs belong on."""
    for node in partition.nodes:
        for arg in node.all_input_nodes:
            if arg not in partition.nodes and isinstance(arg.meta.get("val"), torch.Tensor):
                return True
    return False


def _checked(prog, lowered):
    """Raises Refused when the program's outputs are not what the lowering expects."""
    for decl, (_, _, dtype, shape) in zip(prog.outputs, lowered.outputs):
        got = tuple(str(d) for d in decl.shape)
        if decl.kfuse_dtype != dtype or got != tuple(str(d) for d in shape):
            raise _lower.Refused(
                f"kfuse typed output `{decl.name}` as {decl.kfuse_dtype}{list(decl.shape)}, expected {dtype}{list(shape)}"
            )


def _lower_and_compile(sub, name, fresh):
    """Lowers and compiles a region; `fresh` collects the texts compiled for this graph."""
    lowered = _lower.lower_region(sub)
    try:
        prog, cached = _program(lowered.text, name)
        if not cached:
            fresh.add(lowered.text)
        cached = cached and lowered.text not in fresh
    except Error as e:
        raise _lower.Refused(f"kfuse did not compile the region: {e}") from e
    _checked(prog, lowered)
    # kfuse stores reductions read back at every element once; a kernel that would still compute
    # one again at every element, over more than REUSED_EXTENT_LIMIT elements (or a count known
    # only at run time), leaves the region to PyTorch.
    worst = max(prog._native.recompute(), default=0)
    if worst > _lower.REUSED_EXTENT_LIMIT:
        count = "a number known at run time of" if worst >= 2**64 - 1 else str(worst)
        raise _lower.Refused(
            f"its kernels would compute reductions again at every element ({count} elements each); "
            "the region runs in PyTorch"
        )
    return lowered, prog, cached


def _propose(gm, fresh):
    """Regions that lower and compile, and the reasons for every op refused on the way."""
    excluded = {}
    for _ in range(MAX_ROUNDS):
        support = _Support(excluded)
        partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=False)
        proposed = [_strip_output_views(p) for p in partitioner.propose_partitions()]
        partitions = []
        for p in proposed:
            if len(p.nodes) < 2 or not any(_is_compute(n) for n in p.nodes):
                continue  # views alone, or one op once its output views went: PyTorch's
            if _reads_a_tensor(p):
                partitions.append(p)
            else:
                for n in p.nodes:
                    excluded[n] = "a region of constants alone is left to PyTorch, which makes them on the graph's device"
        retry = False
        for p in partitions:
            try:
                sub, _, _ = fuse_as_graphmodule(gm, list(p.nodes), "probe", always_return_tuple=True)
                _lower_and_compile(sub, "probe", fresh)
            except _lower.Refused as e:
                # Refused at one node: partition again without it; otherwise the region stays.
                culprit = [n for n in p.nodes if n.name == getattr(e, "node", None)]
                for n in culprit or p.nodes:
                    excluded[n] = str(e)
                retry = True
            except Exception as e:  # never a crash: the region stays in PyTorch
                for n in p.nodes:
                    excluded[n] = f"unexpected {type(e).__name__}: {e}"
                retry = True
        if not retry:
            return partitions, {**support.reasons, **excluded}
    return [], {n: "kfuse gave up partitioning this graph" for n in gm.graph.nodes}


def _draw_seed(args):
    """A new seed for a region's random draws, from torch's default generator of the device of
    its tensors (so ``torch.manual_seed`` repeats a run), as an i64 tensor on that device: on a
    GPU it is drawn there, with no host synchronisation."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    return torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64, device=device)


class _Region(torch.nn.Module):
    """A fused region: calls its kfuse program and expands outputs kfuse leaves broadcast. The
    first call goes through the program's checked call (dtypes, devices, the variant for the
    inputs' dtypes); the graph it is in has fixed dtypes and devices, so later calls pass the
    tensors straight to that variant's kernels, in declaration order."""

    def __init__(self, prog, lowered, fallback):
        super().__init__()
        self._setup(prog, lowered.text, fallback, lowered.inputs, lowered.seeded, lowered.symbols)
        # Outputs kfuse leaves broadcast: expanded, as a view where torch's output is one (stride
        # 0), else made contiguous (no copy where only size-1 axes were left out: a leading-axis
        # sum with keepdim).
        self.expand = [(i, full, i in lowered.views) for i, (full, needs, _, _) in enumerate(lowered.outputs) if needs]

    def _setup(self, prog, text, fallback, inputs, seeded, symbols):
        self.prog = prog
        self.text = text
        self.fallback = fallback  # the region's aten ops, run if kfuse raises at run time
        self.inputs = inputs
        self.seeded = seeded
        self.symbols = symbols
        self._kernels = None  # the variant's kernels, once the first call has chosen it
        self._order = None  # each declared input's argument position (-1: the seed)
        self._failed = False  # kfuse raised once: the region runs in PyTorch from then on

    def __reduce__(self):
        # Pickled (in a fused graph kept by PyTorch's AOTAutograd cache) as its program's text and
        # its call details; loading compiles the text again (see `_compiled`).
        details = (self.inputs, self.seeded, self.symbols, self.expand)
        return _restore_region, (self.text, self.prog.name, details, self.fallback)

    def forward(self, *args):
        if self._failed:
            return self.fallback(*args)
        try:
            if self._kernels is None:
                outs = self._first_call(args)
            else:
                tensors = [args[i] if i >= 0 else _draw_seed(args) for i in self._order]
                outs = self._kernels.run(tensors, 0)
        except Error as e:
            # Once: a kernel that failed to compile would otherwise be compiled again on every call.
            log.warning("kfuse backend: %s raised %s; the region runs in PyTorch from now on", self.prog.name, e)
            self._failed = True
            return self.fallback(*args)
        if not self.expand:
            return tuple(outs)
        outs = list(outs)
        for i, full, view in self.expand:
            size = [d if isinstance(d, int) else args[self.symbols[d][0]].shape[self.symbols[d][1]] for d in full]
            outs[i] = outs[i].expand(size) if view else outs[i].expand(size).contiguous()
        return tuple(outs)

    def _first_call(self, args):
        named = {name: args[i] for i, name in self.inputs}
        if self.seeded:
            named[_lower.SEED] = _draw_seed(args)
        outs = self.prog(validate=False, **named)
        position = {name: i for i, name in self.inputs}
        names = [d.name for d in self.prog.inputs]
        dtypes = tuple(_KD[named[n].dtype] for n in names)
        self._order = [position.get(n, -1) for n in names]
        self._kernels = self.prog._variant(dtypes).kernels
        return outs


def _restore_region(text, name, details, fallback):
    """A region loaded from PyTorch's AOTAutograd cache (see `_Region.__reduce__`)."""
    region = _Region.__new__(_Region)
    torch.nn.Module.__init__(region)
    inputs, seeded, symbols, region.expand = details
    region._setup(_program(text, name)[0], text, fallback, inputs, seeded, symbols)
    return region


def _fuse(gm, graph_name, report):
    try:
        fresh = set()
        partitions, reasons = _propose(gm, fresh)
    except Exception as e:  # the graph runs as PyTorch's
        partitions, reasons = [], {n: f"unexpected {type(e).__name__}: {e}" for n in gm.graph.nodes}
    by_name = {n.name: r for n, r in reasons.items()}
    if partitions:
        gm = fuse_by_partitions(gm, [dict.fromkeys(p.nodes) for p in partitions], prefix=PREFIX, always_return_tuple=True)
    kernels, fallbacks = [], []
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target.startswith(PREFIX):
            sub = getattr(gm, node.target)
            try:
                lowered, prog, cached = _lower_and_compile(sub, f"{graph_name}.{node.target}", fresh)
            except Exception as e:  # the submodule runs the aten ops as they are
                fallbacks += [(n.target, f"region kept in PyTorch: {e}") for n in sub.graph.nodes if n.op == "call_function"]
                continue
            setattr(gm, node.target, _Region(prog, lowered, sub))
            shapes, builds = (_kernel_shapes(prog), _builds(prog, gm, report)) if report else (None, None)
            kernels.append(Kernel(graph_name, lowered.ops, lowered.text, shapes, cached, builds))
        elif node.op == "call_function" and node.target not in (operator.getitem, _loss_grad.SCALE):
            if node.name not in by_name and not _is_compute(node):
                continue  # a view or copy outside every region, refused by nothing: no work kfuse left
            fallbacks.append((node.target, by_name.get(node.name, "a region of a single op is left to PyTorch")))
    gm.recompile()
    log.debug("kfuse backend, %s graph: %d region(s), %d op(s) left to PyTorch", graph_name, len(kernels), len(fallbacks))
    if report is not None:
        report.graphs.append(graph_name)
        if any(n.op == "call_function" and n.target is _loss_grad.SCALE for n in gm.graph.nodes):
            report.scaled_gradients.append(graph_name)
        report.kernels += kernels
        report.fallbacks += [Fallback(graph_name, str(op), reason) for op, reason in fallbacks]
    return gm


# ---------------------------------------------------------------------------------------------
# What the forward saves for the backward.

# A reduction whose result is at least this many times smaller than its operands is saved, not
# recomputed (a row's statistics, a full sum: reading them back costs next to nothing).
SAVE_IF_SMALLER = 4


def _recomputable(node, backward):
    """Whether the backward should recompute forward value `node` rather than have the forward
    store it: kfuse lowers it, it is deterministic, and it is not a reduction that shrinks its
    operands (see SAVE_IF_SMALLER). Recomputed values fuse into the backward's regions, which read
    the forward's inputs instead of a stored intermediate (a cross-entropy's log-softmax, an
    activation's pre-image): one pass over memory fewer per recomputed tensor."""
    if node.op != "call_function" or node in backward or node.target is operator.getitem:
        return False
    if _lower.is_random(node):
        return False
    if any(_lower.is_random(x) for x in node.all_input_nodes):
        # Computed from a random draw, which is not recomputed: storing this value (dropout's
        # bool mask) is smaller than storing the draw (a float per element) to recompute it.
        return False
    out = _lower.fake(node)
    if out is None or _lower.supported(node) is not None:
        return False
    sizes = [_numel_hint(t) for t in map(_lower.fake, node.all_input_nodes) if t is not None]
    size = _numel_hint(out)
    if size is None or None in sizes:  # a size without an example value: save it
        return False
    return size * SAVE_IF_SMALLER >= max(sizes, default=0)



def _numel_hint(t):
    """The element count of fake tensor `t` at the example sizes it was traced with (no guard on a
    symbolic size), or None when a size has no example value."""
    n = 1
    for d in t.shape:
        d = d.node.hint if isinstance(d, torch.SymInt) else d
        if d is None:
            return None
        n *= int(d)
    return n


def _partition(joint, joint_inputs, fuse_loss=True, **kwargs):
    """AOTAutograd's partition of the joint forward + backward graph. A scalar loss is computed
    with the top of its backward (what kfuse lowers) in the forward, the backward scaling what
    that top hands on (:mod:`_loss_grad`; not with `fuse_loss` False: graphs replayed from CUDA
    graphs, whose recordings would keep the in-place scaling of the first backward's kind).
    Otherwise every forward value that kfuse can recompute
    (:func:`_recomputable`) is recomputed in the backward instead of stored: the default
    partitioner's activation-checkpointing tags, on the values that are not forward outputs. A
    graph with mutations, or one the tagged partition fails on, is partitioned as AOTAutograd
    does by default."""
    from torch._functorch._aot_autograd.functional_utils import _is_functional_graph
    from torch.utils.checkpoint import CheckpointPolicy

    try:
        if fuse_loss and _loss_grad.rewrite(joint, kwargs.get("num_fwd_outputs", 0)):
            # The forward computes the loss and its unscaled gradients; the backward only scales.
            return default_partition(joint, joint_inputs, **kwargs)
    except Exception as e:  # never a failure: the joint graph is partitioned as it came
        log.warning("kfuse backend: fusing the loss with its gradient failed (%s: %s)", type(e).__name__, e)
    before = {n: n.meta.get("recompute") for n in joint.graph.nodes}
    try:
        if _is_functional_graph(joint.graph)[0] is None:
            tangents = [n for n in joint.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents")]
            backward = set()
            for n in joint.graph.nodes:  # nodes are in topological order
                if n in tangents or any(x in backward for x in n.all_input_nodes):
                    backward.add(n)
            out = next(n for n in joint.graph.nodes if n.op == "output")
            forward_outputs = set(out.args[0][: kwargs.get("num_fwd_outputs", 0)])
            for n in joint.graph.nodes:
                if n not in forward_outputs and n.meta.get("recompute") is None and _recomputable(n, backward):
                    n.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
        return default_partition(joint, joint_inputs, **kwargs)
    except Exception as e:  # never a failure: store what the default partition stores
        log.warning("kfuse backend: recomputing in the backward failed (%s: %s); saving instead", type(e).__name__, e)
        for n, r in before.items():
            if r is None:
                n.meta.pop("recompute", None)
            else:
                n.meta["recompute"] = r
        return default_partition(joint, joint_inputs, **kwargs)


def _aot(report, graphs=None):
    """AOTAutograd with kfuse's fusion of each graph; with `graphs` (the Dynamo graph's input
    count), each fused graph is also recorded in and replayed from CUDA graphs (see
    :class:`_CudaGraphs`). The plain backend's fused graphs (neither reported nor recorded) are
    :class:`_compiled.FusedGraph`, which PyTorch's AOTAutograd cache keeps (see
    :func:`backend`)."""
    cudagraphs = None if graphs is None else _CudaGraphs(graphs)
    cached = report is None and cudagraphs is None

    def compiler(graph_name):
        def compile_graph(gm, example_inputs):
            fused = _fuse(gm, graph_name, report)
            if cudagraphs is not None:
                return cudagraphs.wrap(fused, example_inputs, graph_name)
            return _compiled.FusedGraph(fused) if cached else make_boxed_func(fused)

        if cached:
            return SerializableAOTDispatchCompiler(_compiled.FusedGraph, compile_graph)
        return compile_graph

    return aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decompositions(),
        partition_fn=_partition if cudagraphs is None else functools.partial(_partition, fuse_loss=False),
    )


class _CudaGraphs:
    """``mode="reduce-overhead"``: the fused forward, backward and inference graphs recorded in
    and replayed from CUDA graphs through PyTorch's CUDA graph trees, as Dynamo's ``cudagraphs``
    backend and Inductor do (parameters and buffers are static inputs; other inputs are copied
    into the graph's own; a new shape records a new graph). A graph that cannot be captured (CPU
    tensors, several devices, an input mutation, an op unsafe to capture) runs as it is, and its
    backward too. kfuse's kernels run on the current stream, and their workspace is never freed
    while a recorded graph may use it."""

    def __init__(self, graphs):
        from torch._inductor.cudagraph_utils import BoxedDeviceIndex
        from torch._inductor.utils import BoxedBool

        self.graphs = graphs
        self.enabled = BoxedBool(True)
        self.device = BoxedDeviceIndex(None)

    def wrap(self, fused, example_inputs, graph_name):
        from torch._dynamo.backends.cudagraphs import (
            check_for_skip,
            find_input_mutations,
            get_device_index,
            get_stack_traces,
        )
        from torch._inductor.cudagraph_trees import cudagraphify_impl, get_manager
        from torch._inductor.cudagraph_utils import get_placeholder_info, log_cudagraph_skip_and_bump_counter
        from torch._inductor.utils import BoxedBool, count_tangents, num_fw_fixed_arguments

        def run(args):
            # The boxed convention CUDA graph trees hold a callee to: it takes the list's inputs and
            # empties it, so that the inputs can be freed as soon as the graph is done with them.
            inputs = list(args)
            args.clear()
            return fused(*inputs)

        run._boxed_call = True
        backward = graph_name == "backward"
        if backward and not self.enabled:
            return run
        if backward:
            fixed = count_tangents(fused)
        else:
            fixed = num_fw_fixed_arguments(self.graphs, len(example_inputs))
        skip = check_for_skip(fused, fixed)
        if skip:
            log_cudagraph_skip_and_bump_counter(f"kfuse backend: skipping cudagraphs due to {skip}")
            if not backward:
                BoxedBool.disable(self.enabled)
                return run
            manager = get_manager(self.device.value if self.device.value is not None else 0, create_if_none_exists=False)

            def in_tree(inputs):
                if manager is not None:
                    manager.set_to_running_backward()
                return run(inputs)

            in_tree._boxed_call = True
            return in_tree
        device = get_device_index(fused)
        if not backward:
            self.device.set(device)
        details = dict(
            device_index=device,
            is_backward=backward,
            is_inference=graph_name == "inference",
            stack_traces=get_stack_traces(fused),
            placeholders=get_placeholder_info(fused.graph),
            mutated_input_idxs=find_input_mutations(fused.graph),
        )
        # One recording per input shape: CUDA graph trees tell shapes apart by a graph's int inputs
        # (its symbolic sizes), and a kfuse graph whose sizes come from its tensors may have none.
        by_shape = {}

        def replay(args):
            key = tuple((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a for a in args)
            try:
                graph = by_shape.get(key)
            except TypeError:  # an input that is not a tensor or a number: no recording
                return run(args)
            if graph is None:
                graph = by_shape[key] = cudagraphify_impl(run, args, range(fixed), **details)
            return graph(args)

        replay._boxed_call = True
        return replay


def backend(gm, example_inputs, mode=None, options=None, **kwargs):
    """The ``torch.compile`` backend (registered as ``"kfuse"``): AOTAutograd with kfuse
    fusing the pointwise regions of the forward and backward aten graphs. ``mode="reduce-overhead"``
    (or ``options={"triton.cudagraphs": True}``, Inductor's spelling) also replays each graph from
    CUDA graphs; other modes and options change nothing."""
    if mode == "reduce-overhead" or (options or {}).get("triton.cudagraphs"):
        return _aot(None, len(example_inputs))(gm, example_inputs, **kwargs)
    with _compiled.caching():
        return _aot(None)(gm, example_inputs, **kwargs)


def explain(fn, *example_inputs, arch=None):
    """Compiles `fn` with the kfuse backend, runs it on `example_inputs` (and its backward, when
    the outputs require grad, without touching any ``.grad``), and returns a :class:`Report`.
    Each fused region's kernels are built before the run, for the GPU of CUDA inputs, or for
    `arch` (such as ``"sm_90"``; NVRTC only) with CPU inputs, and the report says how each was
    made ready and how long it took (``Kernel.builds``)."""
    if arch is not None and not (isinstance(arch, str) and re.fullmatch(r"sm_[0-9]+[a-z]?", arch)):
        raise ValueError(f"explain: arch={arch!r} is not an architecture; write it like 'sm_90'")
    report = Report(arch)

    aot = _aot(report)

    def reporting_backend(gm, example_inputs, **kwargs):
        return aot(gm, example_inputs, **kwargs)

    compiled = torch.compile(fn, backend=reporting_backend)
    out = compiled(*example_inputs)
    # The backward graph is compiled when the backward first runs.
    leaves = [t for t in example_inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if isinstance(fn, torch.nn.Module):
        leaves += [p for p in fn.parameters() if p.requires_grad]
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
    outs = [o for o in outs if o.requires_grad]
    if leaves and outs:
        torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs], allow_unused=True)
    return report
