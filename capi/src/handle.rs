//! Communicator handles: what a `ncclComm_t` points at. Every live
//! communicator is in a table keyed by its handle, so a handle that was
//! destroyed (or never made) is an error naming it instead of a crash, and
//! a destroy racing another call cannot free what that call uses.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use oxccl::{Comm, Error, RedOp, Result};

use crate::types::{ncclComm, ncclComm_t, ncclNumOps, ncclRedOp_t};

pub(crate) struct Handle {
    pub comm: Comm,
    /// The caller's `blocking`: a communicator created inside a group is
    /// made non-blocking underneath (ncclGroupEnd waits for it), but its
    /// revoke still waits, as the caller asked.
    pub blocking: bool,
    /// Operators made by `ncclRedOpCreatePreMulSum`: value ncclNumOps + i.
    pub redops: Mutex<Vec<Option<RedOp>>>,
}

static LIVE: Mutex<Option<HashMap<usize, Arc<Handle>>>> = Mutex::new(None);

/// Registers a new communicator and returns its C handle.
pub(crate) fn publish(comm: Comm) -> ncclComm_t {
    let blocking = comm.blocking();
    publish_as(comm, blocking)
}

/// As [`publish`], blocking as the caller asked.
pub(crate) fn publish_as(comm: Comm, blocking: bool) -> ncclComm_t {
    let h = Arc::new(Handle {
        comm,
        blocking,
        redops: Mutex::new(Vec::new()),
    });
    let key = Arc::as_ptr(&h) as usize;
    LIVE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, h);
    key as ncclComm_t
}

/// The communicator behind a handle.
pub(crate) fn get(c: ncclComm_t) -> Result<Arc<Handle>> {
    if c.is_null() {
        return Err(Error::InvalidArgument("comm is NULL".into()));
    }
    LIVE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|m| m.get(&(c as usize)).cloned())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "comm {:p} is not a live communicator (destroyed, aborted, or never created)",
                c as *const ncclComm
            ))
        })
}

/// Takes a communicator out of the table (destroy, abort).
pub(crate) fn retire(c: ncclComm_t) -> Result<Arc<Handle>> {
    let h = get(c)?;
    LIVE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .and_then(|m| m.remove(&(c as usize)));
    Ok(h)
}

impl Handle {
    /// The operator a C value names on this communicator.
    pub fn redop(&self, op: ncclRedOp_t) -> Result<RedOp> {
        if (0..ncclNumOps).contains(&op) {
            return RedOp::from_raw(op);
        }
        let i = op
            .checked_sub(ncclNumOps)
            .and_then(|i| usize::try_from(i).ok());
        let ops = self.redops.lock().unwrap_or_else(|p| p.into_inner());
        i.and_then(|i| ops.get(i).copied().flatten()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "op {op} is neither a built-in operator (0..{ncclNumOps}) nor one created on this communicator by ncclRedOpCreatePreMulSum"
            ))
        })
    }
}
