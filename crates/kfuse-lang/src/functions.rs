//! The names of the built-in functions, in one table that both the lowering of names
//! (`lower.rs`: is this unknown name a function used as a value?) and the lowering of calls
//! (`builtins.rs`: which function is this, or which one was meant?) read. It lives apart from
//! both so that neither of them imports the other for it.

/// Every built-in function name, for suggestions.
#[rustfmt::skip] // a few names a line, not one (long names would make rustfmt list one a line)
pub(crate) const FUNCTIONS: &[&str] = &[
    "where", "min", "max", "clamp", "abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "erf", "sin", "cos",
    "floor", "pow", "sum", "mean", "count", "f32", "f16", "bf16", "i32", "i64", "bool", "grad", "mask", "size",
    "log1p", "expm1", "sign", "round", "trunc", "ceil", "isnan", "isinf", "isfinite", "atan", "tan", "asin", "acos",
    "sinh", "cosh", "asinh", "acosh", "atanh", "atan2", "remainder", "floor_div", "fma", "bitwise_and", "bitwise_or", "bitwise_xor",
    "fmod", "hypot", "copysign", "lgamma", "digamma", "trigamma", "erfinv", "erfc", "rounded",
    "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "iota", "stack", "gather",
    "detach", "softmax", "log_softmax", "rand_like", "transpose", "permute", "reshape", "cat", "argmax", "argmin", "prod",
];
