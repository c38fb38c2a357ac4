//! The end of a kernel with full reductions: each block's fixed-order reduction of its threads'
//! accumulators into per-block partials, then either the self-resetting ticket whose last block
//! folds the partials and runs the epilogue (every reduction kernel), or, in a cooperative
//! one-pass kernel, a grid barrier past which every block folds them itself (see `onepass`).
//!
//! No float atomics anywhere: the fold order is fixed, so results are bit-identical for a given
//! grid. Not handled here: the epilogue's expressions (see `emit`).

use std::fmt::Write as _;

use crate::actions::Combine;

/// The tail of a kernel launched plainly: the ticket tail when it has partial slots, else the
/// epilogue (if any) in thread 0 of block 0.
pub(crate) fn write_plain_tail(src: &mut String, slots: &[(Combine, String, String)], epilogue: &[String]) {
    if !slots.is_empty() {
        write_reduction_tail(src, slots, epilogue);
    } else if !epilogue.is_empty() {
        src.push_str("    if (blockIdx.x == 0 && threadIdx.x == 0) {\n");
        for l in epilogue {
            let _ = writeln!(src, "        {l}");
        }
        src.push_str("    }\n");
    }
}

/// Block reduction, per-block partials, the ticket, and the last block's fixed-order final
/// reduction followed by the epilogue.
pub(crate) fn write_reduction_tail(src: &mut String, slots: &[(Combine, String, String)], epilogue: &[String]) {
    write_block_partials(src, slots, "__shared__ bool kf_last_block;");
    src.push_str("        __threadfence(); // publish the partials before taking a ticket\n");
    src.push_str("        kf_last_block = atomicAdd(counter, 1u) == gridDim.x - 1u;\n    }\n");
    src.push_str("    __syncthreads();\n    if (!kf_last_block) return;\n    __threadfence();\n");
    src.push_str(
        "    // The last block folds all partials: thread t takes blocks t, t + blockDim.x, ... in order, then one\n",
    );
    src.push_str("    // block reduction; no float atomics, so the result is bit-identical for a given grid size.\n");
    write_fold(src, slots);
    src.push_str("    if (threadIdx.x == 0) {\n");
    for l in epilogue {
        let _ = writeln!(src, "        {l}");
    }
    src.push_str("        *counter = 0u; // self-resetting ticket: the next launch needs no memset\n    }\n");
}

/// A cooperative one-pass kernel's tail: block partials, a grid barrier on the arrivals alone
/// (every block is resident), then every block folds all partials itself in the same fixed order
/// (so each holds the same results; block 0 writes the scalar outputs), computes the scale into
/// `kf_scale` and runs `after` (the rescale of its list). The last block to leave resets the
/// barrier for the next launch.
pub(crate) fn write_barrier_tail(
    src: &mut String,
    slots: &[(Combine, String, String)],
    epilogue: &[String],
    after: &[String],
) {
    write_block_partials(src, slots, "__shared__ float kf_scale; // the gradient's scale, past the barrier");
    src.push_str("        __threadfence(); // publish the partials before arriving\n");
    src.push_str("        atomicAdd(counter, 1u); // grid barrier: arrive, then wait for every block (all resident: cooperative launch)\n");
    src.push_str("        while (((volatile unsigned int*)counter)[0] < gridDim.x) { }\n");
    src.push_str("        __threadfence();\n    }\n    __syncthreads();\n");
    src.push_str("    // Every block folds all partials: thread t takes blocks t, t + blockDim.x, ... in order, then one block\n");
    src.push_str("    // reduction; no float atomics, so every block holds the same bit-identical results for a given grid size.\n");
    write_fold(src, slots);
    src.push_str("    if (threadIdx.x == 0) {\n");
    for l in epilogue {
        let _ = writeln!(src, "        {l}");
    }
    src.push_str("    }\n    __syncthreads();\n");
    for l in after {
        let _ = writeln!(src, "    {l}");
    }
    src.push_str("    // The last block to leave resets the barrier: the next launch needs no memset.\n");
    src.push_str("    if (threadIdx.x == 0 && atomicAdd(counter + 1, 1u) == gridDim.x - 1u) { counter[0] = 0u; counter[1] = 0u; }\n");
}

fn block_fn(c: Combine) -> &'static str {
    match c {
        Combine::Sum => "kf_block_sum",
        Combine::Max => "kf_block_max",
        Combine::Min => "kf_block_min",
    }
}

/// Each block's fixed-order reduction of its threads' accumulators; thread 0 then writes the
/// block's partials (and stays inside the `if` the caller closes). `shared` declares the tail's
/// other shared variables.
fn write_block_partials(src: &mut String, slots: &[(Combine, String, String)], shared: &str) {
    src.push_str(
        "    // Each block reduces its threads' accumulators in a fixed order and writes one partial per slot.\n",
    );
    let _ = writeln!(src, "    __shared__ double kf_smem[32];\n    {shared}");
    for (s, (c, _, _)) in slots.iter().enumerate() {
        let _ = writeln!(src, "    acc{s} = {}(acc{s}, kf_smem);", block_fn(*c));
    }
    src.push_str("    if (threadIdx.x == 0) {\n");
    for s in 0..slots.len() {
        let _ = writeln!(src, "        partials[{s}u * gridDim.x + blockIdx.x] = acc{s};");
    }
}

/// The fixed-order fold of every block's partials into `r<s>` (valid in thread 0).
fn write_fold(src: &mut String, slots: &[(Combine, String, String)]) {
    for (s, (_, init, _)) in slots.iter().enumerate() {
        let _ = writeln!(src, "    double r{s} = {init};");
    }
    src.push_str("    for (unsigned int b = threadIdx.x; b < gridDim.x; b += blockDim.x) {\n");
    for (s, (c, _, _)) in slots.iter().enumerate() {
        let p = format!("((volatile double*)partials)[{s}u * gridDim.x + b]");
        let line = match c {
            Combine::Sum => format!("r{s} += {p};"),
            Combine::Max => format!("r{s} = kf_max_f64(r{s}, {p});"),
            Combine::Min => format!("r{s} = kf_min_f64(r{s}, {p});"),
        };
        let _ = writeln!(src, "        {line}");
    }
    src.push_str("    }\n");
    for (s, (c, _, _)) in slots.iter().enumerate() {
        let _ = writeln!(src, "    r{s} = {}(r{s}, kf_smem);", block_fn(*c));
    }
}
