//! `kfuse check --plan`: each kernel's shape and sinks, as its header states them.

mod common;
use common::{kfuse, stdout};

#[test]
fn check_plan_names_each_kernels_shape_and_sinks() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/layer_norm_train.kf");
    let out = kfuse(&["check", "--plan", &file.to_string_lossy()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    // The typed graph first, then the plan: the row-wise kernel computes each row's mean and
    // variance once; the column kernel writes the weight gradients.
    assert!(text.contains("kernel 1 of 2 (kf_"), "{text}");
    assert!(text.contains("row reduction phase(s) computed once per row, then the body at each element"), "{text}");
    assert!(text.contains("    output dx\n") && text.contains("    output dgamma\n"), "{text}");
    // The row kernel's entry for rows in registers sums the weight gradients' columns, and the
    // column kernel has an entry that folds them.
    assert!(text.contains("    column sums of n"), "{text}");
    assert!(text.contains("_1_fold instead, where the rows' kernel takes its entry for rows in registers"), "{text}");
    // Without the flag, no plan.
    let plain = stdout(&kfuse(&["check", &file.to_string_lossy()]));
    assert!(!plain.contains("kernel 1 of"), "{plain}");
}
