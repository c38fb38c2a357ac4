//! What a plan must satisfy, checked against the graph and the interpreter's results (the plan's
//! kernels are CUDA text: they cannot run here, so what is checked is how they fit together).

use std::collections::BTreeMap;

use kfuse_codegen::{BufferKind, ElemType, Param, Plan};
use kfuse_ir::{DType, Graph};

/// The C type a buffer of `elem` is declared with in a kernel's signature.
fn c_type(elem: ElemType) -> &'static str {
    match elem {
        ElemType::Tensor(DType::F32) => "float",
        ElemType::Tensor(DType::F16 | DType::BF16) => "unsigned short",
        ElemType::Tensor(DType::I32) => "int",
        ElemType::Tensor(DType::I64) => "long long",
        ElemType::Tensor(DType::Bool) => "unsigned char",
        ElemType::F64 => "double",
        ElemType::U32 => "unsigned int",
        ElemType::U64 => "unsigned long long",
    }
}

/// The parameter lines of kernel `name`'s signature in `source` (one parameter a line, the
/// declaration before `//`).
fn signature<'a>(source: &'a str, name: &str) -> Result<Vec<&'a str>, String> {
    let head = format!(" {name}(");
    let start = source.find(&head).ok_or_else(|| format!("kernel {name}: no `{name}(` in its source"))?;
    if !source[..start].lines().last().is_some_and(|l| l.starts_with("extern \"C\" __global__")) {
        return Err(format!("kernel {name}: its entry point is not `extern \"C\" __global__`"));
    }
    let body = &source[start + head.len()..];
    let end = body.find("\n)").ok_or_else(|| format!("kernel {name}: unterminated parameter list"))?;
    Ok(body[..end]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| l.split("//").next().unwrap_or(l).trim())
        .collect())
}

