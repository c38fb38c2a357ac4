//! Benchmarks of a program on the GPU: CUDA events, warm-up, the median of many runs, in three
//! modes; agreement with the interpreter; bytes moved against the card's copy bandwidth measured
//! in the same run; optionally a hand-written baseline kernel timed the same way.
//!
//! The three modes (per-launch medians):
//! - **b2b** (back to back): batches of 20 launches on one buffer set between two events. Inputs
//!   and outputs that fit in L2 stay there between launches, so it flatters a kernel whose
//!   working set is near the L2 size.
//! - **rot** (rotated): k complete buffer sets (inputs uploaded k times, own outputs and scratch),
//!   k the smallest number ≥ 2 with k × (all input and output bytes) ≥ 3 × L2 (at most
//!   [`MAX_ROTATION_SETS`]); batches of 20·k launches cycling set 0, 1, …, k−1, 0, …. Each launch
//!   finds (most of) its inputs in DRAM and pays only its own outputs' write-backs, as a copy
//!   over a large buffer does. The outputs of set k−1 are checked against the interpreter after
//!   the timing. `--rotate-sets N` ([`BenchOptions::rotate_sets`]) fixes k instead; device memory
//!   too short for k sets is no error: the sets that fit are used, with a note in the report.
//! - **flush**: each launch alone between two events, after a memset of 2 × L2 (at least 64 MiB),
//!   which leaves L2 full of dirty lines, so the launch also pays for writing back foreign data.
//!
//! Not here: speed assertions (speed is only ever claimed here, never in tests), the choice of
//! inputs (the caller's files or [`random_inputs`]).

use std::fmt;
use std::time::Instant;

use kfuse::runtime::{DeviceBuffer, Gpu, GpuFunction, KernelArg, KernelLaunch, RuntimeError};
use kfuse::{DType, Graph, HostTensor};
use serde::Serialize;

use kfuse::exec::CudaProgram;
use kfuse::Program;
use std::sync::Arc;

use crate::Error;

const HANDWRITTEN: &str = include_str!("baselines/giou_handwritten.cu");

/// Launches per event pair in the back-to-back mode, and rounds over all sets in the rotated mode.
const BATCH: usize = 20;

/// The most buffer sets the rotated mode binds.
pub const MAX_ROTATION_SETS: usize = 64;

/// Bytes of each of the two buffers of the copy-bandwidth measurement (see [`copy_bandwidth`]).
pub const COPY_BANDWIDTH_BUFFER_BYTES: usize = 1 << 30;

/// How to bench.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Timed runs per figure (after warm-up).
    pub iters: usize,
    /// A hand-written baseline to time in the same run (`giou`).
    pub baseline: Option<String>,
    /// Buffer sets of the rotated mode (2..=[`MAX_ROTATION_SETS`]); `None` picks them with
    /// [`rotation_sets`].
    pub rotate_sets: Option<usize>,
}

/// Median, min and spread of a set of timings, in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Timing {
    pub median_us: f64,
    pub min_us: f64,
    pub p90_us: f64,
    pub runs: usize,
}

impl Timing {
    fn from_ms(mut ms: Vec<f32>) -> Timing {
        ms.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize] as f64 * 1000.0;
        Timing { median_us: at(0.5), min_us: at(0.0), p90_us: at(0.9), runs: ms.len() }
    }
}

/// How the rotated mode ran: its buffer sets and the check of the last one.
#[derive(Clone, Debug, Serialize)]
pub struct Rotation {
    /// Buffer sets cycled through.
    pub sets: usize,
    /// Bytes of one set's inputs and outputs (all of them, read under a predicate or not).
    pub set_bytes: u64,
    /// Worst relative error of set k−1's outputs, downloaded after the timing, against the
    /// interpreter (its outputs were poisoned after the warm-up, so they come from timed launches).
    pub max_rel_err: f64,
    /// Why fewer sets than asked for were used, if so.
    pub note: Option<String>,
}

/// One timed kernel set: the generated program or a baseline.
#[derive(Clone, Debug, Serialize)]
pub struct Timed {
    pub name: String,
    pub launches: usize,
    pub l2_flushed: Timing,
    pub back_to_back: Timing,
    /// Launches cycling over [`Rotation::sets`] buffer sets (see the module doc).
    pub rotated: Timing,
    pub rotation: Rotation,
    /// Bytes the run must move at least (see `must_touch_bytes`).
    pub bytes: u64,
    /// `bytes` over the back-to-back, rotated and flushed medians.
    pub gbps_back_to_back: f64,
    pub gbps_rotated: f64,
    pub gbps_l2_flushed: f64,
    /// Worst relative error of any output against the interpreter.
    pub max_rel_err: f64,
}

