//! GPU tier: every example program, in f32, f16 and bf16, at odd sizes, on fresh random data,
//! with poisoned outputs, against the CPU interpreter. Skips (printing why) without a GPU, fails
//! instead with KFUSE_REQUIRE_GPU=1.

use std::sync::Arc;

use kfuse::{exec::CudaProgram, DType, Engine, HostTensor, Program};
use kfuse_cli::{bench::compare, testdata};
use kfuse_testing as common;
use kfuse_testing::gpu_or_skip;

/// `src` compiled with its f32 inputs at `dtype`.
fn compile_at(engine: &Engine, src: &str, origin: &str, dtype: DType) -> Program {
    let p = Program::compile(engine, src, origin).unwrap_or_else(|e| panic!("{origin}: {e}"));
    let dtypes = common::float_inputs_as(p.interface(), dtype);
    let dtypes: Vec<(&str, DType)> = dtypes.iter().map(|(n, d)| (n.as_str(), *d)).collect();
    p.with_input_dtypes(&dtypes).unwrap_or_else(|e| panic!("{origin}: {e}"))
}

fn engine_of(gpu: &kfuse::runtime::Gpu) -> Engine {
    Engine::with_cache(gpu.cache().clone())
}

/// Relative error allowed against the interpreter: f32 arithmetic against f64; f16/bf16 outputs
/// are rounded to their storage precision on both sides, so one rounding step may differ.
fn tolerance(d: DType) -> f64 {
    match d {
        DType::F16 | DType::BF16 => 1e-2,
        _ => 1e-5,
    }
}

/// Absolute error accepted whatever the relative error: an output that is nearly zero (a focal
/// loss of one box that fits, a cancellation) has a relative error set by f32 rounding of terms
/// far larger than itself, so its error is judged against the scale of those terms (order 1).
fn abs_floor(d: DType) -> f64 {
    match d {
        DType::F16 | DType::BF16 => 1e-3,
        _ => 1e-6,
    }
}

/// Size sets tried for every program: each symbol takes each size in turn (others at 3),
/// plus all symbols at 1, and a larger case.
fn size_sets(symbols: usize) -> Vec<Vec<u64>> {
    let mut sets = vec![vec![1; symbols], vec![0; symbols]];
    for s in 0..symbols {
        for v in [1u64, 3, 255, 256, 1023] {
            let mut set = vec![3; symbols];
            set[s] = v;
            sets.push(set);
        }
    }
    sets.push(vec![257; symbols]);
    sets
}

/// A new seed every run (fresh random data), printed so that a failure can be replayed with
/// KFUSE_TEST_SEED.
fn fresh_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        let seed = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        });
        println!("conformance seed: {seed} (replay with KFUSE_TEST_SEED={seed})");
        seed
    })
}

fn check(gpu: &Arc<kfuse::runtime::Gpu>, p: &Program, sizes: &[u64], seed: u64, dtype: DType) {
    let inputs = testdata::random_inputs_for(p.graph(), sizes, seed).unwrap();
    let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let want = p.run_cpu(&named).unwrap_or_else(|e| panic!("{} {sizes:?}: interpreter: {e}", p.origin()));
    let spread = rounding_spread(p, &named, &want);
    let prog = CudaProgram::prepare(gpu, p).unwrap_or_else(|e| panic!("{}: {e}", p.origin()));
    let bound = prog.bind(&named).unwrap();
    prog.poison_outputs(&bound, 0x7f).unwrap();
    prog.launch(&bound).unwrap();
    let got = prog.download(&bound).unwrap();
    for (((name, g), (_, w)), spread) in got.iter().zip(&want).zip(&spread) {
        assert_eq!(g.shape, w.shape, "{} {name}", p.origin());
        assert_eq!(g.dtype(), w.dtype(), "{} {name}", p.origin());
        let (rel, max_abs) = compare(g, w);
        let (nearest, upward) = *spread;
        let floor = abs_floor(g.dtype()).max(SPREADS * nearest).max(UPWARD_SPREADS * upward);
        let tol = tolerance(g.dtype());
        assert!(
            rel <= tol || max_abs <= floor,
            "{} ({dtype}) output {name} at sizes {sizes:?} (symbols {:?}), seed {seed}: rel err {rel:.3e} > {tol:.0e} and max abs err {max_abs:.3e} > {floor:.1e} (the largest of the floor, {SPREADS} times {nearest:.1e} and {UPWARD_SPREADS} times {upward:.1e}: how far f32 rounding to nearest and upward move the interpreter's result)",
            p.origin(),
            p.graph().symbols
        );
    }
    // Run again on the same buffers: the self-resetting tickets give bit-identical results.
    prog.launch(&bound).unwrap();
    let again = prog.download(&bound).unwrap();
    for ((name, a), (_, b)) in again.iter().zip(&got) {
        assert!(
            a.to_bytes() == b.to_bytes(),
            "{} output {name} at {sizes:?}: a second launch differs in its bits",
            p.origin()
        );
    }
}

