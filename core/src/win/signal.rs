//! The host one-sided API on windows (NCCL 2.29+'s `ncclPutSignal`,
//! `ncclSignal`, `ncclWaitSignal`), enqueued on the caller's stream with no
//! kernel: a put is a copy-engine copy into the peer's window as mapped
//! here, a signal a stream write of the count of signals sent so far into
//! the peer's signal word for this rank, a wait a stream wait until each
//! word reaches the count of signals awaited so far. Writes of one sender
//! to one receiver are ordered when they are enqueued on one stream (the
//! counts rise); the stream write follows the copy before it in full (the
//! driver's memory barrier precedes it).
//!
//! As in NCCL 2.29-2.31, signal index and context are 0 and flags 0.
//! Counts live on the host, so CUDA graph capture of these calls, which
//! would replay the captured counts, is refused.
#![allow(unsafe_code)] // stream operations on mapped device addresses

use std::sync::{Arc, PoisonError};

use super::{rma_of, Rma, Window};
use crate::comm::Comm;
use crate::cuda::{MemOp, RawStream};
use crate::error::{Error, Result};

fn check_index(what: &str, sig_idx: i32, ctx: i32, flags: u32) -> Result<()> {
    if sig_idx != 0 {
        return Err(Error::InvalidArgument(format!(
            "{what}: signal index {sig_idx}: only 0 is defined (as in NCCL)"
        )));
    }
    if ctx != 0 {
        return Err(Error::InvalidArgument(format!(
            "{what}: context {ctx}: only 0 is defined (as in NCCL)"
        )));
    }
    if flags != 0 {
        return Err(Error::InvalidArgument(format!(
            "{what}: flags {flags:#x}: none are defined; pass 0"
        )));
    }
    Ok(())
}

fn rma(comm: &Comm, what: &str) -> Result<Arc<Rma>> {
    rma_of(comm)?.ok_or_else(|| {
        Error::InvalidUsage(format!(
            "{what}: the communicator has no window: register one (ncclCommWindowRegister) before one-sided calls; its signal words come with the first"
        ))
    })
}

fn check_peer(what: &str, rma: &Rma, peer: usize) -> Result<()> {
    if peer >= rma.nranks {
        return Err(Error::InvalidArgument(format!(
            "{what}: peer {peer} is not a rank of this communicator of {}",
            rma.nranks
        )));
    }
    Ok(())
}

fn not_captured(what: &str, stream: RawStream) -> Result<()> {
    if stream.is_capturing()? {
        return Err(Error::InvalidUsage(format!(
            "{what} inside CUDA graph capture: oxccl counts signals on the host, which a replayed graph would not advance; call it outside capture"
        )));
    }
    Ok(())
}

/// Enqueues the signal to `peer` (the next count of this rank's signals to it).
fn signal_op(rma: &Rma, peer: usize) -> MemOp {
    let mut st = rma.state.lock().unwrap_or_else(PoisonError::into_inner);
    st.sent[peer] = st.sent[peer].wrapping_add(1);
    MemOp::Write {
        addr: rma.word(peer, rma.rank),
        value: st.sent[peer],
    }
}

/// `ncclPutSignal`: `bytes` at `src` (device memory this GPU reads) into
/// `peer`'s part of `win` at `offset`, then a signal to `peer`.
#[allow(clippy::too_many_arguments)] // NCCL's arguments
pub fn put_signal(
    comm: &Comm,
    src: u64,
    bytes: usize,
    peer: usize,
    win: &Window,
    offset: usize,
    sig_idx: i32,
    ctx: i32,
    flags: u32,
    stream: RawStream,
) -> Result<()> {
    const WHAT: &str = "ncclPutSignal";
    check_index(WHAT, sig_idx, ctx, flags)?;
    let rma = rma(comm, WHAT)?;
    check_peer(WHAT, &rma, peer)?;
    let (base, size) = win.peer(peer).ok_or_else(|| {
        Error::InvalidArgument(format!("{WHAT}: the window has no part of rank {peer}"))
    })?;
    if offset.checked_add(bytes).is_none_or(|end| end > size) {
        return Err(Error::InvalidArgument(format!(
            "{WHAT}: {bytes} bytes at offset {offset} overrun rank {peer}'s window of {size} bytes"
        )));
    }
    if bytes > 0 && src == 0 {
        return Err(Error::InvalidArgument(format!("{WHAT}: localbuff is NULL")));
    }
    rma.ctx.bind()?;
    not_captured(WHAT, stream)?;
    if bytes > 0 {
        // SAFETY: the destination lies in the peer's window as mapped here
        // (checked above), alive until deregistered; NCCL's contract keeps
        // the source valid until the stream has run the copy.
        unsafe { stream.copy_device(base + offset as u64, src, bytes) }?;
    }
    let op = signal_op(&rma, peer);
    // SAFETY: the word lies in the peer's signal area as mapped here, kept
    // while the communicator's window state lives.
    unsafe { stream.mem_ops(&[op]) }
}

/// `ncclSignal`: a signal to `peer` with no data.
pub fn signal(
    comm: &Comm,
    peer: usize,
    sig_idx: i32,
    ctx: i32,
    flags: u32,
    stream: RawStream,
) -> Result<()> {
    const WHAT: &str = "ncclSignal";
    check_index(WHAT, sig_idx, ctx, flags)?;
    let rma = rma(comm, WHAT)?;
    check_peer(WHAT, &rma, peer)?;
    rma.ctx.bind()?;
    not_captured(WHAT, stream)?;
    let op = signal_op(&rma, peer);
    // SAFETY: as in `put_signal`.
    unsafe { stream.mem_ops(&[op]) }
}

/// What `ncclWaitSignal` waits for from one peer.
#[derive(Debug, Clone, Copy)]
pub struct WaitDesc {
    pub op_count: i32,
    pub peer: usize,
    pub sig_idx: i32,
    pub ctx: i32,
}

/// `ncclWaitSignal`: the stream's later work waits for `op_count` more
/// signals from each descriptor's peer.
pub fn wait_signal(comm: &Comm, descs: &[WaitDesc], stream: RawStream) -> Result<()> {
    const WHAT: &str = "ncclWaitSignal";
    if descs.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{WHAT}: no descriptors (nDesc is 0 or signalDescs NULL)"
        )));
    }
    let rma = rma(comm, WHAT)?;
    for (i, d) in descs.iter().enumerate() {
        check_index(&format!("{WHAT} descriptor {i}"), d.sig_idx, d.ctx, 0)?;
        check_peer(&format!("{WHAT} descriptor {i}"), &rma, d.peer)?;
        if d.op_count <= 0 {
            return Err(Error::InvalidArgument(format!(
                "{WHAT}: descriptor {i} waits for {} signals: at least 1",
                d.op_count
            )));
        }
    }
    rma.ctx.bind()?;
    not_captured(WHAT, stream)?;
    let ops: Vec<MemOp> = {
        let mut st = rma.state.lock().unwrap_or_else(PoisonError::into_inner);
        descs
            .iter()
            .map(|d| {
                st.awaited[d.peer] = st.awaited[d.peer].wrapping_add(d.op_count as u32);
                MemOp::Wait {
                    addr: rma.word(rma.rank, d.peer),
                    value: st.awaited[d.peer],
                }
            })
            .collect()
    };
    // SAFETY: our own signal words, kept while the window state lives.
    unsafe { stream.mem_ops(&ops) }
}