/// The three timings of one kernel set.
struct Timings {
    l2_flushed: Timing,
    back_to_back: Timing,
    rotated: Timing,
}

impl Timed {
    fn new(name: &str, launches: usize, t: Timings, rotation: Rotation, bytes: u64, max_rel_err: f64) -> Timed {
        let gbps = |t: &Timing| bytes as f64 / (t.median_us * 1e3);
        Timed {
            name: name.to_string(),
            launches,
            gbps_back_to_back: gbps(&t.back_to_back),
            gbps_rotated: gbps(&t.rotated),
            gbps_l2_flushed: gbps(&t.l2_flushed),
            l2_flushed: t.l2_flushed,
            back_to_back: t.back_to_back,
            rotated: t.rotated,
            rotation,
            bytes,
            max_rel_err,
        }
    }
}

/// Everything `kfuse bench` prints.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub file: String,
    pub device: String,
    pub date_utc: String,
    pub sizes: Vec<(String, u64)>,
    /// The device's L2 size.
    pub l2_bytes: u64,
    /// Bytes the flushed mode's memset writes before each launch.
    pub flush_bytes: u64,
    pub copy_bandwidth_gbps: f64,
    /// Bytes of each of the copy's two buffers ([`COPY_BANDWIDTH_BUFFER_BYTES`]).
    pub copy_bandwidth_buffer_bytes: u64,
    pub prepare_ms: f64,
    pub interpreter_ms: f64,
    pub outputs: Vec<OutputCheck>,
    pub kfuse: Timed,
    pub baseline: Option<Timed>,
    /// Inputs read only where a predicate holds, left out of `bytes`.
    pub masked_inputs: Vec<String>,
}

/// One output compared with the interpreter.
#[derive(Clone, Debug, Serialize)]
pub struct OutputCheck {
    pub name: String,
    pub gpu: Option<f64>,
    pub cpu: Option<f64>,
    pub rel_err: f64,
    pub max_abs_err: f64,
}

/// Buffer sets for the rotated mode: the smallest k ≥ 2 with k × `set_bytes` ≥ 3 × `l2_bytes`,
/// at most [`MAX_ROTATION_SETS`] (an empty set gets the most).
pub fn rotation_sets(set_bytes: u64, l2_bytes: u64) -> usize {
    let want = l2_bytes.saturating_mul(3);
    let k = if set_bytes == 0 { MAX_ROTATION_SETS as u64 } else { want.div_ceil(set_bytes) };
    usize::try_from(k).unwrap_or(MAX_ROTATION_SETS).clamp(2, MAX_ROTATION_SETS)
}

/// Random inputs for the given symbol sizes (see [`crate::testdata`] for what they hold).
pub fn random_inputs(graph: &Graph, sizes: &[(String, u64)], seed: u64) -> Result<Vec<(String, HostTensor)>, Error> {
    let mut vals = vec![None; graph.symbols.len()];
    for (name, v) in sizes {
        let s = graph
            .symbol(name)
            .ok_or_else(|| Error::UnknownDim { name: name.clone(), known: graph.symbols.join(", ") })?;
        vals[s.0 as usize] = Some(*v);
    }
    let sizes: Vec<u64> = vals
        .iter()
        .zip(&graph.symbols)
        .map(|(v, n)| v.ok_or_else(|| Error::MissingDim { name: n.clone() }))
        .collect::<Result<_, _>>()?;
    crate::testdata::random_inputs_for(graph, &sizes, seed)
}

/// Relative error of `got` against `want`: ‖got − want‖₂ / ‖want‖₂ (absolute when `want` is 0),
/// and the largest absolute difference. NaN in the same places counts as agreement.
pub fn compare(got: &HostTensor, want: &HostTensor) -> (f64, f64) {
    if got.len() != want.len() {
        return (f64::INFINITY, f64::INFINITY);
    }
    let (g, w) = (got.to_f64(), want.to_f64());
    let (mut num, mut max_abs) = (0.0f64, 0.0f64);
    for (a, b) in g.iter().zip(&w) {
        if (a.is_nan() && b.is_nan()) || a == b {
            continue; // equal, or NaN in the same place, or the same infinity
        }
        let d = (a - b).abs();
        let d = if d.is_nan() { f64::INFINITY } else { d };
        num += d * d;
        max_abs = max_abs.max(d);
    }
    let den: f64 = w.iter().filter(|b| b.is_finite()).map(|b| b * b).sum();
    let rel = if den > 0.0 { num.sqrt() / den.sqrt() } else { num.sqrt() };
    (rel, max_abs)
}

