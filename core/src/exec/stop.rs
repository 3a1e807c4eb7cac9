//! How a communicator's running operations are told to end now (abort,
//! revoke, `NCCL_SHRINK_ABORT`): one word that every loop waiting on a peer
//! reads, on host memory and on the device path alike, and the error each
//! ended operation reports.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::Error;

/// Why a communicator's running operations must end now: set by abort,
/// revoke and `NCCL_SHRINK_ABORT`, read by every loop that waits on a peer.
#[derive(Debug, Default)]
pub struct Stop(AtomicU8);

/// The reasons a [`Stop`] holds, as the errors of the ended operations
/// name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Aborted,
    Revoked,
    /// `NCCL_SHRINK_ABORT` ends the parent's operations, then clears this.
    ShrinkAbort,
}

impl Stop {
    pub fn set(&self, why: StopReason) {
        let v = match why {
            StopReason::Aborted => 1,
            StopReason::Revoked => 2,
            StopReason::ShrinkAbort => 3,
        };
        self.0.store(v, Ordering::SeqCst);
    }

    pub fn clear(&self) {
        self.0.store(0, Ordering::SeqCst);
    }

    pub fn reason(&self) -> Option<StopReason> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            1 => Some(StopReason::Aborted),
            2 => Some(StopReason::Revoked),
            _ => Some(StopReason::ShrinkAbort),
        }
    }

    /// The error an operation `what` ends with when stopped.
    pub fn error(&self, what: &str) -> Option<Error> {
        let why = match self.reason()? {
            StopReason::Aborted => "the communicator was aborted",
            StopReason::Revoked => "the communicator was revoked (ncclCommRevoke) while it ran",
            StopReason::ShrinkAbort => {
                "ended by ncclCommShrink with NCCL_SHRINK_ABORT while it ran"
            }
        };
        Some(Error::InvalidUsage(format!("{what}: {why}")))
    }
}
