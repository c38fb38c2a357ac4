//! Times the interpreter on the seed's GIoU loss at B = 16384, N = 256 (4M box pairs).
//! Run with `cargo run --release -p kfuse-interp --example giou_speed`. Prints the median of a
//! few runs; speed is measured here, never asserted in tests.

#[path = "../tests/common/giou.rs"]
mod giou;

use std::time::Instant;

use kfuse_ir::{DType, HostTensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (b, n) = (16384usize, 256usize);
    let graph = giou::giou_graph()?;
    // Deterministic pseudo-random boxes; about one in eight target rows is valid.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut boxes = |valid_every: usize| -> Vec<f64> {
        (0..b * n)
            .flat_map(|i| {
                let (x, y, w, h) = (next() * 100.0, next() * 100.0, 1.0 + next() * 20.0, 1.0 + next() * 20.0);
                if i % valid_every == 0 {
                    [x, y, x + w, y + h]
                } else {
                    [0.0; 4]
                }
            })
            .collect()
    };
    let pred = HostTensor::from_f64(DType::F32, vec![b, n, 4], &boxes(1));
    let target = HostTensor::from_f64(DType::F32, vec![b, n, 4], &boxes(8));
    let mut times = Vec::new();
    let mut loss = 0.0;
    for _ in 0..5 {
        let start = Instant::now();
        let outs = kfuse_interp::evaluate(&graph, &[("pred", &pred), ("target", &target)])?;
        times.push(start.elapsed().as_secs_f64());
        loss = outs[1].values[0];
    }
    times.sort_by(f64::total_cmp);
    println!(
        "GIoU B={b} N={n}: median {:.1} ms over {} runs on {} threads (loss {loss:.6})",
        times[times.len() / 2] * 1e3,
        times.len(),
        rayon::current_num_threads()
    );
    Ok(())
}
