//! GPU tier: `i64` programs against the CPU interpreter at odd sizes, bit for bit: wrapping at
//! 2^63, floor division, remainder and fmod signs (fmod by 0 and -1 too), shifts, casts, a one-hot from `iota`, row and full
//! sums within 2^53, and an `i64` scalar crossing kernels. Skips (printing why) without a GPU,
//! fails instead with KFUSE_REQUIRE_GPU=1.

use std::sync::Arc;

use kfuse::{exec::CudaProgram, Engine, HostTensor, Program, TensorData};
use kfuse_testing::gpu_or_skip;

const PROGRAM: &str = "\
input x: i64[B, N]
input k: i32[N]
input f: f32[B, N]
output wrapped = x * 3 + (x << 2) - k
output q = x // (k + 7)
output r = x % -5
output t = fmod(x, i64(k) - 1)
output shifted = (x >> 3) ^ ~x
output clamped = clamp(abs(x), 0, 1 << 30)
output truncated = i64(f)
output narrow = i32(x)
output as_float = f32(x % 1000)
output one_hot = where(iota(x, axis: -1) == x % 4, 1.0, 0.0)
output rows = sum(x % 100000, axis: -1)
output centred = x % 100000 - sum(x % 100000)
";

/// Values across the whole i64 range (a few near its ends), from a fixed-per-run seed.
fn longs(n: usize, seed: u64) -> Vec<i64> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match i % 5 {
                0 => i64::MAX - (s % 4) as i64,
                1 => i64::MIN + (s % 4) as i64,
                2 => (s % 1000) as i64 - 500,
                _ => s as i64,
            }
        })
        .collect()
}

#[test]
fn i64_programs_match_the_interpreter_bit_for_bit_on_the_gpu() {
    let Some(gpu) = gpu_or_skip("i64_programs_match_the_interpreter_bit_for_bit_on_the_gpu") else { return };
    let gpu = Arc::new(gpu);
    let engine = Engine::with_cache(gpu.cache().clone());
    let p = Program::compile(&engine, PROGRAM, "i64 program").unwrap_or_else(|e| panic!("{e}"));
    let seed = 0x5eed_1234_u64;
    println!("i64 seed: {seed}");
    for (b, n) in [(1usize, 1usize), (3, 31), (33, 1), (7, 1023), (2, 4097)] {
        let x = HostTensor::new(vec![b, n], TensorData::I64(longs(b * n, seed + (b * n) as u64)));
        let k = HostTensor::new(vec![n], TensorData::I32((0..n as i32).map(|i| i % 9 - 4).collect()));
        // Exact fractions, values beyond the i64 range (saturating) and NaN (giving 0).
        let f: Vec<f32> = (0..b * n)
            .map(|i| match i % 7 {
                0 => 1e19,
                1 => -1e19,
                2 => f32::NAN,
                _ => (i as f32 - 7.5) * 0.25,
            })
            .collect();
        let f = HostTensor::new(vec![b, n], TensorData::F32(f));
        let named = [("x", &x), ("k", &k), ("f", &f)];
        let want = p.run_cpu(&named).unwrap_or_else(|e| panic!("[{b}, {n}]: interpreter: {e}"));
        let prog = CudaProgram::prepare(&gpu, &p).unwrap_or_else(|e| panic!("{e}"));
        let bound = prog.bind(&named).unwrap();
        prog.poison_outputs(&bound, 0x7f).unwrap();
        prog.launch(&bound).unwrap();
        let got = prog.download(&bound).unwrap();
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            assert_eq!(g.dtype(), w.dtype(), "{name} at [{b}, {n}]");
            if name == "as_float" {
                let (gv, wv) = (g.to_f64(), w.to_f64());
                assert!(gv.iter().zip(&wv).all(|(a, e)| (a - e).abs() <= 1e-6 * e.abs()), "{name} at [{b}, {n}]");
            } else {
                assert!(g == w, "{name} at [{b}, {n}] differs: gpu {:?} vs interpreter {:?}", g.data, w.data);
            }
        }
    }
}