/// How many times its f32 rounding spread to nearest (see [`rounding_spread`]) an output may
/// differ by.
const SPREADS: f64 = 8.0;

/// How many times its f32 rounding spread upward an output may differ by.
const UPWARD_SPREADS: f64 = 2.0;

/// For each output of `p`, how far (max abs) the interpreter's result moves when every float
/// value inside the program is rounded to f32, and an output that others use to its dtype, as the
/// kernels compute and store: to nearest (`Program::run_cpu_f32`) and upward
/// (`Program::run_cpu_f32_upward`).
///
/// To nearest: about one ulp of the value where nothing cancels, under the tolerance; far more
/// where large terms cancel (RMSNorm's input gradient over a row of one element), where the
/// GPU's own f32 rounding moves it as much. Over many elements the largest spread is a fair
/// scale of the GPU's, but an output of one element is a single sample of random errors that may
/// cancel by luck (a cancelling `sum(y * dy)` moved by 6e-7 where the GPU's f32 partial sums moved
/// it by 7e-6). Upward, the errors share a sign and add up: about the sum of their magnitudes,
/// above what random errors reach. A spread that is not finite gives no allowance.
fn rounding_spread(p: &Program, inputs: &[(&str, &HostTensor)], want: &[(String, HostTensor)]) -> Vec<(f64, f64)> {
    let spread = |rounded: Vec<(String, HostTensor)>| -> Vec<f64> {
        rounded
            .iter()
            .zip(want)
            .map(|((_, r), (_, w))| Some(compare(r, w).1).filter(|s| s.is_finite()).unwrap_or(0.0))
            .collect()
    };
    let nearest = p.run_cpu_f32(inputs).unwrap_or_else(|e| panic!("{}: the interpreter in f32: {e}", p.origin()));
    let upward =
        p.run_cpu_f32_upward(inputs).unwrap_or_else(|e| panic!("{}: the interpreter in f32 upward: {e}", p.origin()));
    spread(nearest).into_iter().zip(spread(upward)).collect()
}

#[test]
fn every_example_matches_the_interpreter_on_the_gpu() {
    let Some(gpu) = gpu_or_skip("every_example_matches_the_interpreter_on_the_gpu") else { return };
    let gpu = Arc::new(gpu);
    let engine = engine_of(&gpu);
    let mut cases = 0;
    for (stem, src) in common::examples() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let p = compile_at(&engine, &src, &format!("examples/{stem}.kf ({dtype})"), dtype);
            for (i, mut sizes) in size_sets(p.graph().symbols.len()).into_iter().enumerate() {
                // An offsets input holds S = B + 1 >= 1 boundaries, and with no segment (S = 1)
                // there is no packed row either (T = 0).
                for c in &p.graph().constraints {
                    if let (kfuse::Constraint::Offsets { total: kfuse::Dim::Sym(t), .. }, Some(kfuse::Dim::Sym(s))) =
                        (c, p.graph().input(c.input()).shape.0.first())
                    {
                        sizes[s.0 as usize] = sizes[s.0 as usize].max(1);
                        if sizes[s.0 as usize] == 1 {
                            sizes[t.0 as usize] = 0;
                        }
                    }
                }
                check(&gpu, &p, &sizes, fresh_seed() + i as u64, dtype);
                cases += 1;
            }
        }
    }
    println!("{cases} GPU cases agreed with the interpreter");
}

