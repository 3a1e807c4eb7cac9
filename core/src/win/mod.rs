//! Memory windows, NCCL's `ncclCommWindowRegister` (2.27+): each rank
//! registers a buffer of its GPU, collectively, and every rank of the host
//! maps every other rank's (CUDA IPC for `cuMemAlloc` memory, the virtual
//! memory API's file descriptors for `ncclMemAlloc` memory; ranks of one
//! process use the address as it is). No NVLink multicast object is made.
//!
//! On windows run the host one-sided API ([`signal`]: `ncclPutSignal`,
//! `ncclSignal`, `ncclWaitSignal`) and the copy-engine collectives
//! ([`ce`]), both without a kernel: copies on the copy engine and stream
//! memory operations on signal words, so they take no SM.
//!
//! A communicator's first window also makes its signal area: 3 x nranks
//! 32-bit words per rank, mapped by every rank as the windows are. Word
//! `s` of rank r's area counts the signals rank `s` sent r; words
//! `nranks + s` and `2 nranks + s` carry rank s's progress through the
//! copy-engine collectives (arrived, done).
//!
//! Windows need every rank on one host: one-sided transfers across the
//! network (NCCL's GIN) are not built.

pub mod ce;
mod share;
pub mod signal;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::comm::Comm;
use crate::cuda::{Context, Device, DeviceBuffer};
use crate::error::{Error, Result};

/// `NCCL_WIN_COLL_SYMMETRIC`: every rank passes a buffer at the same offset
/// of its window to the collectives on it.
pub const WIN_COLL_SYMMETRIC: i32 = 0x01;
/// `NCCL_WIN_STRICT_ORDERING`.
pub const WIN_STRICT_ORDERING: i32 = 0x02;

/// One rank's registered window and its peers' buffers as mapped here.
#[derive(Debug)]
pub struct Window {
    /// The window's number in its communicator: windows are registered
    /// collectively, so the same on every rank.
    seq: u64,
    rank: usize,
    flags: i32,
    addrs: Vec<u64>,
    sizes: Vec<usize>,
    _maps: Vec<share::Mapped>,
}

impl Window {
    /// The buffer this rank registered.
    pub fn user_ptr(&self) -> u64 {
        self.addrs[self.rank]
    }

    /// Its bytes.
    pub fn size(&self) -> usize {
        self.sizes[self.rank]
    }

    pub fn flags(&self) -> i32 {
        self.flags
    }

    /// The number of the window in its communicator (the same on every rank).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Where rank `peer`'s buffer is mapped in this process, and its bytes.
    pub fn peer(&self, peer: usize) -> Option<(u64, usize)> {
        Some((*self.addrs.get(peer)?, *self.sizes.get(peer)?))
    }

    /// Whether `ptr..ptr + bytes` lies in this rank's buffer.
    pub fn holds(&self, ptr: u64, bytes: usize) -> bool {
        let base = self.user_ptr();
        ptr >= base && ptr - base + bytes as u64 <= self.size() as u64
    }
}

/// The per-communicator state of windows and signals.
pub(crate) struct Rma {
    pub ctx: Arc<Context>,
    pub rank: usize,
    pub nranks: usize,
    /// Our signal words; kept while the communicator's windows may be used.
    _area: DeviceBuffer,
    /// Every rank's signal area as mapped here.
    pub areas: Vec<u64>,
    _area_maps: Vec<share::Mapped>,
    pub state: Mutex<Counters>,
    windows: Mutex<Vec<Arc<Window>>>,
    next: Mutex<u64>,
}

/// Counts kept on the host, in step with the stream operations enqueued.
#[derive(Debug)]
pub(crate) struct Counters {
    /// Signals sent to each rank.
    pub sent: Vec<u32>,
    /// Signals from each rank waited for so far.
    pub awaited: Vec<u32>,
    /// Copy-engine collectives run (the same count on every rank).
    pub colls: u32,
}

impl Rma {
    /// The address here of word `word` of rank `rank`'s signal area.
    pub fn word(&self, rank: usize, word: usize) -> u64 {
        self.areas[rank] + 4 * word as u64
    }
}

