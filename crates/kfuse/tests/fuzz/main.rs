//! Fuzzing the pipeline: random well-typed `.kf` programs (see `program`), random edits of them
//! and random byte strings go through the language (lexing, parsing, lowering, `grad`), autodiff
//! (`vjp` with respect to every float input), the planner and emitter (`kfuse_codegen::plan`,
//! with default and other options, inputs read through strides among them) and the interpreter, on random inputs with valid ragged
//! metadata. Nothing may panic: a panic is caught only to report it with the offending source.
//! Errors returned as values are fine, except that a generated (well-typed) program must parse,
//! and the interpreter must run it.
//!
//! For every program that plans, the plan is checked against the graph and the interpreter's
//! results (`plan_check`: buffer sizes, one writer per output, kernels in dependency order,
//! signatures matching the parameters). When libnvrtc loads, generated kernels are also compiled
//! for sm_80 (every program in a timed run, the first few otherwise).
//!
//! Knobs (environment): `KFUSE_FUZZ_SEED` (the run's seed; a fresh one by default, printed),
//! `KFUSE_FUZZ_CASES` (programs; default 150), `KFUSE_FUZZ_SECONDS` (run for that long instead).
//! A failure prints the seed, the case number and the source. ARCHITECTURE.md ("Tests") says how
//! to run it for an hour.

mod plan_check;
mod program;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use kfuse_codegen::{CodegenOptions, LengthsGradient};
use kfuse_ir::{Constraint, DType, Dim, Graph, HostTensor, Interface};
use kfuse_testing::{Rng, SeedableRng, StdRng};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// What one run saw, printed at its end.
#[derive(Default, Debug)]
struct Stats {
    generated: usize,
    mutated: usize,
    bytes: usize,
    parsed: usize,
    grad_refused: usize,
    planned: usize,
    plan_refused: usize,
    derived: usize,
    interpreted: usize,
    /// Interpreter runs refused because an `i32` sum left the `i32` range (the inputs hold
    /// values near 2e9 on purpose): a documented refusal, not a failure.
    int_overflow: usize,
    compiled: usize,
    /// Plans in stages whose stage graphs the interpreter ran, one after another.
    staged: usize,
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={v:?} is not a non-negative integer"),
    }
}

/// Symbol sizes and inputs for `iface` from `rng`: sizes 0..=4 (an offsets input's length at
/// least 1), lengths within their bound, offsets from 0 non-decreasing to their total, other
/// values mostly in [-2, 2] with some zeros, huge values, infinities and NaN.
fn make_inputs(iface: &Interface, rng: &mut StdRng) -> (Vec<u64>, Vec<(String, HostTensor)>) {
    let mut sizes: Vec<u64> = iface.symbols.iter().map(|_| rng.random_range(0..=4)).collect();
    for decl in &iface.inputs {
        if let (Some(Constraint::Offsets { total, .. }), [Dim::Sym(s)]) = (decl.layout, decl.shape.as_slice()) {
            let s = s.0 as usize;
            sizes[s] = sizes[s].max(1);
            if let Dim::Sym(t) = total {
                if sizes[s] == 1 {
                    sizes[t.0 as usize] = 0;
                }
            }
        }
    }
    let dim = |d: &Dim| match d {
        Dim::Const(c) => *c as usize,
        Dim::Sym(s) => sizes[s.0 as usize] as usize,
    };
    let inputs = iface
        .inputs
        .iter()
        .map(|decl| {
            let shape: Vec<usize> = decl.shape.iter().map(dim).collect();
            let n: usize = shape.iter().product();
            let values: Vec<f64> = match decl.layout {
                Some(Constraint::Lengths { max, .. }) => {
                    (0..n).map(|_| rng.random_range(0..=dim(&max)) as f64).collect()
                }
                Some(Constraint::Offsets { total, .. }) => {
                    let t = dim(&total);
                    let mut cuts: Vec<f64> = (0..n).map(|_| rng.random_range(0..=t) as f64).collect();
                    cuts.sort_by(f64::total_cmp);
                    if let Some(first) = cuts.first_mut() {
                        *first = 0.0;
                    }
                    if let Some(last) = cuts.last_mut() {
                        *last = t as f64;
                    }
                    cuts
                }
                None => (0..n)
                    .map(|_| match (decl.dtype, rng.random_range(0..40)) {
                        (DType::Bool, _) => f64::from(u8::from(rng.random_bool(0.5))),
                        (DType::I32, 0) => 2e9,
                        (DType::I32, _) => f64::from(rng.random_range(-3..=3)),
                        (_, 0) => f64::NAN,
                        (_, 1) => f64::INFINITY,
                        (_, 2) => -1e30,
                        (_, 3 | 4) => 0.0,
                        _ => rng.random_range(-2.0..2.0),
                    })
                    .collect(),
            };
            (decl.name.clone(), HostTensor::from_f64(decl.dtype, shape, &values))
        })
        .collect();
    (sizes, inputs)
}

