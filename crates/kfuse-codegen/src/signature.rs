//! A kernel's parameter list: the buffers it reads and writes, in buffer order (inputs,
//! outputs, Temp values, the one-pass list, partials and counter), then the sizes and the
//! strides of inputs read through them, each with the declaration and the comment of its line in
//! the signature.
//!
//! Not handled here: the signature's text (see `kernel`).

use std::collections::BTreeSet;

use kfuse_ir::{Graph, InputId, NodeId};

use crate::analysis::Analysis;
use crate::buffers::BufferIndex;
use crate::cuda;
use crate::emit::{temp_dtype, Uses};
use crate::plan::Param;
use crate::shapes::KernelShape;
use crate::CodegenError;

/// What a kernel's parameters are drawn from.
pub(crate) struct SignatureParts<'a> {
    /// Kernel `k` of the plan, and its shape.
    pub k: usize,
    pub shape: KernelShape,
    /// What its body, drain and epilogue use.
    pub uses: &'a Uses,
    /// The outputs it writes (any order, duplicates allowed) and the Temp buffers it stores.
    pub outputs_written: Vec<usize>,
    pub temps_written: &'a [usize],
    /// The compacted plan's list buffers (index, values) and values per entry.
    pub list: Option<((usize, usize), u32)>,
    /// Its partial slots.
    pub n_slots: usize,
    /// Whether it checks lengths/offsets values (the error record and the tag follow the sizes).
    pub checked: bool,
    /// The column partial sums it writes (`None`: a row-wise kernel) or folds (`Some(the
    /// kernel that wrote them)`), as (buffer, writer).
    pub column_partials: Option<(usize, Option<usize>)>,
}

/// The parameters: (parameter, declaration, comment).
pub(crate) fn params(
    g: &Graph,
    an: &Analysis,
    buffers: &BufferIndex,
    parts: SignatureParts,
) -> Result<Vec<(Param, String, String)>, CodegenError> {
    let SignatureParts { k, shape, uses, outputs_written, temps_written, list, n_slots, checked, column_partials } =
        parts;
    let mut params: Vec<(Param, String, String)> = Vec::new(); // (param, declaration, comment)
    for &i in &uses.inputs {
        let inp = &g.inputs[i as usize];
        let decl = format!("const {}* __restrict__ in{i}", cuda::storage_type(inp.dtype));
        params.push((
            Param::Buffer(i as usize),
            decl,
            format!("{} {}{}", inp.name, inp.dtype, g.shape_str(&inp.shape)),
        ));
    }
    // The outputs written here, and those an earlier kernel stored that are read here (const),
    // in output order.
    let outputs: BTreeSet<usize> = outputs_written.iter().chain(&uses.outputs_read).copied().collect();
    for o in outputs {
        let node = g.node(g.outputs[o].node);
        let (constness, note) =
            if outputs_written.contains(&o) { ("", "") } else { ("const ", ", stored by an earlier kernel") };
        let decl = format!("{constness}{}* __restrict__ out{o}", cuda::storage_type(node.dtype));
        params.push((
            Param::Buffer(buffers.outputs_base + o),
            decl,
            format!("output {} {}{}{note}", g.outputs[o].name, node.dtype, g.shape_str(&node.shape)),
        ));
    }
    let temp_nodes: Vec<(NodeId, usize)> = an.temps.iter().map(|(&n, &t)| (n, t)).collect();
    for (n, t) in temp_nodes {
        let d = temp_dtype(g.node(n).dtype);
        let shape = &g.node(n).shape;
        let what = if shape.is_scalar() { "scalar".to_string() } else { format!("{} per row", g.shape_str(shape)) };
        let (constness, note) = if temps_written.contains(&t) {
            ("", format!("n{} {d} {what}, written here for a later kernel", n.0))
        } else if uses.temps_read.contains(&t) {
            ("const ", format!("n{} {d} {what} from an earlier kernel", n.0))
        } else {
            continue;
        };
        let decl = format!("{constness}{}* __restrict__ tmp{t}", cuda::storage_type(d));
        params.push((Param::Buffer(buffers.temps_base + t), decl, note));
    }
    if let Some(((index, values), comps)) = list {
        params.push((
            Param::Buffer(index),
            "unsigned long long* __restrict__ list_index".into(),
            "flat indices of the entries past shared memory".into(),
        ));
        params.push((
            Param::Buffer(values),
            "float* __restrict__ list_values".into(),
            format!("their {comps} unscaled f32 values"),
        ));
    }
    match column_partials {
        Some((b, None)) => params.push((
            Param::Buffer(b),
            "float* __restrict__ kf_colp".into(),
            "column partial sums: a row per block, each sum's columns one after another".into(),
        )),
        Some((b, Some(_))) => params.push((
            Param::Buffer(b),
            "const float* __restrict__ kf_colp".into(),
            "column partial sums of an earlier kernel: a row per block of its grid".into(),
        )),
        None => {}
    }
    if n_slots > 0 || matches!(shape, KernelShape::Rows | KernelShape::Columns) {
        let (p, c) = buffers.reduction[k]
            .ok_or(CodegenError::Internal { node: 0, what: "reduction kernel without its counter" })?;
        if let Some(p) = p {
            let note = match shape {
                KernelShape::Columns => "per block: each accumulator's f64 partials of its 32 columns".to_string(),
                _ => format!("{n_slots} f64 partial slots per block, slot-major"),
            };
            params.push((Param::Buffer(p), "double* __restrict__ partials".into(), note));
        }
        params.push((Param::Buffer(c), "unsigned int* __restrict__ counter".into(), shape.counter_note().into()));
    }
    for &s in &uses.syms {
        params.push((Param::Size(s), format!("long long sz{}", s.0), format!("size {}", g.symbols[s.0 as usize])));
    }
    for &i in uses.inputs.iter().filter(|i| an.strided.contains(i)) {
        let inp = &g.inputs[i as usize];
        for axis in 0..inp.shape.dims().len() as u32 {
            params.push((
                Param::Stride { input: InputId(i), axis },
                format!("long long st{i}_{axis}"),
                format!("stride of axis {axis} of {} (elements)", inp.name),
            ));
        }
    }
    if let Some((_, Some(writer))) = column_partials {
        params.push((
            Param::Grid(writer),
            "long long kf_parts".into(),
            format!("rows of kf_colp: the grid of kernel {}", writer + 1),
        ));
    }
    if checked {
        params.push((
            Param::ErrorRecord,
            "unsigned long long* __restrict__ kf_err".into(),
            "error record of the lengths/offsets checks (null: no checks)".into(),
        ));
        params.push((Param::CheckTag, "unsigned int kf_tag".into(), "tag of a recorded violation".into()));
    }
    Ok(params)
}
