//! The end of a kernel with full reductions: each block's fixed-order reduction of its threads'
//! accumulators into per-block partials, then either the self-resetting ticket whose last block
//! folds the partials and runs the epilogue (every reduction kernel), or, in a cooperative
//! one-pass kernel, a grid barrier past which every block folds them itself (see `onepass`).
//!
//! No float atomics anywhere: the fold order is fixed, so results are bit-identical for a given
//! grid. Not handled here: the epilogue's expressions (see `emit`).

use std::fmt::Write as _;

use crate::actions::Combine;
use crate::text::{render, write_lines};

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

/// The ticket tail and the barrier tail: reviewed templates.
const TICKET: &str = include_str!("templates/tail_ticket.cuh");
const BARRIER: &str = include_str!("templates/tail_barrier.cuh");

/// Block reduction, per-block partials, the ticket, and the last block's fixed-order final
/// reduction followed by the epilogue.
pub(crate) fn write_reduction_tail(src: &mut String, slots: &[(Combine, String, String)], epilogue: &[String]) {
    let (block_reduce, partials, fold) = slot_blocks(slots);
    let epilogue = indented(epilogue, "        ");
    src.push_str(&render(
        TICKET,
        &[("block_reduce", &block_reduce), ("partials", &partials), ("fold", &fold), ("epilogue", &epilogue)],
    ));
}

/// A cooperative one-pass kernel's tail: block partials, a grid barrier on the arrivals alone
/// (every block is resident), then every block folds all partials itself in the same fixed order
/// (so each holds the same results; block 0 writes the scalar outputs), computes the scale into
/// `kf_scale` and runs `after` (whole lines: the rescale of its list). The last block to leave resets the
/// barrier for the next launch.
pub(crate) fn write_barrier_tail(
    src: &mut String,
    slots: &[(Combine, String, String)],
    epilogue: &[String],
    after: &str,
) {
    let (block_reduce, partials, fold) = slot_blocks(slots);
    let epilogue = indented(epilogue, "        ");
    src.push_str(&render(
        BARRIER,
        &[
            ("block_reduce", &block_reduce),
            ("partials", &partials),
            ("fold", &fold),
            ("epilogue", &epilogue),
            ("after", after),
        ],
    ));
}

fn indented(lines: &[String], indent: &str) -> String {
    let mut s = String::new();
    write_lines(&mut s, lines, indent);
    s
}

/// The per-slot blocks of the tails: each block's fixed-order reduction of its threads'
/// accumulators, thread 0's writes of the block's partials, and the fixed-order fold of every
/// block's partials into `r<s>` (valid in thread 0).
fn slot_blocks(slots: &[(Combine, String, String)]) -> (String, String, String) {
    let (mut block_reduce, mut partials, mut fold) = (String::new(), String::new(), String::new());
    for (s, (c, _, _)) in slots.iter().enumerate() {
        let _ = writeln!(block_reduce, "    acc{s} = kf_block_{}(acc{s}, kf_smem);", c.name());
        let _ = writeln!(partials, "        partials[{s}u * gridDim.x + blockIdx.x] = acc{s};");
    }
    for (s, (_, init, _)) in slots.iter().enumerate() {
        let _ = writeln!(fold, "    double r{s} = {init};");
    }
    fold.push_str("    for (unsigned int b = threadIdx.x; b < gridDim.x; b += blockDim.x) {\n");
    for (s, (c, _, _)) in slots.iter().enumerate() {
        let p = format!("((volatile double*)partials)[{s}u * gridDim.x + b]");
        let line = c.update(&format!("r{s}"), &p);
        let _ = writeln!(fold, "        {line}");
    }
    fold.push_str("    }\n");
    for (s, (c, _, _)) in slots.iter().enumerate() {
        let _ = writeln!(fold, "    r{s} = kf_block_{}(r{s}, kf_smem);", c.name());
    }
    (block_reduce, partials, fold)
}