/// Key: (communicator hash, rank).
type Table = HashMap<(u64, usize), Arc<Rma>>;

fn table() -> std::sync::MutexGuard<'static, Table> {
    static T: OnceLock<Mutex<Table>> = OnceLock::new();
    T.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

fn key(comm: &Comm) -> Result<(u64, usize)> {
    Ok((comm.comm_hash()?, comm.user_rank()))
}

/// The communicator's window state, where it registered a window.
pub(crate) fn rma_of(comm: &Comm) -> Result<Option<Arc<Rma>>> {
    Ok(table().get(&key(comm)?).cloned())
}

/// The communicator's GPU context, or why it has none.
fn context_of(comm: &Comm) -> Result<Arc<Context>> {
    let dev = comm.device()?.ok_or_else(|| {
        Error::InvalidUsage(
            "memory windows need a communicator on a GPU; this one runs on host memory".into(),
        )
    })?;
    Context::primary(Device::get(dev)?)
}

/// Refuses communicators whose ranks span hosts (every rank alike).
fn one_host(comm: &Comm) -> Result<()> {
    let core = comm.core()?;
    let hosts = &core.locality.hosts;
    let away: Vec<usize> = (0..hosts.len()).filter(|&r| hosts[r] != hosts[0]).collect();
    if !away.is_empty() {
        return Err(Error::InvalidUsage(format!(
            "memory windows need every rank on one host: ranks {away:?} are on another host than rank 0, and one-sided transfers through the network (NCCL's GIN, a net plugin's RMA) are not built in oxccl; use ncclSend/ncclRecv between hosts"
        )));
    }
    Ok(())
}

fn rma_for(comm: &Comm, ctx: &Arc<Context>) -> Result<Arc<Rma>> {
    if let Some(r) = rma_of(comm)? {
        return Ok(r);
    }
    let core = comm.core()?;
    let n = comm.count();
    let area = DeviceBuffer::alloc(ctx, 3 * n * 4)?;
    area.fill_bytes(0)?;
    let shared = share::exchange(
        &core.bootstrap,
        ctx,
        area.ptr(),
        area.len(),
        "the signal area of the communicator's windows",
        core.cfg.timeout(),
    )?;
    let rma = Arc::new(Rma {
        ctx: ctx.clone(),
        rank: comm.user_rank(),
        nranks: n,
        _area: area,
        areas: shared.addrs,
        _area_maps: shared.maps,
        state: Mutex::new(Counters {
            sent: vec![0; n],
            awaited: vec![0; n],
            colls: 0,
        }),
        windows: Mutex::new(Vec::new()),
        next: Mutex::new(0),
    });
    table().insert(key(comm)?, rma.clone());
    Ok(rma)
}

/// Registers `size` bytes at `ptr` (device memory of the communicator's
/// GPU) as this rank's part of a window: collective, every rank of `comm`
/// calls it in the same order. `flags`: `WIN_*`.
pub fn register(comm: &Comm, ptr: u64, size: usize, flags: i32) -> Result<Arc<Window>> {
    if ptr == 0 {
        return Err(Error::InvalidArgument("window buffer is NULL".into()));
    }
    if size == 0 {
        return Err(Error::InvalidArgument("window size is 0".into()));
    }
    if flags & !(WIN_COLL_SYMMETRIC | WIN_STRICT_ORDERING) != 0 {
        return Err(Error::InvalidArgument(format!(
            "window flags {flags:#x}: NCCL_WIN_DEFAULT (0), NCCL_WIN_COLL_SYMMETRIC (1) and NCCL_WIN_STRICT_ORDERING (2) are the ones defined"
        )));
    }
    let ctx = context_of(comm)?;
    match crate::cuda::pointer_kind(ptr) {
        crate::cuda::PtrKind::Device => {}
        other => {
            return Err(Error::InvalidArgument(format!(
                "window buffer {ptr:#x} is not GPU memory ({other:?}): register memory from ncclMemAlloc or cudaMalloc"
            )))
        }
    }
    one_host(comm)?;
    let rma = rma_for(comm, &ctx)?;
    let core = comm.core()?;
    let seq = {
        let mut next = rma.next.lock().unwrap_or_else(PoisonError::into_inner);
        *next += 1;
        *next - 1
    };
    let shared = share::exchange(
        &core.bootstrap,
        &ctx,
        ptr,
        size,
        &format!("window {seq} ({size} bytes at {ptr:#x})"),
        core.cfg.timeout(),
    )?;
    let w = Arc::new(Window {
        seq,
        rank: comm.user_rank(),
        flags,
        addrs: shared.addrs,
        sizes: shared.sizes,
        _maps: shared.maps,
    });
    rma.windows
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(w.clone());
    tracing::info!(target: "oxccl::win", "window {seq}: {size} bytes at {ptr:#x}, flags {flags:#x}, mapped by {} rank(s)", comm.count());
    Ok(w)
}

