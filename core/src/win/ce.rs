//! Copy-engine collectives (NCCL 2.28+'s zero-CTA collectives): all_gather
//! and all_to_all whose output lies in a window registered with
//! `NCCL_WIN_COLL_SYMMETRIC`, run as one copy per peer on the copy engine
//! into the peer's window as mapped here, between stream memory operations
//! on the signal words: no kernel, so no SM is taken from the
//! application's kernels running beside them.
//!
//! On the caller's stream, collective number c:
//! 1. arrive: write c into word `nranks + me` of every peer's area (our
//!    output may now be written: the stream's work before is done), and
//!    wait until every peer's arrival word in ours is c;
//! 2. the copies: ours into our own output, then one per peer;
//! 3. done: write c into word `2 nranks + me` of every peer's area, and
//!    wait until every peer's done word in ours is c (every peer finished
//!    writing into our output).
//!
//! Chosen where `OXCCL_CE_COLL` says: `auto` (the default: where the
//! communicator's CTA policy is NCCL_CTA_POLICY_ZERO, as NCCL chooses),
//! `1` (whenever the buffers allow), `0` (never). Every rank must decide
//! alike (the same setting, windows registered symmetrically), as NCCL
//! requires. Inside ncclGroupStart/End the kernel path runs.
#![allow(unsafe_code)] // copies and stream operations on mapped device addresses

use std::sync::{Arc, PoisonError};

use super::{rma_of, Rma, Window, WIN_COLL_SYMMETRIC};
use crate::comm::Comm;
use crate::cuda::{MemOp, RawStream};
use crate::error::{Error, Result};

/// `OXCCL_CE_COLL`'s values, parsed where the settings table checks them.
pub use crate::config::{ce_coll_mode as mode, CeCollMode as Mode};

/// The collectives that run on the copy engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CeColl {
    /// Each rank's `bytes` to every rank's output at `rank * bytes`.
    AllGather,
    /// Block p (`bytes`) of each rank's input to rank p's output at
    /// `rank * bytes`.
    AllToAll,
}

/// The communicator's window state and the symmetric window holding the
/// output (`nranks * bytes` at `output`) where `comm` runs this collective
/// on the copy engine: no group open, such a window, and the setting and
/// the communicator's CTA policy asking for it. The window is looked up
/// first: a communicator without one (the usual case) pays no setting
/// read per call.
fn chosen(comm: &Comm, output: u64, bytes: usize) -> Result<Option<(Arc<Rma>, Arc<Window>)>> {
    if bytes == 0 || crate::group::depth() > 0 {
        return Ok(None);
    }
    let Some(total) = bytes.checked_mul(comm.count()) else {
        return Ok(None);
    };
    let Some(rma) = rma_of(comm)? else {
        return Ok(None);
    };
    let win = {
        let ws = rma.windows.lock().unwrap_or_else(PoisonError::into_inner);
        ws.iter()
            .find(|w| w.holds(output, total) && w.flags() & WIN_COLL_SYMMETRIC != 0)
            .cloned()
    };
    let Some(win) = win else {
        return Ok(None);
    };
    let m = mode(crate::config::ox::ce_coll()?.as_deref())
        .map_err(|why| Error::InvalidArgument(format!("OXCCL_CE_COLL: {why}")))?;
    let wanted = match m {
        Mode::Never => false,
        Mode::Force => true,
        Mode::Auto => {
            let core = comm.core()?;
            crate::config::cta_policy(core.cfg.cta_policy.as_deref()).unwrap_or(0) == 2
        }
    };
    Ok(wanted.then_some((rma, win)))
}

/// Runs `coll` on the copy engine where it is chosen (see the module);
/// `Ok(false)`: not chosen, the caller runs it otherwise. `bytes`: each
/// rank's block.
///
/// # Safety
/// NCCL's contract for the collective: `input` holds `bytes`
/// (all_gather) or `nranks * bytes` (all_to_all) and `output`
/// `nranks * bytes` of device memory, untouched by others until the stream
/// has run the collective.
pub unsafe fn try_run(
    comm: &Comm,
    coll: CeColl,
    input: u64,
    output: u64,
    bytes: usize,
    stream: RawStream,
) -> Result<bool> {
    let Some((rma, win)) = chosen(comm, output, bytes)? else {
        return Ok(false);
    };
    let n = comm.count();
    let total = bytes * n;
    let me = rma.rank;
    rma.ctx.bind()?;
    if stream.is_capturing()? {
        // Counts on the host: a replayed graph would not advance them.
        return Ok(false);
    }
    // The output's offset in the window, the same on every rank (symmetric).
    let off = output - win.user_ptr();
    let mut outs = Vec::with_capacity(n);
    for p in 0..n {
        let (base, size) = win.peer(p).ok_or_else(|| {
            Error::Internal(format!("window {} has no part of rank {p}", win.seq()))
        })?;
        if off + total as u64 > size as u64 {
            return Err(Error::InvalidArgument(format!(
                "{coll:?} on the copy engine: the output ({total} bytes at offset {off} of window {}) overruns rank {p}'s part of {size} bytes; a symmetric window needs the same layout on every rank",
                win.seq()
            )));
        }
        outs.push(base + off);
    }
    let c = {
        let mut st = rma.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.colls = st.colls.wrapping_add(1);
        st.colls
    };
    let peers = || (1..n).map(|k| (me + k) % n);
    let arrive: Vec<MemOp> = peers()
        .map(|p| MemOp::Write {
            addr: rma.word(p, n + me),
            value: c,
        })
        .chain(peers().map(|p| MemOp::Wait {
            addr: rma.word(me, n + p),
            value: c,
        }))
        .collect();
    let done: Vec<MemOp> = peers()
        .map(|p| MemOp::Write {
            addr: rma.word(p, 2 * n + me),
            value: c,
        })
        .chain(peers().map(|p| MemOp::Wait {
            addr: rma.word(me, 2 * n + p),
            value: c,
        }))
        .collect();
    let block = bytes as u64;
    let src = |p: usize| match coll {
        CeColl::AllGather => input,
        CeColl::AllToAll => input + p as u64 * block,
    };
    // SAFETY: the signal words lie in the areas mapped for the
    // communicator; the destinations in the ranks' windows as mapped here
    // (bounds checked above); the caller's contract for the input and our
    // output. Input and output do not overlap but for all_gather in place,
    // where our own block is its own source and is not copied.
    unsafe {
        stream.mem_ops(&arrive)?;
        let own = outs[me] + me as u64 * block;
        if src(me) != own {
            stream.copy_device(own, src(me), bytes)?;
        }
        for p in peers() {
            stream.copy_device(outs[p] + me as u64 * block, src(p), bytes)?;
        }
        stream.mem_ops(&done)?;
    }
    tracing::debug!(target: "oxccl::coll", "{coll:?} #{c} on the copy engine: {bytes} bytes per rank, window {}", win.seq());
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_reads_as_documented() {
        assert_eq!(mode(None).unwrap(), Mode::Auto);
        assert_eq!(mode(Some(" ")).unwrap(), Mode::Auto);
        assert_eq!(mode(Some("AUTO")).unwrap(), Mode::Auto);
        assert_eq!(mode(Some("1")).unwrap(), Mode::Force);
        assert_eq!(mode(Some("0")).unwrap(), Mode::Never);
        assert!(mode(Some("sometimes")).is_err());
    }
}
