//! The library half of the `kfuse` command-line tool: what its commands do beyond calling the
//! `kfuse` facade. [`bench`](mod@bench) times a program on a GPU, [`cachebench`] measures the kernel cache
//! cold and warm, [`demo`] runs the GIoU demo, [`boxes`] generates box batches, [`npy`] reads and
//! writes `.npy` files, [`testdata`] makes random inputs for any program, [`mlp_bench`] times an
//! MLP model against the card's ceilings (`kfuse mlp bench`), [`when`] writes dates for people.
#![forbid(unsafe_code)]

pub mod bench;
pub mod boxes;
pub mod cachebench;
pub mod demo;
pub mod mlp_bench;
pub mod npy;
pub mod testdata;
pub mod when;

/// Everything that can go wrong in the tool's commands.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kfuse(#[from] kfuse::Error),
    #[error(transparent)]
    Npy(#[from] npy::NpyError),
    #[error(transparent)]
    Gen(#[from] boxes::GenError),
    /// `--dim NAME=SIZE` for a symbol the program does not have.
    #[error("--dim {name}: the program has no dimension `{name}` (it has: {known})")]
    UnknownDim { name: String, known: String },
    /// A symbol without a `--dim` size.
    #[error("give a size for dimension `{name}` with --dim {name}=SIZE")]
    MissingDim { name: String },
    /// `--rotate-sets` out of range.
    #[error("--rotate-sets {sets}: give 2 to {max} buffer sets")]
    RotateSets { sets: usize, max: usize },
    /// An unknown `--baseline`.
    #[error("unknown --baseline `{name}` (known: giou)")]
    UnknownBaseline { name: String },
    /// Inputs or outputs that the hand-written baseline cannot take.
    #[error("--baseline giou needs {what}")]
    BaselineNeeds { what: String },
    /// The driver probe of `kfuse cache bench` read back other bytes than it wrote.
    #[error("the driver probe read back wrong bytes")]
    DriverProbe,
    /// A second run on the same inputs gave another result.
    #[error("the second run of {what} gave a different result")]
    RepeatDiffers { what: &'static str },
    /// The hand-written baseline's loss buffer came back with the wrong size.
    #[error("the baseline's loss came back with the wrong size")]
    BaselineLoss,
    /// A batch too large for the hand-written baseline's 32-bit sizes.
    #[error("batch too large for the baseline")]
    BaselineBatch,
    /// A program without the scalar output a command reads.
    #[error("the program has no scalar output `{name}`")]
    NoScalar { name: String },
}

impl From<kfuse::runtime::RuntimeError> for Error {
    fn from(e: kfuse::runtime::RuntimeError) -> Error {
        Error::Kfuse(e.into())
    }
}

impl From<kfuse::InterpError> for Error {
    fn from(e: kfuse::InterpError) -> Error {
        Error::Kfuse(e.into())
    }
}
