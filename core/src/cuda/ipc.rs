//! CUDA IPC: memory of one process mapped into another on the same node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::sys;

use super::check::check;
use super::context::Context;
use crate::error::Result;

/// The 64 opaque bytes that name an allocation across processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcMemHandle(pub [u8; 64]);

/// Another process's allocation mapped into this one; unmapped when the
/// last mapping of it in this process goes.
///
/// The driver maps an allocation once per context: opening a handle that
/// is already open here fails with CUDA_ERROR_ALREADY_MAPPED, and every
/// communicator of the process would otherwise have to know what the
/// others opened (a grown or split communicator maps a peer's window
/// while its parent holds mappings of that peer's buffers). So every
/// opening goes through one table per process, by device and handle, with
/// a count of its users: the first opens, the others share the address,
/// the last closes (the reference counting CUDA documents for the call).
#[derive(Debug)]
pub struct IpcMapping {
    ctx: Arc<Context>,
    key: (usize, [u8; 64]),
    ptr: u64,
}

/// The mappings this process holds: (device, handle) -> (address, users).
type OpenedTable = HashMap<(usize, [u8; 64]), (u64, usize)>;

fn opened() -> std::sync::MutexGuard<'static, OpenedTable> {
    static OPENED: OnceLock<Mutex<OpenedTable>> = OnceLock::new();
    OPENED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

impl IpcMapping {
    /// Maps the allocation (or counts one more user of its mapping);
    /// peer access to its GPU is enabled as needed. Where the driver finds
    /// the allocation overlapping a mapping this process still holds (its
    /// owner freed a buffer that was kept mapped, and allocated this one
    /// in its place), the kept buffers are let go (see [`map_kept`]) and
    /// the mapping tried once more.
    pub fn open(ctx: &Arc<Context>, handle: &IpcMemHandle) -> Result<IpcMapping> {
        Ok(open_or_let_go(ctx, handle, &mut kept())?.0)
    }

