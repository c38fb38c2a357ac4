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

#[test]
fn a_bias_gradient_is_summed_by_the_kernel_that_stores_the_gradient_it_sums() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/gelu_bias_train.kf");
    let out = kfuse(&["check", "--plan", &file.to_string_lossy()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    // dbias = sum(dx, axis: 0): the elementwise rows' kernel stores dx and sums its columns as it
    // goes; the column kernel folds those sums instead of reading dx again.
    let first = text.find("kernel 1 of 2").expect("two kernels");
    let second = text.find("kernel 2 of 2").expect("two kernels");
    assert!(text[first..second].contains("elementwise by rows of the last axis"), "{text}");
    assert!(text[first..second].contains("    output dx\n"), "{text}");
    assert!(text[first..second].contains("    column sums of n"), "{text}");
    assert!(
        text[second..].contains("_1_fold instead, where the rows' kernel takes its entry for rows in registers"),
        "{text}"
    );

    // At bf16 the sum adds dx as stored (rounded to bf16), as summing the stored tensor would.
    let dir = tempfile::tempdir().expect("temp dir");
    let bf16 = dir.path().join("gelu_bias_bf16.kf");
    let source = std::fs::read_to_string(&file).expect("example").replace("f32[", "bf16[");
    std::fs::write(&bf16, source).expect("write");
    let out = kfuse(&["emit", &bf16.to_string_lossy()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cuda = stdout(&out);
    let sum_line = cuda.lines().find(|l| l.contains("kf_cg0[0] = ")).expect("a column sum in the rows' kernel");
    assert!(sum_line.contains("kf_bf16_to_f32(kf_f32_to_bf16("), "{sum_line}");
}

#[test]
fn check_plan_shows_reductions_read_back_stored_once_and_warns_of_none() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Reductions read back at larger shapes, each stored once by a kernel of its own.
    let stored = [
        // A leading axis's mean written as a last-axis mean of the transpose, read back at each
        // element of a kernel over the other rows: found in the emitted kernel, then stored.
        "input x: f32[B, 1024]\nlet t = transpose(x, 0, 1)\n\
         output y = x - transpose(mean(t, axis: -1, keepdim: true), 0, 1)\n",
        // Along the leading axis: by a column kernel.
        "input x: f32[B, 16]\noutput y = x - mean(x, axis: 0, keepdim: true)\n",
    ];
    let quiet = [
        // Along two middle axes of constant sizes, read back at each element: stored once.
        "input x: f32[B, 8, 64, 4]\noutput y = x - mean(x, axis: [1, 2], keepdim: true)\n",
        // The batch's mean of rows' sums, read back at each row: stored once.
        "input x: f32[B, 8, 1024]\nlet r = sum(x, axis: -1)\noutput y = x * mean(r, axis: 0, keepdim: true)[.., None]\n",
        // Along the last axis: once per row.
        "input x: f32[B, 1024]\noutput y = x - mean(x, axis: -1, keepdim: true)\n",
        // A column sum that is an output, not read back: the columns shape.
        "input x: f32[B, 1024]\noutput s = sum(x, axis: 0)\n",
        // A full reduction: a scalar that crosses kernels once.
        "input x: f32[B, 1024]\noutput y = x / sum(x)\n",
        // A reduction of 8 elements: cheap to compute again.
        "input x: f32[B, 8, 4]\noutput y = x - mean(x, axis: 1, keepdim: true)\n",
        // A row's statistics over [8, 1024]: stored once, by rows of 8192.
        "input x: f32[B, 8, 1024]\nlet v = mean(x * x, axis: [1, 2], keepdim: true)\noutput y = x * rsqrt(v + 1e-5)\n",
        // A sum of 8 rows' sums of 1024, read back at each row of 1024 (a group norm's backward's
        // shape): 8 per element.
        "input x: f32[B, 8, 1024]\nlet r = sum(x, axis: -1)\noutput y = x * sum(r, axis: 1, keepdim: true)[.., None]\n",
    ];
    let plan = |k: usize, src: &str| {
        let file = dir.path().join(format!("p{k}.kf"));
        std::fs::write(&file, src).expect("write");
        let out = kfuse(&["check", "--plan", &file.to_string_lossy()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        stdout(&out)
    };
    for (k, src) in stored.iter().enumerate() {
        let text = plan(k, src);
        assert!(text.contains("output stored n"), "{src}\n{text}");
        assert!(!text.contains("warning: "), "{src}\n{text}");
    }
    for (k, src) in quiet.iter().enumerate() {
        let text = plan(stored.len() + k, src);
        assert!(!text.contains("warning: "), "{src}\n{text}");
    }
}