/// Checks what can be checked before a GPU is opened: the rotated mode's set count.
pub fn check_options(opts: &BenchOptions) -> Result<(), Error> {
    match opts.rotate_sets {
        Some(k) if !(2..=MAX_ROTATION_SETS).contains(&k) => Err(Error::RotateSets { sets: k, max: MAX_ROTATION_SETS }),
        _ => Ok(()),
    }
}

/// Times `program` on `gpu` with `inputs`.
pub fn run(
    gpu: &Arc<Gpu>,
    program: &Program,
    inputs: &[(String, HostTensor)],
    opts: &BenchOptions,
) -> Result<BenchReport, Error> {
    let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let iters = opts.iters.max(10);
    check_options(opts)?;

    let t0 = Instant::now();
    let cpu = program.run_cpu(&named)?;
    let interpreter_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t0 = Instant::now();
    let prog = CudaProgram::prepare(gpu, program)?;
    let bound = prog.bind(&named)?;
    prog.launch(&bound)?;
    gpu.synchronize()?;
    let prepare_ms = t0.elapsed().as_secs_f64() * 1e3;
    // A cold first call launched quick builds: time the optimised ones (bound again, so that a
    // cooperative kernel's grid is sized for the build it launches).
    prog.wait_for_optimised();
    let bound = prog.bind(&named)?;

    // The checked run reuses the bound buffers, poisoned first, so an unwritten element shows.
    prog.poison_outputs(&bound, 0xff)?;
    prog.launch(&bound)?;
    let gpu_out = prog.download(&bound)?;
    let outputs: Vec<OutputCheck> = gpu_out
        .iter()
        .zip(&cpu)
        .map(|((name, g), (_, c))| {
            let (rel_err, max_abs_err) = compare(g, c);
            OutputCheck {
                name: name.clone(),
                gpu: g.shape.is_empty().then(|| g.to_f64()[0]),
                cpu: c.shape.is_empty().then(|| c.to_f64()[0]),
                rel_err,
                max_abs_err,
            }
        })
        .collect();
    let max_rel_err = outputs.iter().map(|o| o.rel_err).fold(0.0, f64::max);
    let sizes = program.graph().symbols.iter().cloned().zip(bound.sizes().iter().copied()).collect();

    let l2_bytes = gpu.l2_bytes() as u64;
    let flush = gpu.alloc_zeroed((gpu.l2_bytes() * 2).max(64 << 20))?;
    let (bytes, masked_inputs) = must_touch_bytes(prog.plan(), &cpu, inputs, program.graph());
    let (l2_flushed, back_to_back) = time(gpu, &flush, iters, || Ok(prog.launch(&bound)?))?;

    // The rotated mode: `bound` is set 0; the others are bound the same way from the same tensors.
    let set_bytes = all_bytes(program.graph(), inputs, &cpu);
    let want = opts.rotate_sets.unwrap_or_else(|| rotation_sets(set_bytes, l2_bytes));
    let (sets, note) = bind_sets(bound, want, || Ok(prog.bind(&named)?))?;
    let last = sets.len() - 1;
    let rotated = time_rotated(
        gpu,
        sets.len(),
        iters,
        |i| Ok(prog.launch(&sets[i])?),
        || Ok(prog.poison_outputs(&sets[last], 0xff)?),
    )?;
    let rotated_err =
        prog.download(&sets[last])?.iter().zip(&cpu).map(|((_, g), (_, c))| compare(g, c).0).fold(0.0, f64::max);
    let rotation = Rotation { sets: sets.len(), set_bytes, max_rel_err: rotated_err, note };
    drop(sets);
    let kfuse = Timed::new(
        "kfuse (generated)",
        prog.plan().kernels.len(),
        Timings { l2_flushed, back_to_back, rotated },
        rotation,
        bytes,
        max_rel_err,
    );

    let copy_bandwidth_gbps = copy_bandwidth(gpu)?;
    let baseline = match opts.baseline.as_deref() {
        None => None,
        Some("giou") => Some(giou_baseline(gpu, &flush, inputs, &cpu, iters, bytes, want)?),
        Some(other) => return Err(Error::UnknownBaseline { name: other.to_string() }),
    };
    Ok(BenchReport {
        file: program.origin().to_string(),
        device: gpu.name(),
        date_utc: today_utc(),
        sizes,
        l2_bytes,
        flush_bytes: flush.bytes() as u64,
        copy_bandwidth_gbps,
        copy_bandwidth_buffer_bytes: COPY_BANDWIDTH_BUFFER_BYTES as u64,
        prepare_ms,
        interpreter_ms,
        outputs,
        kfuse,
        baseline,
        masked_inputs,
    })
}