    /// One try: `None` where the driver refuses with
    /// CUDA_ERROR_ALREADY_MAPPED (this process still maps memory the
    /// allocation overlaps).
    fn open_once(ctx: &Arc<Context>, handle: &IpcMemHandle) -> Result<Option<IpcMapping>> {
        let key = (ctx.device().ordinal(), handle.0);
        // Held while opening, so that no other thread opens or closes the
        // same handle in between.
        let mut table = opened();
        if let Some((ptr, users)) = table.get_mut(&key) {
            *users += 1;
            return Ok(Some(IpcMapping {
                ctx: ctx.clone(),
                key,
                ptr: *ptr,
            }));
        }
        ctx.bind()?;
        let h = sys::CUipcMemHandle {
            reserved: handle.0.map(|b| b as _),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: `ptr` is a valid out-pointer; the handle is passed by value.
        let r = unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) };
        if r == sys::CUresult::CUDA_ERROR_ALREADY_MAPPED {
            return Ok(None);
        }
        check(r, "cuIpcOpenMemHandle")?;
        table.insert(key, (ptr, 1));
        Ok(Some(IpcMapping {
            ctx: ctx.clone(),
            key,
            ptr,
        }))
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

/// Other processes' buffers kept mapped after the call that used them, for
/// the next calls on the same buffers (a framework reuses its buffers, and
/// a mapping costs far more than a small collective). One table per
/// process, shared by every communicator: an owner may free a buffer and
/// allocate another in its place, which the driver then refuses to map
/// while the old mapping stays (CUDA_ERROR_ALREADY_MAPPED), whichever
/// communicator holds it. Each entry remembers the allocation's id in its
/// owner's process (CU_POINTER_ATTRIBUTE_BUFFER_ID, never reused), so that
/// a handle that comes back for another allocation is mapped afresh.
struct Kept {
    id: u64,
    map: IpcMapping,
}

/// Kept mappings before the table is emptied.
const MAX_KEPT: usize = 512;

type KeptTable = HashMap<(usize, [u8; 64]), Kept>;

fn kept() -> std::sync::MutexGuard<'static, KeptTable> {
    static KEPT: OnceLock<Mutex<KeptTable>> = OnceLock::new();
    KEPT.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Lets go of the kept mappings on `ctx`'s device once the work queued on
/// it (which may use them) is done.
fn drop_kept(ctx: &Arc<Context>, kept: &mut KeptTable) -> Result<()> {
    let dev = ctx.device().ordinal();
    if kept.keys().any(|k| k.0 == dev) {
        ctx.synchronize()?;
        kept.retain(|k, _| k.0 != dev);
    }
    Ok(())
}

/// This process's addresses of other processes' exported buffers `bufs`
/// (a call's), mapped now or kept from earlier calls, all valid together:
/// where mapping one lets go of the kept mappings, those given for the
/// buffers before it are mapped again. Holds the table throughout, so no
/// other thread of the process lets go of them meanwhile.
pub fn map_kept(ctx: &Arc<Context>, bufs: &[Exported]) -> Result<Vec<u64>> {
    let mut kept = kept();
    for _ in 0..3 {
        let mut addrs = Vec::with_capacity(bufs.len());
        let mut moved = false;
        for e in bufs {
            let (addr, let_go) = map_one(ctx, &mut kept, e)?;
            moved |= let_go && !addrs.is_empty();
            addrs.push(addr);
        }
        if !moved {
            return Ok(addrs);
        }
    }
    Err(crate::error::Error::System(
        "mapping a call's buffers kept letting go of the ones mapped before them (CUDA_ERROR_ALREADY_MAPPED three times)".into(),
    ))
}

/// As [`map_kept`], but `None` where a buffer cannot be mapped without
/// first waiting for the context's queued work (letting go of kept
/// mappings, or of one whose owner freed its allocation): for a thread
/// that queues work other streams wait for, whose wait for the context
/// could wait for itself. The buffers mapped before stay kept.
pub fn map_kept_now(ctx: &Arc<Context>, bufs: &[Exported]) -> Result<Option<Vec<u64>>> {
    let mut kept = kept();
    let mut addrs = Vec::with_capacity(bufs.len());
    for e in bufs {
        match look_up(ctx, &kept, e) {
            Lookup::Kept(addr) => addrs.push(addr),
            Lookup::Stale | Lookup::Full => return Ok(None),
            Lookup::Absent => {
                let Some(map) = IpcMapping::open_once(ctx, &e.handle)? else {
                    return Ok(None);
                };
                addrs.push(map.ptr() + e.offset);
                kept.insert(kept_key(ctx, e), Kept { id: e.id, map });
            }
        }
    }
    Ok(Some(addrs))
}

/// What the table holds for a buffer.
enum Lookup {
    /// Its mapping, kept: the buffer's address.
    Kept(u64),
    /// A mapping of its handle for another allocation, since freed.
    Stale,
    /// Nothing, and the table is full.
    Full,
    /// Nothing.
    Absent,
}

fn kept_key(ctx: &Context, e: &Exported) -> (usize, [u8; 64]) {
    (ctx.device().ordinal(), e.handle.0)
}

fn look_up(ctx: &Context, kept: &KeptTable, e: &Exported) -> Lookup {
    match kept.get(&kept_key(ctx, e)) {
        Some(k) if k.id == e.id => Lookup::Kept(k.map.ptr() + e.offset),
        Some(_) => Lookup::Stale,
        None if kept.len() >= MAX_KEPT => Lookup::Full,
        None => Lookup::Absent,
    }
}

/// One buffer's address, and whether getting it let go of every kept
/// mapping of the device.
fn map_one(ctx: &Arc<Context>, kept: &mut KeptTable, e: &Exported) -> Result<(u64, bool)> {
    let key = kept_key(ctx, e);
    let mut let_go = false;
    match look_up(ctx, kept, e) {
        Lookup::Kept(addr) => return Ok((addr, false)),
        Lookup::Stale => {
            // The same handle for another allocation: the old one is freed.
            ctx.synchronize()?;
            kept.remove(&key);
        }
        Lookup::Full => {
            drop_kept(ctx, kept)?;
            let_go = true;
        }
        Lookup::Absent => {}
    }
    let (map, dropped) = open_or_let_go(ctx, &e.handle, kept)?;
    let addr = map.ptr() + e.offset;
    kept.insert(key, Kept { id: e.id, map });
    Ok((addr, let_go || dropped))
}

/// Maps `handle`; where the driver refuses it as overlapping a mapping
/// still held, lets go of the kept buffers and tries once more (and says
/// so).
fn open_or_let_go(
    ctx: &Arc<Context>,
    handle: &IpcMemHandle,
    kept: &mut KeptTable,
) -> Result<(IpcMapping, bool)> {
    if let Some(m) = IpcMapping::open_once(ctx, handle)? {
        return Ok((m, false));
    }
    drop_kept(ctx, kept)?;
    let m = IpcMapping::open_once(ctx, handle)?.ok_or_else(|| {
        crate::error::Error::System(
            "cuIpcOpenMemHandle: CUDA_ERROR_ALREADY_MAPPED: the allocation overlaps memory this process still maps from its owner, and none of the buffers kept mapped here is it".into(),
        )
    })?;
    Ok((m, true))
}

/// A buffer as another process maps it: its allocation's handle, the
/// buffer's offset in it, and the allocation's id in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    pub handle: IpcMemHandle,
    pub offset: u64,
    pub id: u64,
}

