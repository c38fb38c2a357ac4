//! Shared by the integration tests: the example programs and their paths.
#![allow(dead_code)]

use std::path::PathBuf;

/// The repository's `examples/` folder.
pub fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Every `examples/*.kf`, sorted, as (stem, source).
pub fn examples() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(examples_dir())
        .expect("examples/ exists")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "kf"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()))
        .collect();
    v.sort();
    assert!(v.len() >= 4, "expected the example programs, found {}", v.len());
    v
}
