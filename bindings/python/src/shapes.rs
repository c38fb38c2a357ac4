//! Shapes without data: the output shapes that bound symbols give, and the value checks of
//! lengths/offsets inputs copied to the host while the other inputs stay on the device.
//!
//! Both come from the program's [`Interface`], so the messages are [`BindError`]'s, the same the
//! interpreter and the GPU executor give.

use kfuse::{BindError, DType, Interface};

/// The outputs' `(name, dtype, shape)` in declaration order for symbol sizes `sizes` (bound from
/// the inputs' shapes, so every symbol has a size).
pub fn output_shapes(interface: &Interface, sizes: &[u64]) -> Vec<(String, DType, Vec<usize>)> {
    interface
        .outputs
        .iter()
        .map(|o| (o.name.clone(), o.dtype, interface.resolve(o, sizes).unwrap_or_default()))
        .collect()
}

/// Checks the values of every lengths/offsets input given in `values` (flat, row-major) against
/// the symbol sizes; the first bad element is the error, naming the input and position.
pub fn check_layouts(interface: &Interface, sizes: &[u64], values: &[(&str, &[i32])]) -> Result<(), BindError> {
    for decl in interface.inputs.iter().filter(|d| d.layout.is_some()) {
        let Some(&(_, v)) = values.iter().find(|(n, _)| *n == decl.name) else { continue };
        let shape = interface.resolve(decl, sizes).unwrap_or_default();
        interface.check_layout_values(decl, v, &shape, sizes)?;
    }
    Ok(())
}