#[test]
fn giou_on_a_seed_like_batch_agrees_to_1e5() {
    let Some(gpu) = gpu_or_skip("giou_on_a_seed_like_batch_agrees_to_1e5") else { return };
    let gpu = Arc::new(gpu);
    let src = std::fs::read_to_string(common::examples_dir().join("giou.kf")).unwrap();
    let p = Program::compile(&engine_of(&gpu), &src, "examples/giou.kf").unwrap();
    for (batch, n) in [(1024, 256), (16384, 256), (1, 1), (3, 1023)] {
        let b = kfuse_cli::boxes::generate(batch, n, fresh_seed()).unwrap();
        let inputs = [("pred", &b.pred), ("target", &b.target)];
        let want = p.run_cpu(&inputs).unwrap();
        let got = CudaProgram::prepare(&gpu, &p).unwrap().run(&inputs).unwrap();
        let (rel, _) = compare(&got[0].1, &want[0].1);
        assert!(
            rel <= 1e-5,
            "B={batch} N={n}: loss {:?} vs {:?}, rel err {rel:.2e}",
            got[0].1.scalar_f64(),
            want[0].1.scalar_f64()
        );
    }
}

#[test]
fn a_new_batch_size_never_recompiles() {
    let Some(shared) = gpu_or_skip("a_new_batch_size_never_recompiles") else { return };
    // A private cache, so that kernels compiled by tests running beside this one don't count.
    let cache = std::sync::Arc::new(kfuse::runtime::KernelCache::memory_only());
    let gpu = Arc::new(kfuse::runtime::Gpu::open_with_cache(shared.ordinal(), cache).unwrap());
    let src = std::fs::read_to_string(common::examples_dir().join("giou_train.kf")).unwrap();
    let p = Program::compile(&engine_of(&gpu), &src, "examples/giou_train.kf").unwrap();
    let prog = CudaProgram::prepare(&gpu, &p).unwrap();
    // A cold load compiles the optimised builds in the background (see `tiered`): done first.
    prog.wait_for_optimised();
    let compiles = gpu.cache().stats().session.compiles;
    for (batch, n) in [(1, 1), (7, 300), (1024, 256), (5000, 3)] {
        let b = kfuse_cli::boxes::generate(batch, n, fresh_seed()).unwrap();
        let inputs = [("pred", &b.pred), ("target", &b.target)];
        let got = prog.run(&inputs).unwrap();
        let want = p.run_cpu(&inputs).unwrap();
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            let (rel, _) = compare(g, w);
            assert!(rel <= 1e-5, "B={batch} N={n} {name}: rel err {rel:.2e}");
        }
        // Preparing again (a new op object for the same description) finds the kernels in memory.
        CudaProgram::prepare(&gpu, &p).unwrap();
    }
    assert_eq!(
        gpu.cache().stats().session.compiles,
        compiles,
        "sizes are kernel arguments: no compile after the first"
    );
}