/// Ends a window (local to the rank, as NCCL's): the peers' buffers are
/// unmapped once this GPU's queued work is done. The caller sees to it
/// that no operation still uses the window.
pub fn deregister(comm: &Comm, win: &Arc<Window>) -> Result<()> {
    let rma = rma_of(comm)?.ok_or_else(not_a_window)?;
    let mut ws = rma.windows.lock().unwrap_or_else(PoisonError::into_inner);
    let i = ws
        .iter()
        .position(|w| Arc::ptr_eq(w, win))
        .ok_or_else(not_a_window)?;
    rma.ctx.synchronize()?;
    ws.swap_remove(i);
    Ok(())
}

fn not_a_window() -> Error {
    Error::InvalidArgument(
        "not a window of this communicator (never registered, or deregistered)".into(),
    )
}

/// The window of `comm` whose object is at `addr` (what the C API hands
/// out as `ncclWindow_t`).
pub fn by_addr(comm: &Comm, addr: usize) -> Result<Arc<Window>> {
    let rma = rma_of(comm)?.ok_or_else(not_a_window)?;
    let ws = rma.windows.lock().unwrap_or_else(PoisonError::into_inner);
    ws.iter()
        .find(|w| Arc::as_ptr(w) as usize == addr)
        .cloned()
        .ok_or_else(not_a_window)
}

/// The window whose object is at `addr`, of any communicator of the
/// process (NCCL's device-pointer getters take no communicator).
pub fn find(addr: usize) -> Result<Arc<Window>> {
    let rmas: Vec<Arc<Rma>> = table().values().cloned().collect();
    rmas.iter()
        .find_map(|rma| {
            let ws = rma.windows.lock().unwrap_or_else(PoisonError::into_inner);
            ws.iter().find(|w| Arc::as_ptr(w) as usize == addr).cloned()
        })
        .ok_or_else(|| {
            Error::InvalidArgument(
                "not a window of any communicator (never registered, or deregistered)".into(),
            )
        })
}

/// The window of `comm` that holds `ptr..ptr + bytes` on this rank.
pub fn holding(comm: &Comm, ptr: u64, bytes: usize) -> Result<Option<Arc<Window>>> {
    let Some(rma) = rma_of(comm)? else {
        return Ok(None);
    };
    let ws = rma.windows.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(ws.iter().find(|w| w.holds(ptr, bytes)).cloned())
}

/// Forgets the communicator's windows and signal area (at its destroy):
/// unmapped once this GPU's queued work is done; where `aborted`, kept
/// mapped until the process ends instead (an abort never waits, and work
/// queued on the GPU may still use them).
fn release(comm: &Comm, aborted: bool) {
    let Ok(k) = key(comm) else { return };
    let Some(rma) = table().remove(&k) else {
        return;
    };
    if aborted {
        std::mem::forget(rma);
    } else {
        let _ = rma.ctx.synchronize();
    }
}

// The communicator forgets its windows as it ends.
oxccl_plugin::inventory::submit! {
    crate::comm::AtEnd(release)
}