/// Bytes of every input of the graph and every output: one buffer set of the rotated mode
/// (scratch buffers, usually small, are not counted).
fn all_bytes(graph: &Graph, inputs: &[(String, HostTensor)], outputs: &[(String, HostTensor)]) -> u64 {
    let sz = |t: &HostTensor| (t.len() * t.dtype().size_bytes()) as u64;
    let ins: u64 = inputs.iter().filter(|(n, _)| graph.inputs.iter().any(|i| i.name == *n)).map(|(_, t)| sz(t)).sum();
    ins + outputs.iter().map(|(_, t)| sz(t)).sum::<u64>()
}

/// Set 0 (`first`) and up to `want − 1` more sets from `bind_one`. Device memory running out is
/// not an error: the sets bound so far are used, and the note says so.
fn bind_sets<S>(
    first: S,
    want: usize,
    mut bind_one: impl FnMut() -> Result<S, Error>,
) -> Result<(Vec<S>, Option<String>), Error> {
    let mut sets = vec![first];
    while sets.len() < want {
        match bind_one() {
            Ok(s) => sets.push(s),
            Err(Error::Kfuse(kfuse::Error::Runtime(e @ RuntimeError::OutOfMemory { .. }))) => {
                let also = if sets.len() == 1 { ": the rotated figure is then back to back over one set" } else { "" };
                let note = format!("device memory held {} of the {want} buffer sets ({e}){also}", sets.len());
                return Ok((sets, Some(note)));
            }
            Err(e) => return Err(e),
        }
    }
    Ok((sets, None))
}

/// The bytes a run must move: every output once, and every input that some kernel reads for
/// every element. Inputs that every kernel reads only under a hoisted predicate (`pred` of the
/// GIoU loss, read for valid boxes only) are left out, so the figure is a lower bound and the
/// GB/s derived from it never flatter the kernel.
fn must_touch_bytes(
    plan: &kfuse::Plan,
    outputs: &[(String, HostTensor)],
    inputs: &[(String, HostTensor)],
    graph: &Graph,
) -> (u64, Vec<String>) {
    use kfuse::{BufferKind, Param};
    let sz = |t: &HostTensor| (t.len() * t.dtype().size_bytes()) as u64;
    let mut full = std::collections::BTreeSet::new();
    let mut lazy_only = std::collections::BTreeSet::new();
    for k in &plan.kernels {
        for p in &k.params {
            if let Param::Buffer(b) = p {
                if let BufferKind::Input(id) = plan.buffers[*b].kind {
                    if k.lazy_inputs.contains(&id) {
                        lazy_only.insert(id);
                    } else {
                        full.insert(id);
                    }
                }
            }
        }
    }
    let ins: u64 =
        full.iter().filter_map(|id| inputs.iter().find(|(n, _)| *n == graph.input(*id).name)).map(|(_, t)| sz(t)).sum();
    let skipped = lazy_only.difference(&full).map(|id| graph.input(*id).name.clone()).collect();
    (ins + outputs.iter().map(|(_, t)| sz(t)).sum::<u64>(), skipped)
}

/// Times `launch`: each run after an L2 flush, and runs back to back (medians of batches of
/// [`BATCH`]).
fn time(
    gpu: &Gpu,
    flush: &DeviceBuffer,
    iters: usize,
    mut launch: impl FnMut() -> Result<(), Error>,
) -> Result<(Timing, Timing), Error> {
    for _ in 0..10 {
        launch()?;
    }
    gpu.synchronize()?;
    let mut flushed = Vec::with_capacity(iters);
    for i in 0..iters {
        gpu.fill(flush, (i & 0xff) as u8)?;
        let a = gpu.record_event()?;
        launch()?;
        let b = gpu.record_event()?;
        gpu.synchronize()?;
        flushed.push(gpu.elapsed_ms(&a, &b)?);
    }
    let mut b2b = Vec::new();
    for _ in 0..(iters / BATCH).max(5) {
        let a = gpu.record_event()?;
        for _ in 0..BATCH {
            launch()?;
        }
        let b = gpu.record_event()?;
        gpu.synchronize()?;
        b2b.push(gpu.elapsed_ms(&a, &b)? / BATCH as f32);
    }
    Ok((Timing::from_ms(flushed), Timing::from_ms(b2b)))
}