#[test]
fn tuned_plans_match_the_interpreter_on_the_gpu() {
    // The code generation choices `kfuse bench` can tune: the two-kernel lengths gradient (the
    // default is the one-launch rows plan), other launch bounds and elements per thread, another
    // block size (with the two-kernel gradient); each on the training examples at odd sizes,
    // relaunched bit-identically. For
    // the rows plan (grid 2 blocks per SM, each a contiguous share of the rows in tiles of up to
    // 64; 264 blocks on 132 SMs): 20001 rows give a block two tiles, whose further rows the
    // compute warps count before arriving; 2200 rows give a block 8 or 9; odd N makes 16-byte
    // chunks of bf16 boxes cross rows (element stores there); N = 0 makes every row empty.
    let Some(gpu) = gpu_or_skip("tuned_plans_match_the_interpreter_on_the_gpu") else { return };
    let gpu = Arc::new(gpu);
    let engine = engine_of(&gpu);
    use kfuse::{CodegenOptions, LengthsGradient};
    let tunings = [
        CodegenOptions { lengths_gradient: LengthsGradient::TwoKernels, ..CodegenOptions::default() },
        CodegenOptions::default(),
        CodegenOptions { batched_threads_per_sm: 768, elems_per_thread: 2, ..CodegenOptions::default() },
        // The rows plan refuses block sizes other than its own, so this one plans two kernels.
        CodegenOptions {
            block_size: 128,
            batched_threads_per_sm: 512,
            elems_per_thread: 8,
            lengths_gradient: LengthsGradient::TwoKernels,
            ..CodegenOptions::default()
        },
    ];
    let mut cases = 0;
    for stem in ["giou_train", "giou_train_lengths", "smooth_l1_train_lengths"] {
        let src = std::fs::read_to_string(common::examples_dir().join(format!("{stem}.kf"))).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            for (t, tuning) in tunings.iter().enumerate() {
                let p = compile_at(&engine, &src, &format!("examples/{stem}.kf ({dtype}, tuning {t})"), dtype)
                    .with_codegen(tuning.clone())
                    .unwrap();
                for (i, sizes) in [
                    vec![0, 3],
                    vec![1, 1],
                    vec![3, 255],
                    vec![257, 1023],
                    vec![1023, 3],
                    vec![20001, 5],
                    vec![2200, 7],
                    vec![700, 0],
                ]
                .into_iter()
                .enumerate()
                {
                    check(&gpu, &p, &sizes, fresh_seed() + 100 * t as u64 + i as u64, dtype);
                    cases += 1;
                }
            }
        }
    }
    println!("{cases} tuned GPU cases agreed with the interpreter");
}

/// Programs whose reductions along the last axis are used again in their rows (the row-wise
/// shape: each row's group of lanes computes them once), with the sizes of their symbols to try:
/// row counts and lengths around a warp and a block (1, 3, 31, 33, 1023, 4097), rows of one
/// element, empty rows and long rows (262144) with few of them.
const ROW_PROGRAMS: &[(&str, &str)] = &[
    (
        "softmax",
        "input x: f32[B, C]\nlet m = max(x, axis: -1)\nlet e = exp(x - m[.., None])\noutput y = e / sum(e, axis: -1)[.., None]\n",
    ),
    (
        "layer norm and its input gradient",
        "input x: f32[B, C]\ninput w: f32[C]\ninput b: f32[C]\ninput dy: f32[B, C]\n\
         let mu = mean(x, axis: -1, keepdim: true)\nlet d = x - mu\nlet var = mean(d * d, axis: -1, keepdim: true)\n\
         output y = d * rsqrt(var + 0.00001) * w + b\noutput loss = sum(y * dy)\noutput dx = grad(loss, x)\n",
    ),
    (
        "layer norm and its weight gradients (summed per column by the row kernel)",
        "input x: f32[B, C]\ninput w: f32[C]\ninput b: f32[C]\ninput dy: f32[B, C]\n\
         let mu = mean(x, axis: -1, keepdim: true)\nlet d = x - mu\nlet var = mean(d * d, axis: -1, keepdim: true)\n\
         output y = d * rsqrt(var + 0.00001) * w + b\nlet loss = sum(y * dy)\noutput dx = grad(loss, x)\n\
         output dw = grad(loss, w)\noutput db = grad(loss, b)\n",
    ),
    (
        "RMS norm and its weight gradient",
        "input x: f32[B, C]\ninput w: f32[C]\ninput dy: f32[B, C]\n\
         let y = x * rsqrt(mean(x * x, axis: -1, keepdim: true) + 0.00001) * w\n\
         output loss = sum(y * dy)\noutput dx = grad(loss, x)\noutput dw = grad(loss, w)\n",
    ),
    (
        "masked row reductions, per row and used again",
        "input x: f32[B, C]\ninput k: f32[B, C]\nlet m = k > 0.0\n\
         output s = sum(x, where: m, axis: -1)\noutput hi = max(x, where: m, axis: -1)\n\
         output lo = min(x, where: m, axis: -1)\noutput n = count(m, axis: -1)\n\
         output z = x - mean(x, where: m, axis: -1)[.., None]\n",
    ),
    (
        "per-row results into a mean",
        "input x: f32[B, C]\ninput t: f32[B, C]\nlet z = x - max(x, axis: -1)[.., None]\n\
         let lse = log(sum(exp(z), axis: -1))\noutput loss = mean(lse - sum(t * z, axis: -1))\noutput dx = grad(loss, x)\n",
    ),
    (
        "rows of a rank-3 tensor",
        "input x: f32[A, B, C]\noutput y = x - max(x, axis: -1)[.., None]\noutput r = mean(sum(x * x, axis: -1))\n",
    ),
];