/// Values equal, NaN equal to NaN.
fn same(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y || (x.is_nan() && y.is_nan()))
}

/// Runs one graph through the planner and the interpreter. `strict`: the program is well-typed
/// and its inputs valid, so the interpreter must succeed.
fn check_graph(g: &Graph, seed: u64, strict: bool, compile: bool, stats: &mut Stats) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let iface = Interface::of(g);
    let (sizes, inputs) = make_inputs(&iface, &mut rng);
    let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let evaluated = match kfuse_interp::evaluate(g, &named) {
        Ok(e) => {
            stats.interpreted += 1;
            Some(e)
        }
        Err(kfuse_interp::InterpError::IntOverflow { .. }) => {
            stats.int_overflow += 1;
            None
        }
        Err(e) if strict => return Err(format!("the interpreter refused valid inputs: {e}")),
        Err(_) => None,
    };
    if let Some(ev) = &evaluated {
        for (e, o) in ev.iter().zip(&g.outputs) {
            let node = g.node(o.node);
            let want = g.resolve_shape(&node.shape, &sizes);
            if e.shape != want || e.values.len() != want.iter().product::<usize>() {
                return Err(format!(
                    "output `{}`: shape {:?} ({} values), declared {want:?}",
                    o.name,
                    e.shape,
                    e.values.len()
                ));
            }
            let fits = match node.dtype {
                DType::I32 => {
                    e.values.iter().all(|&v| v == v.trunc() && (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&v))
                }
                DType::Bool => e.values.iter().all(|&v| v == 0.0 || v == 1.0),
                _ => true,
            };
            if !fits {
                return Err(format!(
                    "output `{}` {} holds values outside its dtype: {:?}",
                    o.name, node.dtype, e.values
                ));
            }
        }
        let again = kfuse_interp::evaluate(g, &named).map_err(|e| format!("second evaluation failed: {e}"))?;
        if ev.iter().zip(&again).any(|(a, b)| !same(&a.values, &b.values)) {
            return Err("two evaluations of the same inputs differ".into());
        }
    }
    let options = [
        CodegenOptions::default(),
        CodegenOptions {
            block_size: 128,
            elems_per_thread: 1 + (seed % 16) as u32,
            batched_threads_per_sm: 1024,
            lengths_gradient: LengthsGradient::TwoKernels,
            ..CodegenOptions::default()
        },
        // Every input but lengths and offsets read through strides given at launch.
        CodegenOptions {
            strided_inputs: (0..g.inputs.len() as u32)
                .filter(|&i| g.constraints.iter().all(|c| c.input().0 != i))
                .collect(),
            ..CodegenOptions::default()
        },
    ];
    // A plan in stages: its stage graphs, run one after another, give every output in its
    // declared shape and dtype (the values are the GPU tests' to compare: a stored value is
    // rounded to its dtype, which a random program may amplify).
    let plans = kfuse_codegen::plan(g, &options[0]).is_ok();
    if let Some(ev) = evaluated.as_ref().filter(|_| strict && plans) {
        if let Some(staged) = kfuse_testing::run_stages(g, &options[0], &named).map_err(|e| format!("stages: {e}"))? {
            for ((e, o), (name, t)) in ev.iter().zip(&g.outputs).zip(&staged) {
                let dtype = g.node(o.node).dtype;
                if *name != o.name || t.shape != e.shape || t.dtype() != dtype {
                    return Err(format!(
                        "stages: output `{name}` {} {:?}, declared `{}` {dtype} {:?}",
                        t.dtype(),
                        t.shape,
                        o.name,
                        e.shape
                    ));
                }
            }
            stats.staged += 1;
        }
    }
    for opts in &options {
        match kfuse_codegen::plan(g, opts) {
            Ok(plan) => {
                stats.planned += 1;
                if let Some(ev) = &evaluated {
                    let lens: Vec<usize> = ev.iter().map(|e| e.values.len()).collect();
                    plan_check::check(&plan, g, &sizes, &lens).map_err(|e| format!("plan ({opts:?}): {e}"))?;
                }
                if compile && kfuse_runtime::nvrtc_available() {
                    let arch = kfuse_runtime::CompileOptions::for_arch(kfuse_runtime::Arch::new(8, 0));
                    for k in &plan.kernels {
                        kfuse_runtime::compile(&k.source, &arch)
                            .map_err(|e| format!("kernel {} does not compile: {e}\n{}", k.name, k.source))?;
                        stats.compiled += 1;
                    }
                }
            }
            Err(kfuse_codegen::CodegenError::Internal { node, what }) => {
                return Err(format!("internal planner error at v{node}: {what}"))
            }
            Err(kfuse_codegen::CodegenError::InvalidGraph(e)) if strict => {
                return Err(format!("the planner found a graph of the language malformed: {e}"))
            }
            Err(_) => stats.plan_refused += 1,
        }
    }
    Ok(())
}