/// Times `launch(set)` cycling over `sets` buffer sets: each set is launched once to warm up, then
/// `poison` runs (it poisons the last set's outputs, so that what is checked afterwards comes from
/// timed launches), then batches of [`BATCH`] rounds over all sets between two events; the
/// per-launch median over batches (as many batches as the back-to-back mode).
fn time_rotated(
    gpu: &Gpu,
    sets: usize,
    iters: usize,
    mut launch: impl FnMut(usize) -> Result<(), Error>,
    poison: impl FnOnce() -> Result<(), Error>,
) -> Result<Timing, Error> {
    for i in 0..sets {
        launch(i)?;
    }
    gpu.synchronize()?;
    poison()?;
    let per_batch = BATCH * sets;
    let mut ms = Vec::new();
    for _ in 0..(iters / BATCH).max(5) {
        let a = gpu.record_event()?;
        for _ in 0..BATCH {
            for i in 0..sets {
                launch(i)?;
            }
        }
        let b = gpu.record_event()?;
        gpu.synchronize()?;
        ms.push(gpu.elapsed_ms(&a, &b)? / per_batch as f32);
    }
    Ok(Timing::from_ms(ms))
}

fn load_handwritten(gpu: &Gpu, name: &str) -> Result<GpuFunction, Error> {
    Ok(gpu.load_kernel(HANDWRITTEN, name)?)
}

/// The card's device-to-device copy bandwidth (bytes read + written per second), in GB/s: a
/// grid-stride float4 copy between two buffers of [`COPY_BANDWIDTH_BUFFER_BYTES`] (far larger
/// than L2), 8 blocks of 256 threads per SM, each launch alone between two events, no flush; the
/// median of 10 launches after 3 warm-ups.
pub fn copy_bandwidth(gpu: &Gpu) -> Result<f64, Error> {
    let f = load_handwritten(gpu, "copy_bandwidth")?;
    let bytes = COPY_BANDWIDTH_BUFFER_BYTES;
    let (src, dst) = (gpu.alloc_zeroed(bytes)?, gpu.alloc_zeroed(bytes)?);
    let n = (bytes / 16) as i64;
    let grid = gpu.sm_count() * 8;
    let mut ms = Vec::new();
    for i in 0..13 {
        let a = gpu.record_event()?;
        gpu.launch(
            &gpu.default_stream(),
            &f,
            KernelLaunch::new(grid, 256),
            &[KernelArg::Buffer(&src), KernelArg::Buffer(&dst), KernelArg::I64(n)],
        )?;
        let b = gpu.record_event()?;
        gpu.synchronize()?;
        if i >= 3 {
            ms.push(gpu.elapsed_ms(&a, &b)?);
        }
    }
    let t = Timing::from_ms(ms);
    Ok(2.0 * bytes as f64 / (t.median_us * 1e3))
}

/// The device buffers of one run of the hand-written GIoU kernel.
struct GiouSet {
    pred: DeviceBuffer,
    target: DeviceBuffer,
    acc: DeviceBuffer,
    ticket: DeviceBuffer,
    loss: DeviceBuffer,
}

impl GiouSet {
    fn upload(gpu: &Gpu, pred: &HostTensor, target: &HostTensor) -> Result<GiouSet, Error> {
        Ok(GiouSet {
            pred: gpu.upload(&pred.to_bytes())?,
            target: gpu.upload(&target.to_bytes())?,
            acc: gpu.alloc_zeroed(8)?,
            ticket: gpu.alloc_zeroed(4)?,
            loss: gpu.alloc_zeroed(4)?,
        })
    }

    fn bytes(&self) -> u64 {
        [&self.pred, &self.target, &self.acc, &self.ticket, &self.loss].iter().map(|b| b.bytes() as u64).sum()
    }

    fn loss(&self, gpu: &Gpu) -> Result<HostTensor, Error> {
        HostTensor::from_bytes(DType::F32, vec![], &gpu.download(&self.loss)?).ok_or(Error::BaselineLoss)
    }
}