/// Each program of `programs` in f32 and bf16 at each `(rows, cols)` of `rows_by_cols` (a rank-3
/// program gets its sizes from `rank3`), against the interpreter: the number of cases.
fn check_programs(
    gpu: &Arc<kfuse::runtime::Gpu>,
    programs: &[(&str, &str)],
    rows_by_cols: &[(u64, u64)],
    rank3: impl Fn(u64, u64) -> Vec<u64>,
    seed: u64,
) -> usize {
    let engine = engine_of(gpu);
    let mut cases = 0;
    for (what, src) in programs {
        for dtype in [DType::F32, DType::BF16] {
            let p = compile_at(&engine, src, &format!("{what} ({dtype})"), dtype);
            for (k, &(rows, cols)) in rows_by_cols.iter().enumerate() {
                let sizes = if p.graph().symbols.len() == 3 { rank3(rows, cols) } else { vec![rows, cols] };
                check(gpu, &p, &sizes, seed + k as u64, dtype);
                cases += 1;
            }
        }
    }
    cases
}

/// Pure tier: each program of `programs` parses, runs on the interpreter, and gets a kernel whose
/// header contains `shape`.
fn plans_with_shape(programs: &[(&str, &str)], shape: &str) {
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    for (what, src) in programs {
        let p = Program::compile(&engine, src, what).unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = p.plan().kernels.iter().filter(|k| k.source.contains(shape)).count();
        assert!(got >= 1, "{what}: no kernel with `{shape}` in\n{}", p.cuda_source());
        let sizes = vec![3; p.graph().symbols.len()];
        let inputs = testdata::random_inputs_for(p.graph(), &sizes, 7).unwrap();
        let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        p.run_cpu(&named).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

#[test]
fn row_reductions_match_the_interpreter_at_odd_row_counts_and_lengths() {
    let Some(gpu) = gpu_or_skip("row_reductions_match_the_interpreter_at_odd_row_counts_and_lengths") else { return };
    let gpu = Arc::new(gpu);
    // Row lengths that are multiples of 4 and fit the lanes' registers (1000, 4, 2052, 4096) take
    // the kernels' entry point for rows in registers; the others the one for any row.
    let rows_by_cols: &[(u64, u64)] = &[
        (1, 1),
        (3, 3),
        (31, 33),
        (33, 31),
        (1023, 1000),
        (31, 4),
        (7, 2052),
        (33, 4096),
        (4097, 3),
        (3, 4097),
        (0, 5),
        (5, 0),
        (2, 262_144),
    ];
    // A rank-3 program takes its rows as A x B (B odd).
    let mut cases =
        check_programs(&gpu, ROW_PROGRAMS, rows_by_cols, |r, c| vec![r.div_ceil(3), 3.min(r), c], fresh_seed());
    // Other block sizes: row groups of more than a warp fold through shared memory.
    let engine = engine_of(&gpu);
    // (At 1024 threads the weight gradients keep a column kernel of their own: the row kernel's
    // shared array of sums would pass 32 KiB.)
    for (block_size, program) in [(64, 1), (1024, 1), (64, 2), (1024, 2)] {
        let (what, src) = ROW_PROGRAMS[program];
        let p = compile_at(&engine, src, what, DType::F32);
        let opts = kfuse::CodegenOptions { block_size, ..Default::default() };
        let p = p.with_codegen(opts).unwrap();
        for (k, sizes) in [[33u64, 4097], [1023, 1000], [7, 1024], [3, 100_003]].into_iter().enumerate() {
            check(&gpu, &p, &sizes, fresh_seed() + 100 + k as u64, DType::F32);
            cases += 1;
        }
    }
    println!("{cases} row-wise GPU cases agreed with the interpreter");
}

#[test]
fn row_programs_plan_their_row_reductions_once_per_row() {
    plans_with_shape(ROW_PROGRAMS, "computed once per row");
}

/// Programs that reduce over their leading axis (the columns shape: chunks of rows per tile of
/// 32 columns, folded in order by the tile's last block), with sizes around a tile and a chunk.
const COLUMN_PROGRAMS: &[(&str, &str)] = &[
    (
        "column sum, max and masked mean",
        "input x: f32[B, D]\ninput y: f32[B, D]\noutput s = sum(x, axis: 0)\noutput hi = max(x * y, axis: 0)\n\
         output m = mean(x, where: y > 0.0, axis: 0)\noutput n = count(y > 0.0, axis: 0)\n",
    ),
    (
        "a bias gradient beside the input gradient",
        "input x: f32[B, D]\ninput bias: f32[D]\ninput dy: f32[B, D]\nlet z = x + bias\n\
         let y = 0.5 * z * (1.0 + erf(z * 0.7071067811865476))\noutput loss = sum(y * dy)\n\
         output dx = grad(loss, x)\noutput dbias = grad(loss, bias)\n",
    ),
    (
        "a leading axis of a rank-3 tensor",
        "input x: f32[B, T, D]\noutput s = sum(x * x, axis: 0)\noutput lo = min(x, axis: 0)\n",
    ),
    (
        "a constant and a scalar output beside a column sum",
        "input a: f32\ninput x: f32[B, D]\ninput w: f32[D]\noutput one = f32(1)\noutput half = a * 0.5\n\
         output g = (sum(x, axis: 0) - w) * a\n",
    ),
];

#[test]
fn column_reductions_match_the_interpreter_at_odd_row_and_column_counts() {
    let Some(gpu) = gpu_or_skip("column_reductions_match_the_interpreter_at_odd_row_and_column_counts") else {
        return;
    };
    let gpu = Arc::new(gpu);
    let rows_by_cols: &[(u64, u64)] =
        &[(1, 1), (3, 3), (31, 33), (33, 31), (1023, 65), (4097, 3), (3, 4097), (0, 5), (5, 0), (100_003, 40)];
    // A rank-3 program takes its columns as T x D (T = 3).
    let cases =
        check_programs(&gpu, COLUMN_PROGRAMS, rows_by_cols, |r, c| vec![r, 3, c.div_ceil(3)], fresh_seed() + 200);
    println!("{cases} column GPU cases agreed with the interpreter");
}

#[test]
fn column_programs_plan_split_column_reductions() {
    plans_with_shape(COLUMN_PROGRAMS, "folded in chunk order");
}

#[test]
fn a_column_kernel_writes_its_scalar_outputs_before_any_block_returns() {
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    let (what, src) = COLUMN_PROGRAMS.iter().find(|(w, _)| w.starts_with("a constant")).expect("the program");
    let p = Program::compile(&engine, src, what).unwrap();
    let plan = p.plan();
    assert_eq!(plan.kernels.len(), 1, "{}", p.cuda_source());
    let source = &plan.kernels[0].source;
    assert!(source.contains("folded in chunk order"), "{source}");
    // Outputs `one` and `half` (0 and 1), by one thread ahead of the columns' pass, whose blocks
    // return early (no column at all, or not the tile's last block).
    let entry = source.find("extern \"C\"").expect("an entry point");
    let first_return = entry + source[entry..].find("return").expect("a return");
    for o in ["out0[0] = ", "out1[0] = "] {
        let at = source.find(o).unwrap_or_else(|| panic!("no `{o}` in\n{source}"));
        assert!(at < first_return, "`{o}` after a return in\n{source}");
    }
}

/// Programs with gathers (the random indices are in 0..8, so every gathered axis is 8 or more
/// long; an empty batch is the gather_nll example's): a pick per row of a log-softmax and its gradient (row-wise), several picks per row of a
/// computed source, a gather along the leading axis with its gradient (each element of the
/// gradient reads its column's indices), and i64 and bool sources.
const GATHER_PROGRAMS: &[(&str, &str)] = &[
    (
        "log-softmax picks per row and their gradient",
        "input x: f32[B, C]\ninput labels: i64[B, K]\nlet z = x - max(x, axis: -1)[.., None]\n\
         let lp = z - log(sum(exp(z), axis: -1))[.., None]\noutput picked = gather(lp, labels)\n\
         output loss = -mean(gather(lp, labels, axis: -1))\noutput dx = grad(loss, x)\n",
    ),
    (
        "a gather along the leading axis and its gradient",
        "input x: f32[R, C]\ninput idx: i32[K, C]\ninput w: f32[K, C]\nlet y = gather(x * x + 1.0, idx, axis: 0)\n\
         output g = y\noutput loss = sum(w * y)\noutput dx = grad(loss, x)\n",
    ),
    (
        "gathers of i64 and bool sources",
        "input a: i64[B, C]\ninput idx: i64[B, K]\noutput g = gather(a * 3 - 1, idx)\n\
         output m = gather(a > 3, idx, axis: 1)\noutput s = sum(f32(gather(a, idx)), axis: -1)\n",
    ),
];

#[test]
fn gathers_match_the_interpreter_at_odd_sizes() {
    let Some(gpu) = gpu_or_skip("gathers_match_the_interpreter_at_odd_sizes") else { return };
    let gpu = Arc::new(gpu);
    // (rows, gathered axis); every program has a third symbol K (indices a row or rows), 1 or 3.
    let rows_by_cols: &[(u64, u64)] = &[(9, 8), (31, 33), (33, 31), (1023, 1000), (4097, 9), (9, 4097), (8, 262_144)];
    let mut cases =
        check_programs(&gpu, GATHER_PROGRAMS, rows_by_cols, |r, c| vec![r, c, 1 + 2 * (r % 2)], fresh_seed() + 300);
    // An index outside the axis reads nothing and gives NaN (a float source) or 0 / false.
    let engine = engine_of(&gpu);
    let src = "input x: f32[B, C]\ninput a: i32[B, C]\ninput idx: i64[B, K]\noutput f = gather(x, idx)\n\
               output i = gather(a, idx)\noutput b = gather(a > 0, idx)\n";
    let p = compile_at(&engine, src, "out-of-range gathers", DType::F32);
    let x = HostTensor::new(vec![2, 3], kfuse::TensorData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    let a = HostTensor::new(vec![2, 3], kfuse::TensorData::I32(vec![1, 2, 3, 4, 5, 6]));
    let idx = HostTensor::new(vec![2, 3], kfuse::TensorData::I64(vec![2, -1, 3, i64::MIN, 0, 1 << 40]));
    let named = [("x", &x), ("a", &a), ("idx", &idx)];
    let prog = CudaProgram::prepare(&gpu, &p).unwrap();
    let bound = prog.bind(&named).unwrap();
    prog.poison_outputs(&bound, 0x7f).unwrap();
    prog.launch(&bound).unwrap();
    let got = prog.download(&bound).unwrap();
    let f = got[0].1.to_f64();
    assert_eq!(f[0], 3.0);
    assert_eq!(f[4], 4.0);
    assert!([1, 2, 3, 5].iter().all(|&k| f[k].is_nan()), "{f:?}");
    assert_eq!(got[1].1.to_f64(), [3.0, 0.0, 0.0, 0.0, 4.0, 0.0]);
    assert_eq!(got[2].1.to_f64(), [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    cases += 1;
    println!("{cases} gather GPU cases agreed with the interpreter");
}

#[test]
fn gather_programs_plan_and_run_on_the_interpreter() {
    // Pure tier: the row-wise shape takes the gradient of the log-softmax picks (the picks
    // themselves, over a domain [B, K], reduce their rows in each element); every program runs
    // at size 8.
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    for (k, (what, src)) in GATHER_PROGRAMS.iter().enumerate() {
        let p = Program::compile(&engine, src, what).unwrap_or_else(|e| panic!("{what}: {e}"));
        let row_wise = p.plan().kernels.iter().filter(|k| k.source.contains("computed once per row")).count();
        assert!(k > 0 || row_wise >= 1, "{what}: {row_wise} row-wise kernels in\n{}", p.cuda_source());
        let inputs = testdata::random_inputs_for(p.graph(), &vec![8; p.graph().symbols.len()], 7).unwrap();
        let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        p.run_cpu(&named).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// A masked mean's gradient as a traced backward writes it (PyTorch's `torch.where(valid, s, 0)`
/// before the chain rule): where `valid` fails the gradient is `0 * h`, NaN where `h` is not
/// finite (a padded target of zeros divides 0 by 0 here), and the kernels must keep that.
const MASK_INSIDE: &str = "input pred: f32[B, N, 4]\ninput target: f32[B, N, 4]\n\
    let valid = target[.., 3] != 0\n\
    let d0 = pred[.., 0] - target[.., 0]\n\
    let d1 = pred[.., 1] - target[.., 1]\n\
    let lh = log(pred[.., 3] - pred[.., 1])\n\
    let per = d0 * d0 + d1 * d1 + pred[.., 2] / target[.., 2] + lh\n\
    let n = f32(max(count(valid), 1))\n\
    let w = where(valid, 1.0 / n, 0.0)\n\
    output loss = sum(per, where: valid) / n\n\
    output dpred = stack(2 * d0 * w, 2 * d1 * w, w / target[.., 2], w / (pred[.., 3] - pred[.., 1]))\n";

#[test]
fn a_gradient_masked_inside_sums_its_loss_in_the_gradient_kernel() {
    // Pure tier: the first kernel counts the valid boxes, the second sums the loss beside the
    // gradient (see `analysis::defer_full_reductions`); the program runs on the interpreter.
    plans_with_shape(&[("mask inside", MASK_INSIDE)], "// sink: output dpred");
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    let p = Program::compile(&engine, MASK_INSIDE, "mask inside").unwrap();
    let kernels = &p.plan().kernels;
    assert_eq!(kernels.len(), 2, "{}", p.cuda_source());
    assert!(!kernels[0].source.contains("into partial slot 1"), "the count alone:\n{}", kernels[0].source);
    assert!(kernels[1].source.contains("// sink: full reduction"), "the loss's sum:\n{}", kernels[1].source);
}

#[test]
fn a_gradient_masked_inside_matches_the_interpreter_with_its_nans() {
    let Some(gpu) = gpu_or_skip("a_gradient_masked_inside_matches_the_interpreter_with_its_nans") else { return };
    let gpu = Arc::new(gpu);
    let engine = engine_of(&gpu);
    let mut cases = 0;
    for dtype in [DType::F32, DType::BF16] {
        let p = compile_at(&engine, MASK_INSIDE, &format!("mask inside ({dtype})"), dtype);
        for (i, sizes) in [vec![1, 1], vec![3, 5], vec![7, 255], vec![33, 257], vec![1023, 256], vec![4097, 129]]
            .into_iter()
            .enumerate()
        {
            let seed = fresh_seed() + 500 + i as u64;
            check(&gpu, &p, &sizes, seed, dtype);
            cases += 1;
            // The data exercises what the test is about: padded slots whose gradient is NaN.
            let inputs = testdata::random_inputs_for(p.graph(), &sizes, seed).unwrap();
            let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let want = p.run_cpu(&named).unwrap();
            if sizes[0] * sizes[1] >= 100 {
                assert!(want[1].1.to_f64().iter().any(|v| v.is_nan()), "{sizes:?}: no NaN gradient to check");
            }
        }
    }
    println!("{cases} mask-inside GPU cases agreed with the interpreter, NaNs in place");
}