/// Checks `plan` against `graph`, the symbol `sizes` of one run and the interpreter's output
/// lengths for that run:
/// - the buffer list starts with the inputs then the outputs, in declaration order, each of its
///   dtype and of the size the run gives (outputs: the length the interpreter computed);
/// - every kernel has a unique name, an `extern "C" __global__` entry point whose parameter list
///   matches `params` one to one (each buffer declared with its element type; inputs `const`,
///   outputs and counters written), a block size a multiple of 32 in 32..=1024 and a grid of at
///   least one block for these sizes;
/// - every output is written by exactly one kernel; every Temp that a kernel uses is written by
///   exactly one kernel and read only by later ones (the kernels are in dependency order); a
///   kernel's counters,
///   partials and scratch belong to that kernel alone.
pub fn check(plan: &Plan, graph: &Graph, sizes: &[u64], output_lens: &[usize]) -> Result<(), String> {
    let (n_in, n_out) = (graph.inputs.len(), graph.outputs.len());
    if plan.buffers.len() < n_in + n_out {
        return Err(format!("{} buffers for {n_in} inputs and {n_out} outputs", plan.buffers.len()));
    }
    for (i, inp) in graph.inputs.iter().enumerate() {
        let b = &plan.buffers[i];
        let want: u64 = graph.resolve_shape(&inp.shape, sizes).iter().product::<usize>() as u64;
        if b.kind != BufferKind::Input(kfuse_ir::InputId(i as u32)) || b.elem != ElemType::Tensor(inp.dtype) {
            return Err(format!("buffer {i} is {:?} {:?}, not input `{}` {}", b.kind, b.elem, inp.name, inp.dtype));
        }
        if b.elems.eval(sizes) != Some(want) {
            return Err(format!(
                "input `{}`: buffer of {:?} elements, the run has {want}",
                inp.name,
                b.elems.eval(sizes)
            ));
        }
    }
    for (o, out) in graph.outputs.iter().enumerate() {
        let b = &plan.buffers[n_in + o];
        let dtype = graph.node(out.node).dtype;
        if b.kind != BufferKind::Output(o) || b.elem != ElemType::Tensor(dtype) {
            return Err(format!("buffer {} is {:?} {:?}, not output `{}` {dtype}", n_in + o, b.kind, b.elem, out.name));
        }
        if b.elems.eval(sizes) != Some(output_lens[o] as u64) {
            return Err(format!(
                "output `{}`: buffer of {:?} elements, the interpreter computed {}",
                out.name,
                b.elems.eval(sizes),
                output_lens[o]
            ));
        }
    }
    let grids = plan.grids(sizes, 132, |_, b| b).unwrap_or_default();
    let mut names = std::collections::BTreeSet::new();
    // Buffer index -> (kernels writing it, kernels reading it).
    let mut uses: BTreeMap<usize, (Vec<usize>, Vec<usize>)> = BTreeMap::new();
    for (k, kernel) in plan.kernels.iter().enumerate() {
        let name = &kernel.name;
        if !names.insert(name.clone()) {
            return Err(format!("two kernels are named {name}"));
        }
        if !kernel.block.is_multiple_of(32) || !(32..=1024).contains(&kernel.block) {
            return Err(format!("kernel {name}: block of {} threads", kernel.block));
        }
        if grids.get(k).is_none_or(|&b| b < 1) {
            return Err(format!("kernel {name}: no grid for sizes {sizes:?}"));
        }
        // The kernel's own entry, and its fold entry (its own parameters).
        let fold = kernel.fold.as_ref().map(|f| (f.source.as_str(), f.entry.as_str(), &f.params));
        for (source, name, params) in
            std::iter::once((kernel.source.as_str(), name.as_str(), &kernel.params)).chain(fold)
        {
            let lines = signature(source, name)?;
            if lines.len() != params.len() {
                return Err(format!(
                    "kernel {name}: {} parameters in its source, {} in the plan",
                    lines.len(),
                    params.len()
                ));
            }
            for (param, line) in params.iter().zip(&lines) {
                match *param {
                    Param::Size(s) => {
                        if s.0 as usize >= graph.symbols.len() || !line.starts_with("long long ") {
                            return Err(format!("kernel {name}: size parameter {s:?} declared `{line}`"));
                        }
                    }
                    Param::ErrorRecord => {
                        if !line.starts_with("unsigned long long* __restrict__ kf_err") || graph.constraints.is_empty()
                        {
                            return Err(format!("kernel {name}: error record declared `{line}`"));
                        }
                    }
                    Param::CheckTag => {
                        if !line.starts_with("unsigned int kf_tag") {
                            return Err(format!("kernel {name}: check tag declared `{line}`"));
                        }
                    }
                    Param::Stride { input, axis } => {
                        let rank = graph.inputs.get(input.0 as usize).map(|i| i.shape.dims().len());
                        if rank.is_none_or(|r| axis as usize >= r)
                            || !plan.strided_inputs.contains(&input.0)
                            || line.trim_end_matches(',') != format!("long long st{}_{axis}", input.0)
                        {
                            return Err(format!("kernel {name}: stride {axis} of input {} declared `{line}`", input.0));
                        }
                    }
                    Param::Grid(j) => {
                        if j >= k || !line.starts_with("long long kf_parts") {
                            return Err(format!("kernel {name}: the grid of kernel {j} declared `{line}`"));
                        }
                    }
                    Param::Buffer(i) => {
                        let b =
                            plan.buffers.get(i).ok_or_else(|| format!("kernel {name}: buffer {i} does not exist"))?;
                        let read_only = line.starts_with("const ");
                        let decl = line.trim_start_matches("const ");
                        if !decl.starts_with(&format!("{}* __restrict__ ", c_type(b.elem))) {
                            return Err(format!("kernel {name}: buffer {i} ({:?}) declared `{line}`", b.elem));
                        }
                        let entry = uses.entry(i).or_default();
                        let list = if read_only { &mut entry.1 } else { &mut entry.0 };
                        if !list.contains(&k) {
                            list.push(k);
                        }
                    }
                }
            }
        }
    }
    for (i, b) in plan.buffers.iter().enumerate() {
        let (writers, readers) = uses.get(&i).cloned().unwrap_or_default();
        match b.kind {
            BufferKind::Input(_) if !writers.is_empty() => {
                return Err(format!("input buffer {i} is written by kernels {writers:?}"));
            }
            // A later kernel may read an output an earlier one stored (a column reduction's
            // operand), never one written after it or by it.
            BufferKind::Output(o) if writers.len() != 1 || readers.iter().any(|&r| r <= writers[0]) => {
                return Err(format!(
                    "output `{}` is written by kernels {writers:?} and read by {readers:?}: one writer, read only after it, wanted",
                    graph.outputs[o].name
                ));
            }
            // A one-pass plan keeps the scalar that crossed from kernel 0 to kernel 1 in registers:
            // its Temp is declared but unused, which costs one element and is not wrong.
            BufferKind::Temp if writers.is_empty() && readers.is_empty() => {}
            BufferKind::Temp => {
                let [w] = writers[..] else {
                    return Err(format!(
                        "temp buffer {i} is written by kernels {writers:?} and read by {readers:?}: one writer wanted"
                    ));
                };
                if readers.iter().any(|&r| r <= w) {
                    return Err(format!(
                        "temp buffer {i} is written by kernel {w} and read by {readers:?}: out of order"
                    ));
                }
            }
            // Column partial sums: written by their row kernel, folded by one later kernel.
            BufferKind::ColumnPartials { kernel }
                if writers != [kernel] || readers.len() != 1 || readers[0] <= kernel =>
            {
                return Err(format!(
                    "column partials {i} of kernel {kernel} are written by {writers:?} and read by {readers:?}"
                ));
            }
            BufferKind::Counter { .. } | BufferKind::Partials { .. } | BufferKind::Scratch { .. } => {
                let mut all = writers.clone();
                all.extend(&readers);
                all.dedup();
                if all.len() > 1 {
                    return Err(format!("{:?} buffer {i} is shared by kernels {all:?}", b.kind));
                }
            }
            _ => {}
        }
    }
    Ok(())
}