/// The hand-written GIoU kernel, timed in the three modes (the rotated one over `want_sets` sets,
/// as the generated program).
fn giou_baseline(
    gpu: &Gpu,
    flush: &DeviceBuffer,
    inputs: &[(String, HostTensor)],
    cpu: &[(String, HostTensor)],
    iters: usize,
    bytes: u64,
    want_sets: usize,
) -> Result<Timed, Error> {
    let get = |name: &str| {
        inputs
            .iter()
            .find(|(n, t)| n == name && t.dtype() == DType::F32 && t.shape.last() == Some(&4))
            .map(|(_, t)| t)
            .ok_or_else(|| Error::BaselineNeeds { what: format!("an f32 input `{name}` of shape [.., 4]") })
    };
    let (pred, target) = (get("pred")?, get("target")?);
    let want = cpu
        .iter()
        .find(|(n, _)| n == "loss")
        .map(|(_, t)| t)
        .ok_or_else(|| Error::BaselineNeeds { what: "an output `loss`".into() })?;
    let n = (target.len() / 4) as i64;
    let f = load_handwritten(gpu, "giou_handwritten")?;
    let grid = u32::try_from((n as u64).div_ceil(256).max(1)).map_err(|_| Error::BaselineBatch)?;
    let launch = |s: &GiouSet| -> Result<(), Error> {
        let args = [
            KernelArg::Buffer(&s.pred),
            KernelArg::Buffer(&s.target),
            KernelArg::I64(n),
            KernelArg::Buffer(&s.acc),
            KernelArg::Buffer(&s.ticket),
            KernelArg::Buffer(&s.loss),
        ];
        Ok(gpu.launch(&gpu.default_stream(), &f, KernelLaunch::new(grid, 256), &args)?)
    };
    let first = GiouSet::upload(gpu, pred, target)?;
    launch(&first)?;
    gpu.synchronize()?;
    let (max_rel_err, _) = compare(&first.loss(gpu)?, want);
    let (l2_flushed, back_to_back) = time(gpu, flush, iters, || launch(&first))?;

    let set_bytes = first.bytes();
    let (sets, note) = bind_sets(first, want_sets, || GiouSet::upload(gpu, pred, target))?;
    let last = &sets[sets.len() - 1];
    let rotated = time_rotated(gpu, sets.len(), iters, |i| launch(&sets[i]), || Ok(gpu.fill(&last.loss, 0xff)?))?;
    let (rotated_err, _) = compare(&last.loss(gpu)?, want);
    let rotation = Rotation { sets: sets.len(), set_bytes, max_rel_err: rotated_err, note };
    Ok(Timed::new(
        "hand-written CUDA (one thread per box)",
        1,
        Timings { l2_flushed, back_to_back, rotated },
        rotation,
        bytes,
        max_rel_err,
    ))
}

