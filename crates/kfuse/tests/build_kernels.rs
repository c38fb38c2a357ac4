//! NVRTC tier: `Program::build_kernels` makes a program's kernels ready for an architecture with
//! no GPU, and says for each where it came from (compiled now, then found in memory) and how long
//! that took (skips without libnvrtc).

use std::sync::Arc;

use kfuse::{Arch, BuildTarget, CacheOutcome, Engine, KernelCache, Program};
use kfuse_runtime::testing::nvrtc_or_skip;

#[test]
fn build_kernels_compiles_each_kernel_once_then_finds_it_in_memory() {
    if nvrtc_or_skip("build_kernels_compiles_each_kernel_once_then_finds_it_in_memory").is_none() {
        return;
    }
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    // Two kernels: a row statistic, then a full sum over its use.
    let src =
        "input x: f32[B, D]\nlet m = max(x, axis: -1, keepdim: true)\noutput y = exp(x - m)\noutput s = sum(y * 3.0)\n";
    let p = Program::compile(&engine, src, "build.kf").expect("compiles");
    // Every entry point is its own translation unit: the row kernel's entry for rows in
    // registers is built beside it.
    let names: Vec<String> = p.plan().kernels.iter().flat_map(|k| k.entries()).map(|e| e.1.to_string()).collect();
    assert!(names.iter().any(|n| n.ends_with("_regs")), "{names:?}");
    let target = BuildTarget::Arch(Arch::new(9, 0));
    let first = p.build_kernels(target).expect("NVRTC builds them");
    assert_eq!(first.iter().map(|b| b.name.clone()).collect::<Vec<_>>(), names);
    assert!(first.iter().all(|b| b.outcome == CacheOutcome::Compiled && b.seconds > 0.0), "{first:?}");
    let again = p.build_kernels(target).expect("found");
    assert_eq!(again.iter().map(|b| b.name.clone()).collect::<Vec<_>>(), names);
    assert!(again.iter().all(|b| b.outcome == CacheOutcome::MemoryHit), "{again:?}");
}
