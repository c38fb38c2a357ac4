//! Streams other than a `Gpu`'s own: ones it creates, and ones a framework lends it (the foreign
//! stream door, see [`crate::Gpu::borrow_stream`]).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::RuntimeError;

/// A CUDA stream of one device, on which [`crate::Gpu::launch`] queues work. Cheap to clone
/// (the handle is shared). A stream the `Gpu` created is destroyed when its last clone drops; a
/// borrowed stream ([`crate::Gpu::borrow_stream`]) never is.
#[derive(Clone)]
pub struct Stream {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) gpu_id: u32,
    pub(crate) ordinal: usize,
    pub(crate) borrowed: bool,
}

impl Stream {
    /// Waits until every piece of work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.stream.synchronize().map_err(|error| RuntimeError::Driver {
            call: "cuStreamSynchronize",
            ordinal: self.ordinal,
            error,
        })
    }

    /// Whether work queued on the stream is being captured into a CUDA graph now (the launches
    /// are recorded, not run).
    pub fn is_capturing(&self) -> Result<bool, RuntimeError> {
        let status = self.stream.capture_status().map_err(|error| RuntimeError::Driver {
            call: "cuStreamIsCapturing",
            ordinal: self.ordinal,
            error,
        })?;
        Ok(status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// The ordinal of the device the stream belongs to.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Whether the stream is borrowed from its owner (never destroyed by kfuse).
    pub fn is_borrowed(&self) -> bool {
        self.borrowed
    }

    /// The raw `CUstream` handle, as a number (what frameworks call the stream's handle).
    pub fn handle(&self) -> usize {
        self.stream.cu_stream() as usize
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("ordinal", &self.ordinal)
            .field("handle", &format_args!("{:#x}", self.handle()))
            .field("borrowed", &self.borrowed)
            .finish_non_exhaustive()
    }
}