/// Today's date in UTC as YYYY-MM-DD.
pub fn today_utc() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (y, m, d) = crate::when::civil_from_days(secs / 86400);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Bytes as MiB (GiB from 1 GiB on) with one decimal.
fn mib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes: Vec<String> = self.sizes.iter().map(|(n, v)| format!("{n}={v}")).collect();
        writeln!(f, "{} on {} ({}), {}", self.file, self.device, self.date_utc, sizes.join(" "))?;
        writeln!(
            f,
            "copy bandwidth: {:.0} GB/s (read+write bytes of a grid-stride copy between two {} buffers, launches back to back, median of 10)",
            self.copy_bandwidth_gbps,
            mib(self.copy_bandwidth_buffer_bytes)
        )?;
        writeln!(
            f,
            "first run incl. compile/load: {:.1} ms; interpreter: {:.1} ms",
            self.prepare_ms, self.interpreter_ms
        )?;
        for o in &self.outputs {
            match (o.gpu, o.cpu) {
                (Some(g), Some(c)) => {
                    writeln!(f, "  {} = {g:.9} (gpu) vs {c:.9} (interpreter), rel err {:.2e}", o.name, o.rel_err)?
                }
                _ => writeln!(
                    f,
                    "  {}: rel err {:.2e}, max abs err {:.2e} vs interpreter",
                    o.name, o.rel_err, o.max_abs_err
                )?,
            }
        }
        let r = &self.kfuse.rotation;
        writeln!(f, "modes (per-launch medians of CUDA event times; L2 {}):", mib(self.l2_bytes))?;
        writeln!(f, "  b2b    batches of {BATCH} launches on one buffer set: what fits in L2 stays there between launches (flatters)")?;
        writeln!(
            f,
            "  rot    batches of {BATCH} rounds over {} buffer sets of {} (inputs+outputs; {:.1}× L2): inputs mostly from DRAM, no foreign write-backs",
            r.sets,
            mib(r.set_bytes),
            (r.sets as u64 * r.set_bytes) as f64 / self.l2_bytes.max(1) as f64
        )?;
        writeln!(
            f,
            "  flush  each launch alone after a {} memset: also pays for writing back the memset's dirty lines",
            mib(self.flush_bytes)
        )?;
        let timed: Vec<&Timed> = std::iter::once(&self.kfuse).chain(self.baseline.as_ref()).collect();
        let w = timed.iter().map(|t| t.name.chars().count()).max().unwrap_or(0).max(6);
        let groups = format!("{:w$} {:>8}{:^24}{:^21}{:^18}", "", "", "median µs", "GB/s", "% copy bw");
        writeln!(f, "{}", groups.trim_end())?;
        writeln!(
            f,
            "{:<w$} {:>8} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5}",
            "kernel", "launches", "b2b", "rot", "flush", "b2b", "rot", "flush", "b2b", "rot", "flush"
        )?;
        for t in &timed {
            let pct = |gbps: f64| 100.0 * gbps / self.copy_bandwidth_gbps;
            writeln!(
                f,
                "{:<w$} {:>8} {:>7.2} {:>7.2} {:>7.2} {:>6.0} {:>6.0} {:>6.0} {:>4.0}% {:>4.0}% {:>4.0}%",
                t.name,
                t.launches,
                t.back_to_back.median_us,
                t.rotated.median_us,
                t.l2_flushed.median_us,
                t.gbps_back_to_back,
                t.gbps_rotated,
                t.gbps_l2_flushed,
                pct(t.gbps_back_to_back),
                pct(t.gbps_rotated),
                pct(t.gbps_l2_flushed)
            )?;
        }
        for t in &timed {
            let r = &t.rotation;
            let note = r.note.as_ref().map(|n| format!("; {n}")).unwrap_or_default();
            writeln!(f, "rot check, {}: {} sets × {}; set {}'s outputs after the timed launches: rel err {:.2e} vs interpreter{note}", t.name, r.sets, mib(r.set_bytes), r.sets - 1, r.max_rel_err)?;
        }
        let skipped = if self.masked_inputs.is_empty() {
            String::new()
        } else {
            format!(" (not counted: {}, read only where the predicate holds)", self.masked_inputs.join(", "))
        };
        writeln!(f, "bytes a run must move (the GB/s above): every output once and every input read for all elements once = {} bytes{skipped}", self.kfuse.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(us: f64) -> Timing {
        Timing { median_us: us, min_us: us - 0.5, p90_us: us + 0.5, runs: 10 }
    }

    fn timed(name: &str, b2b: f64, rot: f64, flush: f64, note: Option<&str>) -> Timed {
        let rotation = Rotation { sets: 5, set_bytes: 33_554_448, max_rel_err: 2.5e-7, note: note.map(str::to_string) };
        let t = Timings { l2_flushed: timing(flush), back_to_back: timing(b2b), rotated: timing(rot) };
        Timed::new(name, 1, t, rotation, 30_000_000, 1.0e-7)
    }

    /// A made-up report (format only: none of these figures was measured).
    fn report() -> BenchReport {
        BenchReport {
            file: "examples/giou.kf".into(),
            device: "Some GPU".into(),
            date_utc: "2026-01-02".into(),
            sizes: vec![("B".into(), 16384), ("N".into(), 256)],
            l2_bytes: 50 << 20,
            flush_bytes: 100 << 20,
            copy_bandwidth_gbps: 3000.0,
            copy_bandwidth_buffer_bytes: COPY_BANDWIDTH_BUFFER_BYTES as u64,
            prepare_ms: 12.5,
            interpreter_ms: 250.0,
            outputs: vec![OutputCheck {
                name: "loss".into(),
                gpu: Some(0.5),
                cpu: Some(0.5),
                rel_err: 1e-7,
                max_abs_err: 5e-8,
            }],
            kfuse: timed("kfuse (generated)", 10.0, 15.0, 20.0, None),
            baseline: Some(timed(
                "hand-written CUDA (one thread per box)",
                12.0,
                20.0,
                30.0,
                Some("device memory held 5 of the 6 buffer sets"),
            )),
            masked_inputs: vec!["pred".into()],
        }
    }

    #[test]
    fn rotation_sets_are_the_fewest_that_reach_three_l2_sizes() {
        let l2 = 50u64 << 20;
        for set in [1u64 << 20, 3 << 20, 17_000_001, 34_600_000, 52_428_800, 67_000_000, 150 << 20, 1 << 30] {
            let k = rotation_sets(set, l2) as u64;
            assert!(k >= 2, "{set}: {k}");
            if k < MAX_ROTATION_SETS as u64 {
                assert!(k * set >= 3 * l2, "{set}: {k} sets do not reach 3× L2");
            }
            if k > 2 {
                assert!((k - 1) * set < 3 * l2, "{set}: {k} sets, one fewer would do");
            }
        }
        assert_eq!(rotation_sets(34_600_000, l2), 5);
        assert_eq!(rotation_sets(1 << 30, l2), 2, "at least two sets");
        assert_eq!(rotation_sets(1 << 10, l2), MAX_ROTATION_SETS, "capped");
        assert_eq!(rotation_sets(0, l2), MAX_ROTATION_SETS, "an empty set");
        assert_eq!(rotation_sets(1 << 20, 0), 2, "no L2 reported");
        assert_eq!(rotation_sets(1, u64::MAX), MAX_ROTATION_SETS, "no overflow");
    }

    #[test]
    fn bind_sets_keeps_what_fits_when_device_memory_runs_out() {
        let oom = || Error::from(RuntimeError::OutOfMemory { bytes: 1 << 30, ordinal: 0 });
        let (sets, note) = bind_sets(0, 4, || Ok(7)).unwrap();
        assert_eq!((sets, note), (vec![0, 7, 7, 7], None));

        let mut left = 2;
        let (sets, note) = bind_sets(0, 6, || {
            if left > 0 {
                left -= 1;
                Ok(1)
            } else {
                Err(oom())
            }
        })
        .unwrap();
        assert_eq!(sets, vec![0, 1, 1]);
        let note = note.unwrap();
        assert!(note.contains("3 of the 6 buffer sets") && note.contains("out of device memory"), "{note}");

        let (sets, note) = bind_sets(0, 3, || Err(oom())).unwrap();
        assert_eq!(sets, vec![0]);
        assert!(note.unwrap().contains("back to back over one set"));

        let other = bind_sets(0, 3, || Err(Error::DriverProbe));
        assert!(matches!(other, Err(Error::DriverProbe)), "other errors are errors");
    }

    #[test]
    fn gbps_come_from_each_mode_median() {
        let t = timed("k", 10.0, 15.0, 20.0, None);
        assert_eq!((t.gbps_back_to_back, t.gbps_rotated, t.gbps_l2_flushed), (3000.0, 2000.0, 1500.0));
    }

    #[test]
    fn the_table_shows_every_mode_with_its_meaning() {
        expect_test::expect![[r#"
            examples/giou.kf on Some GPU (2026-01-02), B=16384 N=256
            copy bandwidth: 3000 GB/s (read+write bytes of a grid-stride copy between two 1.0 GiB buffers, launches back to back, median of 10)
            first run incl. compile/load: 12.5 ms; interpreter: 250.0 ms
              loss = 0.500000000 (gpu) vs 0.500000000 (interpreter), rel err 1.00e-7
            modes (per-launch medians of CUDA event times; L2 50.0 MiB):
              b2b    batches of 20 launches on one buffer set: what fits in L2 stays there between launches (flatters)
              rot    batches of 20 rounds over 5 buffer sets of 32.0 MiB (inputs+outputs; 3.2× L2): inputs mostly from DRAM, no foreign write-backs
              flush  each launch alone after a 100.0 MiB memset: also pays for writing back the memset's dirty lines
                                                                  median µs                GB/s             % copy bw
            kernel                                 launches     b2b     rot   flush    b2b    rot  flush   b2b   rot flush
            kfuse (generated)                             1   10.00   15.00   20.00   3000   2000   1500  100%   67%   50%
            hand-written CUDA (one thread per box)        1   12.00   20.00   30.00   2500   1500   1000   83%   50%   33%
            rot check, kfuse (generated): 5 sets × 32.0 MiB; set 4's outputs after the timed launches: rel err 2.50e-7 vs interpreter
            rot check, hand-written CUDA (one thread per box): 5 sets × 32.0 MiB; set 4's outputs after the timed launches: rel err 2.50e-7 vs interpreter; device memory held 5 of the 6 buffer sets
            bytes a run must move (the GB/s above): every output once and every input read for all elements once = 30000000 bytes (not counted: pred, read only where the predicate holds)
        "#]]
        .assert_eq(&report().to_string());
    }

    #[test]
    fn the_json_carries_the_rotated_figures() {
        let v = serde_json::to_value(report()).unwrap();
        for who in ["kfuse", "baseline"] {
            let t = &v[who];
            assert!(t["rotated"]["median_us"].as_f64().is_some(), "{who}: {t}");
            assert!(t["gbps_rotated"].as_f64().is_some(), "{who}");
            assert_eq!(t["rotation"]["sets"], 5, "{who}");
            assert_eq!(t["rotation"]["set_bytes"], 33_554_448u64, "{who}");
            assert_eq!(t["rotation"]["max_rel_err"], 2.5e-7, "{who}");
            for field in ["back_to_back", "l2_flushed"] {
                assert!(t[field]["median_us"].as_f64().is_some(), "{who}.{field}");
            }
        }
        assert_eq!(v["kfuse"]["gbps_rotated"], 2000.0);
        assert!(v["kfuse"]["rotation"]["note"].is_null());
        assert_eq!(v["baseline"]["rotation"]["note"], "device memory held 5 of the 6 buffer sets");
        assert_eq!(v["l2_bytes"], 50u64 << 20);
        assert_eq!(v["flush_bytes"], 100u64 << 20);
        assert_eq!(v["copy_bandwidth_buffer_bytes"], 1u64 << 30);
    }
}