/// Handles already made for this process's allocations, by (device, base
/// address, buffer id): the id is never reused, so an entry never names a
/// freed allocation's successor. `None`: the allocation cannot be shared.
type ExportTable = HashMap<(usize, u64, u64), Option<IpcMemHandle>>;

/// Entries kept before the table is emptied.
const MAX_EXPORTED: usize = 1024;

/// The allocation holding device address `ptr` as another process can map
/// it; `None` when the allocation cannot be shared this way
/// (virtual-memory allocations such as PyTorch's expandable segments,
/// memory of another context). One driver query per call once the
/// allocation's handle is known: ranks sharing a GPU export their buffers
/// at every collective, and making a handle costs a system call.
pub fn export(ctx: &Arc<Context>, ptr: u64) -> Result<Option<Exported>> {
    static EXPORTED: OnceLock<Mutex<ExportTable>> = OnceLock::new();
    ctx.bind()?;
    let (mut base, mut id): (sys::CUdeviceptr, u64) = (0, 0);
    let mut attrs = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
    ];
    let mut data: [*mut std::ffi::c_void; 2] = [
        (&mut base as *mut sys::CUdeviceptr).cast(),
        (&mut id as *mut u64).cast(),
    ];
    // SAFETY: two attributes, each written to the out-pointer beside it
    // (a device address and a 64-bit id); the driver only reads `ptr`'s
    // value, and answers zeros for an address that is not CUDA's.
    let r = unsafe { sys::cuPointerGetAttributes(2, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr) };
    if check(r, "cuPointerGetAttributes").is_err() || base == 0 {
        return Ok(None);
    }
    let key = (ctx.device().ordinal(), base, id);
    let mut table = EXPORTED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let handle = match table.get(&key) {
        Some(h) => *h,
        None => {
            let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
            // SAFETY: `h` is a valid out-pointer; `base` starts an allocation.
            let r = unsafe { sys::cuIpcGetMemHandle(&mut h, base) };
            let h = check(r, "cuIpcGetMemHandle")
                .ok()
                .map(|()| IpcMemHandle(h.reserved.map(|b| b as u8)));
            if table.len() >= MAX_EXPORTED {
                table.clear();
            }
            table.insert(key, h);
            h
        }
    };
    Ok(handle.map(|handle| Exported {
        handle,
        offset: ptr - base,
        id,
    }))
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let mut table = opened();
        let last = match table.get_mut(&self.key) {
            Some((_, users)) if *users > 1 => {
                *users -= 1;
                false
            }
            _ => true,
        };
        if last {
            table.remove(&self.key);
            if self.ctx.bind().is_ok() {
                // SAFETY: opened by cuIpcOpenMemHandle in this context; the
                // table had this as its last user, so it is closed once.
                let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
            }
        }
    }
}