/// Parses `source` and runs what parses (and its backward graph) through everything.
fn check_source(source: &str, seed: u64, strict: bool, compile: bool, stats: &mut Stats) -> Result<(), String> {
    let g = match kfuse_lang::parse_program(source, "fuzz.kf") {
        Ok(g) => g,
        // `grad` may refuse what it cannot differentiate (e.g. an input broadcast along a leading
        // axis); the rest of the program must stand.
        Err(d) if strict && d.source_line.contains("grad(") => {
            stats.grad_refused += 1;
            let forward: Vec<&str> = source.lines().filter(|l| !l.contains("grad(")).collect();
            return check_source(&(forward.join("\n") + "\n"), seed, strict, compile, stats);
        }
        Err(d) if strict => return Err(format!("a generated program does not parse:\n{}", d.render())),
        Err(d) => {
            let rendered = d.render();
            if !rendered.starts_with("error: ") || !rendered.contains("fuzz.kf:") {
                return Err(format!("a malformed diagnostic:\n{rendered}"));
            }
            return Ok(());
        }
    };
    stats.parsed += 1;
    check_graph(&g, seed, strict, compile, stats)?;
    let wrt: Vec<&str> = g.inputs.iter().filter(|i| i.dtype.is_float()).map(|i| i.name.as_str()).collect();
    if let Ok(d) = kfuse_passes::vjp(&g, &wrt) {
        stats.derived += 1;
        check_graph(&d.graph, seed ^ 1, strict, false, stats)
            .map_err(|e| format!("backward graph: {e}\n{}", d.graph))?;
    }
    Ok(())
}

/// Runs `case` and turns a panic into an error carrying its message.
fn guarded(case: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(case)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            Err(format!("PANIC: {msg}"))
        }
    }
}

