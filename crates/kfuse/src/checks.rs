//! Checks of lengths/offsets values on the device: the validation mode of a launch on device
//! tensors, the process-wide registry that maps a kernel's check tag back to its program, and
//! the error a violation recorded on a device becomes.
//!
//! A checking kernel clamps bad values as always (memory-safe), records the first violation in
//! its device's error record and writes NaN into the outputs it poisons; the host takes the
//! record without synchronising before each later launch on that device
//! ([`Program::launch`](crate::Program::launch)), after a host-tensor run's download, and in
//! [`Engine::check_errors`](crate::Engine::check_errors).

use std::sync::{Arc, Mutex};

use kfuse_codegen::ViolationKind;
use kfuse_ir::{BindError, GraphHash, Interface};
use kfuse_runtime::{DeviceViolation, Gpu};

use crate::{Error, Result};

/// How a launch on device tensors checks the values of its lengths/offsets inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Validation {
    /// The kernels check each value they read (no host synchronisation): a violation is recorded
    /// on the device, poisons the outputs (NaN), and is returned as [`Error::DeviceInput`] by the
    /// next launch on that device or by [`Engine::check_errors`](crate::Engine::check_errors).
    #[default]
    Deferred,
    /// No check (the kernels get a null error record); bad values are only clamped.
    Off,
}

/// One registered program: what a tag names.
struct Entry {
    origin: Arc<str>,
    hash: GraphHash,
    interface: Arc<Interface>,
}

/// The programs whose kernels were loaded, indexed by tag.
static REGISTRY: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// The tag of the program `origin` with plan `hash` (registered on first use; the same program
/// loaded on several devices or twice shares its tag).
pub(crate) fn register(origin: &Arc<str>, hash: &GraphHash, interface: &Interface) -> u32 {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = reg.iter().position(|e| e.hash == *hash && e.origin == *origin) {
        return i as u32;
    }
    reg.push(Entry { origin: origin.clone(), hash: *hash, interface: Arc::new(interface.clone()) });
    (reg.len() - 1) as u32
}

/// Takes the violation pending on `gpu` (no synchronisation) as an error.
pub(crate) fn take_pending(gpu: &Gpu) -> Result<()> {
    match gpu.take_device_error() {
        Some(v) => Err(violation_error(gpu.ordinal(), &v)),
        None => Ok(()),
    }
}

/// The error of violation `v` recorded on device `ordinal`, naming the program through its tag.
pub fn violation_error(ordinal: usize, v: &DeviceViolation) -> Error {
    let entry = {
        let reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        reg.get(v.tag as usize).map(|e| (e.origin.clone(), e.interface.clone()))
    };
    let Some((origin, interface)) = entry else {
        return Error::DeviceInputUnknown { ordinal, tag: v.tag, input: v.input, position: v.position, value: v.value };
    };
    let decl = interface.inputs.get(v.input as usize);
    let name = decl.map_or_else(|| format!("#{}", v.input), |d| d.name.clone());
    let dim = decl.and_then(|d| d.layout).map_or_else(String::new, |c| interface.dim_str(c.dim()));
    let index = match decl.map(|d| d.shape.len()) {
        Some(0 | 1) => v.position.to_string(),
        _ => format!("flat {}", v.position),
    };
    let pos = usize::try_from(v.position).unwrap_or(usize::MAX);
    let value = i32::try_from(v.value).unwrap_or(if v.value < 0 { i32::MIN } else { i32::MAX });
    let bound = u64::try_from(v.bound).unwrap_or(0);
    let source = match ViolationKind::from_word(u64::from(v.kind)) {
        Some(ViolationKind::LengthNegative) => BindError::LengthNegative { name, index, value },
        Some(ViolationKind::LengthTooLarge) => BindError::LengthTooLarge { name, index, value, dim, max: bound },
        Some(ViolationKind::OffsetStart) => BindError::OffsetStart { name, value },
        Some(ViolationKind::OffsetDecrease) => BindError::OffsetDecrease {
            name,
            index: pos,
            value,
            prev_index: pos.saturating_sub(1),
            prev: i32::try_from(v.bound).unwrap_or(i32::MAX),
        },
        Some(ViolationKind::OffsetPastEnd) => BindError::OffsetPastEnd { name, index: pos, value, dim, total: bound },
        Some(ViolationKind::OffsetEnd) => BindError::OffsetEnd { name, index: pos, value, dim, total: bound },
        Some(ViolationKind::OffsetsEmpty) => BindError::OffsetsEmpty { name },
        None => {
            return Error::DeviceInputUnknown {
                ordinal,
                tag: v.tag,
                input: v.input,
                position: v.position,
                value: v.value,
            }
        }
    };
    Error::DeviceInput { origin: origin.to_string(), ordinal, source: Box::new(source) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn giou_lengths_tag() -> u32 {
        let src = "input pred: f32[B, N, 4]\ninput lengths: i32[B] as lengths(N)\noutput s = sum(pred[.., 0], where: mask(lengths))\n";
        let g = kfuse_lang::parse_program(src, "ragged.kf").unwrap();
        let interface = Interface::of(&g);
        register(&Arc::from("ragged.kf"), &g.stable_hash(), &interface)
    }

    fn violation(tag: u32, kind: ViolationKind, position: u64, value: i64, bound: i64) -> DeviceViolation {
        DeviceViolation { tag, input: 1, kind: kind as u32, position, value, bound }
    }

    #[test]
    fn a_recorded_violation_names_the_program_input_position_value_and_bound() {
        let tag = giou_lengths_tag();
        assert_eq!(giou_lengths_tag(), tag, "the same program keeps its tag");
        let e = violation_error(0, &violation(tag, ViolationKind::LengthTooLarge, 3, 1 << 30, 13));
        let text = e.to_string();
        assert!(matches!(e, Error::DeviceInput { ordinal: 0, .. }), "{text}");
        assert!(
            text.starts_with("ragged.kf: input `lengths`: lengths[3] = 1073741824 is greater than N = 13"),
            "{text}"
        );
        assert!(text.contains("found on device 0 by the kernels of an earlier call"), "{text}");
        let text = violation_error(1, &violation(tag, ViolationKind::LengthNegative, 0, -7, 13)).to_string();
        assert!(text.contains("lengths[0] = -7 is negative") && text.contains("device 1"), "{text}");
    }

    #[test]
    fn an_unknown_tag_or_kind_still_says_what_was_found() {
        let e = violation_error(0, &violation(u32::MAX, ViolationKind::LengthNegative, 2, -1, 4));
        assert!(matches!(e, Error::DeviceInputUnknown { position: 2, value: -1, .. }), "{e}");
        let tag = giou_lengths_tag();
        let e = violation_error(0, &DeviceViolation { tag, input: 1, kind: 99, position: 2, value: -1, bound: 4 });
        assert!(e.to_string().contains("input #1, position 2, value -1"), "{e}");
    }
}
