//! The device checks of lengths/offsets values: every kernel of a graph with such inputs takes
//! an error record (`kf_err`, null: no checks) and a tag (`kf_tag`). A lengths value is checked
//! where it is read (one compare; the value is clamped as before either way); offsets, and
//! lengths that kernel 0 does not read, are checked by a grid-stride loop at the start of kernel
//! 0 (only when the record is not null). A violation is recorded (`kf_report`: the first one
//! only) and sets the thread's `kf_bad`: its float stores then write NaN, its fills write NaN
//! bits, and its reduction accumulators become NaN before the block reduction, so every scalar
//! the block contributes to (the loss) comes out NaN. Where a thread that reads a bound is not
//! the one that stores the row (the rows plan), `kf_bad` is or-ed over the threads that share
//! the bounds at the barrier that publishes them.
//!
//! Not handled here: reading the record (the runtime), naming the violation (the facade).

use std::fmt::Write as _;

use kfuse_ir::{Constraint, DType};

use crate::plan::ViolationKind;

/// The declaration of `kf_bad` at the top of a checked kernel.
pub(crate) const BAD_DECL: &str =
    "    bool kf_bad = false; // a lengths/offsets check failed in this thread: float outputs are written NaN\n";

/// The NaN an f32 store writes while `kf_bad` holds.
const NAN_F32: &str = "__int_as_float(0x7fc00000)";

/// The check of lengths value `v` of input `input` at flat position `off` against `bound`.
pub(crate) fn lengths_check(input: u32, off: &str, v: &str, bound: &str) -> String {
    let (neg, big) = (ViolationKind::LengthNegative as u32, ViolationKind::LengthTooLarge as u32);
    format!(
        "if (kf_err != nullptr && (unsigned long long)(long long){v} > (unsigned long long)({bound})) {{ kf_bad = true; \
         kf_report(kf_err, kf_tag, {input}u, {v} < 0 ? {neg}u : {big}u, (long long)({off}), (long long){v}, (long long)({bound})); }} \
         // check: 0 <= lengths <= {bound}"
    )
}

/// `v` as a checked kernel stores it into a `dtype` output: NaN while `kf_bad` holds (floats).
pub(crate) fn poisoned(checks: bool, dtype: DType, v: &str) -> String {
    if checks && dtype.is_float() {
        format!("(kf_bad ? {NAN_F32} : {v})")
    } else {
        v.to_string()
    }
}

/// The 32-bit word a checked fill of a `dtype` output writes while `kf_bad` holds (NaN bits in
/// every element of the word), or `None` for outputs that are not floats.
pub(crate) fn fill_word(dtype: DType) -> Option<u32> {
    match dtype {
        DType::F32 => Some(0x7fc0_0000),
        DType::F16 => Some(0x7e00_7e00),
        DType::BF16 => Some(0x7fc0_7fc0),
        _ => None,
    }
}

/// The line that makes a checked thread's accumulators NaN (before its block's reduction).
pub(crate) fn poison_accumulators(slots: usize, indent: &str) -> String {
    if slots == 0 {
        return String::new();
    }
    let accs: Vec<String> =
        (0..slots).map(|s| format!("acc{s} = __longlong_as_double(0x7ff8000000000000ll);")).collect();
    format!("{indent}if (kf_bad) {{ {} }} // a failed check: every result of the block is NaN\n", accs.join(" "))
}

/// One input that kernel 0 checks with a loop: its index, its constraint, its element count and
/// its bound (C expressions).
pub(crate) struct LoopCheck {
    pub input: u32,
    pub name: String,
    pub constraint: Constraint,
    pub count: String,
    pub bound: String,
}

/// Kernel 0's grid-stride check of the inputs in `checks` (nothing when the record is null),
/// with the host check's rules: lengths in `[0, bound]`; offsets non-empty, starting at 0,
/// non-decreasing, at most and ending at the packed size.
pub(crate) fn loop_checks(checks: &[LoopCheck]) -> String {
    let mut s = String::new();
    if checks.is_empty() {
        return s;
    }
    s.push_str(
        "    if (kf_err != nullptr) { // the checks of the lengths/offsets inputs this kernel does not read itself\n",
    );
    s.push_str("        const long long kf_c0 = (long long)blockIdx.x * blockDim.x + threadIdx.x, kf_cs = (long long)gridDim.x * blockDim.x;\n");
    for c in checks {
        let (i, n, b) = (c.input, &c.count, &c.bound);
        let k = |v: ViolationKind| v as u32;
        match c.constraint {
            Constraint::Lengths { .. } => {
                let _ =
                    writeln!(s, "        for (long long j = kf_c0; j < {n}; j += kf_cs) {{ // {} as lengths", c.name);
                let _ = writeln!(s, "            const int v = in{i}[j];");
                let _ = writeln!(
                    s,
                    "            if ((unsigned long long)(long long)v > (unsigned long long)({b})) {{ kf_bad = true; kf_report(kf_err, kf_tag, {i}u, v < 0 ? {}u : {}u, j, v, {b}); }}",
                    k(ViolationKind::LengthNegative),
                    k(ViolationKind::LengthTooLarge)
                );
                s.push_str("        }\n");
            }
            Constraint::Offsets { .. } => {
                let _ = writeln!(
                    s,
                    "        if (kf_c0 == 0 && {n} == 0) {{ kf_bad = true; kf_report(kf_err, kf_tag, {i}u, {}u, 0, 0, {b}); }} // {}: no element",
                    k(ViolationKind::OffsetsEmpty),
                    c.name
                );
                let _ =
                    writeln!(s, "        for (long long j = kf_c0; j < {n}; j += kf_cs) {{ // {} as offsets", c.name);
                let _ = writeln!(s, "            const int v = in{i}[j];");
                let _ = writeln!(s, "            const int p = j > 0 ? in{i}[j - 1] : 0;");
                let _ = writeln!(
                    s,
                    "            const unsigned int kf_k = (j == 0 && v != 0) ? {}u : (v < p ? {}u : ((long long)v > ({b}) ? {}u : ((j == {n} - 1 && (long long)v != ({b})) ? {}u : 0u)));",
                    k(ViolationKind::OffsetStart),
                    k(ViolationKind::OffsetDecrease),
                    k(ViolationKind::OffsetPastEnd),
                    k(ViolationKind::OffsetEnd)
                );
                let _ = writeln!(
                    s,
                    "            if (kf_k != 0u) {{ kf_bad = true; kf_report(kf_err, kf_tag, {i}u, kf_k, j, v, kf_k == {}u ? (long long)p : (long long)({b})); }}",
                    k(ViolationKind::OffsetDecrease)
                );
                s.push_str("        }\n");
            }
        }
    }
    s.push_str("    }\n");
    s
}