#[test]
fn random_programs_edits_and_bytes_never_panic_and_plans_fit() {
    let seed = env_u64("KFUSE_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    let deadline = env_u64("KFUSE_FUZZ_SECONDS").map(|s| Instant::now() + Duration::from_secs(s));
    let cases = env_u64("KFUSE_FUZZ_CASES").unwrap_or(if deadline.is_some() { u64::MAX } else { 150 });
    eprintln!("fuzz: KFUSE_FUZZ_SEED={seed} (set it to repeat this run)");
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    let strategy = (any::<u64>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..160));
    let mut stats = Stats::default();
    let mut failures: Vec<String> = Vec::new();
    let mut case = 0u64;
    while case < cases && deadline.is_none_or(|d| Instant::now() < d) && failures.len() < 5 {
        let (program_seed, edit_seed, bytes) = match strategy.new_tree(&mut runner) {
            Ok(tree) => tree.current(),
            Err(e) => panic!("the case generator failed: {e}"),
        };
        let generated = program::generate(program_seed).source;
        // NVRTC takes about a second a program: a default run compiles the first few only.
        let compile = deadline.is_some() || case < 3;
        let mut report = |what: &str, source: &str, result: Result<(), String>| {
            if let Err(e) = result {
                failures.push(format!("case {case} ({what}) of KFUSE_FUZZ_SEED={seed}: {e}\n--- source ---\n{source}"));
            }
        };
        stats.generated += 1;
        let r = guarded(|| check_source(&generated, program_seed, true, compile, &mut stats));
        report("generated program", &generated, r);
        let edited = program::mutate(&generated, edit_seed);
        stats.mutated += 1;
        let r = guarded(|| check_source(&edited, edit_seed, false, false, &mut stats));
        report("edited program", &edited, r);
        let text = String::from_utf8_lossy(&bytes).into_owned();
        stats.bytes += 1;
        let r = guarded(|| check_source(&text, edit_seed, false, false, &mut stats));
        report("random bytes", &text, r);
        case += 1;
    }
    eprintln!("fuzz: {stats:?}");
    assert!(failures.is_empty(), "{} failure(s):\n\n{}", failures.len(), failures.join("\n\n"));
    // The generator must reach the back end, or the run checks little.
    assert!(
        stats.planned * 2 >= stats.generated,
        "only {} of {} programs planned: {stats:?}",
        stats.planned,
        stats.generated
    );
}

/// Programs the fuzzer found problems in, kept as regression cases (checked like generated ones).
const FOUND: &[&str] = &[
    // Its backward graph's one-pass plan declares a Temp buffer that no kernel uses.
    "input p: bf16[T, 4]\ninput q: f16[T]\ninput s: bool\ninput offsets: i32[S] as offsets(T)\n\
     let t1 = clamp(p, -1, 4)\nlet t3 = mean(t1, where: s)\nlet t4 = where(s, t3, 1e-7)\n\
     let t6 = offsets[.., None]\nlet t7 = tanh(t3)\noutput o0: bf16 = t7\noutput o1 = t6\noutput o2 = t6\n\
     output loss = t4\noutput dp = grad(loss, p)\noutput dq = grad(loss, q)\n",
    // A full reduction of a row maximum deferred into kernel 0 of the offsets, which the one-pass
    // plan takes: planned again without deferring.
    "input q: f32[T]\ninput offsets: i32[S] as offsets(T)\nlet t1 = bitwise_not(offsets)\n\
     let t2 = t1 + offsets\nlet t3 = max(offsets, axis: -1)\nlet t4 = max(t3)\nlet t5 = f32(t3)\n\
     let t9 = remainder(t5, t2)\nlet t11 = fma(t9, t9, 0.0)\noutput o0 = t4\noutput o1 = t11\noutput loss = t5\n",
    // The gradient of a column sum is read by the column kernel from the output an earlier kernel
    // stored.
    "input x: f32[B, N]\ninput r: bf16[N]\nlet t6 = r + x\noutput o0 = t6\noutput dx = grad(sum(t6 * t6), x)\n",
];

#[test]
fn programs_found_by_fuzzing_pass() {
    for (k, source) in FOUND.iter().enumerate() {
        for seed in 0..8 {
            let mut stats = Stats::default();
            if let Err(e) = guarded(|| check_source(source, seed, true, false, &mut stats)) {
                panic!("found program {k}, input seed {seed}: {e}\n--- source ---\n{source}");
            }
        }
    }
}

#[test]
fn the_generator_writes_every_form_of_the_language_it_covers() {
    // Over a fixed set of seeds, each form appears at least once (the generator's coverage).
    let sources: Vec<String> = (0..3000u64).map(|s| program::generate(s).source).collect();
    for form in [
        "transpose(",
        "permute(",
        "reshape(",
        "cat([",
        "argmax(",
        "argmin(",
        "rand_like(",
        "prod(",
        ":1]",
        ":2]",
        "grad(",
        "keepdim: true) + 1e-5)",
    ] {
        assert!(sources.iter().any(|s| s.contains(form)), "no generated program writes {form:?}");
    }
    // A flat argmax (no axis) and one along an axis.
    assert!(sources.iter().any(|s| s.contains(", axis: -1)") && s.contains("argmax(")));
    assert!(sources.iter().any(|s| s.lines().any(|l| l.contains("argm") && !l.contains("axis"))));
}
