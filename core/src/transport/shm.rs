//! The shared-memory transport (NCCL's SHM): ranks of one host, in one
//! process or several, pass messages through a ring in a POSIX
//! shared-memory segment instead of loopback TCP.
//!
//! It speaks the net plugin's interface ([`Net`], [`ListenComm`],
//! [`SendComm`], [`RecvComm`]), so the executor drives it as it drives a
//! network: `isend`/`irecv` queue a request and return; `test` moves as many
//! slots as are ready, with atomics and copies only (no system call).
//!
//! The receiver creates the segment (`listen`) and hands its name over in
//! the 128-byte handle; the sender opens and maps it (`connect`), removes
//! the name and marks it mapped, which completes `accept`. From then on only
//! the two mappings hold the memory: a killed process leaves nothing in
//! /dev/shm. Either end's drop marks the ring closed, so the other's next
//! call that needs it fails with [`NetError::Remote`]; an end whose process
//! died without dropping is found by its lock (see [`segment`]) when the
//! other end has waited a while.

pub mod area;
mod reserve;
mod ring;
mod segment;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use oxccl_plugin::{
    ListenComm, MrHandle, Net, NetError, NetHandle, NetProperties, NetResult, PtrType, RecvComm,
    Request, SendComm, NET_HANDLE_MAXSIZE,
};

use ring::{End, Id, Receiver, RecvFifo, RingError, SendFifo, Sender, STEPS};
use segment::{RecvBuf, Segment, SendBuf};

/// Name of segments: `/oxccl-<pid>-<serial>-<random>` (the pid says whose
/// a leftover would be; the random part keeps names apart across pid
/// namespaces that share /dev/shm).
pub const PREFIX: &str = "oxccl-";

/// How often an end that waits looks whether its peer's process is alive:
/// rarely enough that the lock query (a system call) costs nothing.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);

/// Idle calls between two looks at the clock, which is a system call
/// where the kernel's clock source has no vDSO path (some VMs).
const CLOCK_EVERY: u32 = 256;

/// The SHM transport of one communicator: rings of [`STEPS`] slots of
/// `NCCL_BUFFSIZE / STEPS` bytes each.
#[derive(Debug, Clone)]
pub struct ShmNet {
    slot_bytes: usize,
}

impl ShmNet {
    pub fn new(buffsize: u64) -> ShmNet {
        let slot = (buffsize / STEPS as u64).clamp(64, u64::from(u32::MAX));
        ShmNet {
            slot_bytes: slot as usize,
        }
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }
}

fn unique_name() -> String {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    format!(
        "/{PREFIX}{}-{}-{:016x}",
        std::process::id(),
        SERIAL.fetch_add(1, Ordering::Relaxed),
        rand::random::<u64>()
    )
}

fn decode(handle: &NetHandle) -> NetResult<String> {
    let end = handle.iter().position(|b| *b == 0).unwrap_or(handle.len());
    let name = std::str::from_utf8(&handle[..end]).unwrap_or("");
    if !name.starts_with(&format!("/{PREFIX}")) {
        return Err(NetError::InvalidArgument(format!(
            "not a shared-memory connection handle: {:?}",
            &handle[..end.min(32)]
        )));
    }
    Ok(name.to_string())
}

impl Net for ShmNet {
    fn name(&self) -> &str {
        "SHM"
    }

    fn devices(&self) -> NetResult<usize> {
        Ok(1)
    }

    fn properties(&self, _dev: usize) -> NetResult<NetProperties> {
        Ok(NetProperties {
            name: "shm".into(),
            pci_path: String::new(),
            guid: 0,
            ptr_support: PtrType::Host as i32,
            reg_is_global: true,
            speed_mbps: 0,
            port: 0,
            latency_us: 0.0,
            max_comms: i32::MAX,
            max_recvs: 1,
            max_p2p_bytes: usize::MAX,
        })
    }

    fn listen(&self, _dev: usize) -> NetResult<(NetHandle, Box<dyn ListenComm>)> {
        let name = unique_name();
        let seg = Segment::create(&name, self.slot_bytes)?;
        let mut handle = [0u8; NET_HANDLE_MAXSIZE];
        handle[..name.len()].copy_from_slice(name.as_bytes());
        Ok((
            handle,
            Box::new(ShmListen {
                name,
                seg: Some(seg),
            }),
        ))
    }

    fn connect(&self, _dev: usize, handle: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>> {
        let name = decode(handle)?;
        let seg = Segment::open(&name)?;
        seg.control().mark_sender_mapped();
        let fifo = SendFifo::new(Sender::new(seg.slot_bytes()));
        Ok(Some(Box::new(ShmSend {
            conn: Arc::new(Mutex::new(Conn::new(seg, End::Send, fifo))),
        })))
    }
}

/// A receiving end waiting for its sender to map the segment.
struct ShmListen {
    name: String,
    seg: Option<Segment>,
}

impl ListenComm for ShmListen {
    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        if !self
            .seg
            .as_ref()
            .is_some_and(|s| s.control().sender_mapped())
        {
            return Ok(None);
        }
        let seg = self.seg.take().expect("checked");
        let fifo = RecvFifo::new(Receiver::new(seg.slot_bytes()));
        Ok(Some(Box::new(ShmRecv {
            conn: Arc::new(Mutex::new(Conn::new(seg, End::Recv, fifo))),
        })))
    }
}

impl Drop for ShmListen {
    fn drop(&mut self) {
        // The sender never came (it removes the name when it does).
        if self.seg.is_some() {
            segment::unlink(&self.name);
        }
    }
}

/// One end of a connection and its queue of requests, shared by the comm
/// and its requests (which may outlive it).
struct Conn<F> {
    seg: Segment,
    end: End,
    fifo: F,
    /// When this end last looked at its peer's lock.
    looked: Instant,
    /// Calls that moved nothing since the clock was last read.
    idle: u32,
}

impl<F> Conn<F> {
    fn new(seg: Segment, end: End, fifo: F) -> Conn<F> {
        Conn {
            seg,
            end,
            fifo,
            looked: Instant::now(),
            idle: 0,
        }
    }

    /// After a call that moved nothing: whether the peer's process is gone.
    fn peer_gone(&mut self) -> bool {
        self.idle += 1;
        if self.idle < CLOCK_EVERY {
            return false;
        }
        self.idle = 0;
        if self.looked.elapsed() < LIVENESS_EVERY {
            return false;
        }
        self.looked = Instant::now();
        !self.seg.alive(self.end.other())
    }

    fn gone(&self) -> RingError {
        RingError::Gone(self.end.other())
    }
}

fn net_error(e: RingError) -> NetError {
    match e {
        RingError::Closed(_) | RingError::Gone(_) => NetError::Remote(e.to_string()),
        RingError::Truncated { .. } => NetError::InvalidArgument(e.to_string()),
        RingError::Abandoned => NetError::InvalidUsage(e.to_string()),
        RingError::TagMismatch { .. } | RingError::Corrupt(_) => NetError::Internal(e.to_string()),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic inside a progress call leaves the FIFO consistent (it is
    // only ever mutated through whole pushes and pops).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type SendConn = Conn<SendFifo<SendBuf>>;
type RecvConn = Conn<RecvFifo<RecvBuf>>;

impl SendConn {
    fn progress(&mut self) -> Result<bool, RingError> {
        let r = self.fifo.progress(self.seg.control(), &self.seg);
        match r {
            Ok(false) if self.peer_gone() => Err(self.fail(self.gone())),
            Err(e) => Err(self.fail(e)),
            ok => ok,
        }
    }

    /// The FIFO stops (dropping the caller's buffers) and the peer is told.
    fn fail(&mut self, e: RingError) -> RingError {
        self.seg.control().close(End::Send);
        self.fifo.fail(e)
    }
}

impl RecvConn {
    fn progress(&mut self) -> Result<bool, RingError> {
        let r = self.fifo.progress(self.seg.control(), &self.seg);
        match r {
            Ok(false) if self.peer_gone() => Err(self.fail(self.gone())),
            Err(e) => Err(self.fail(e)),
            ok => ok,
        }
    }

    fn fail(&mut self, e: RingError) -> RingError {
        self.seg.control().close(End::Recv);
        self.fifo.fail(e)
    }
}

struct ShmSend {
    conn: Arc<Mutex<SendConn>>,
}

// The trait's isend is an unsafe fn; its pointer goes straight into a
// `SendBuf`, whose constructor states the contract (unsafe lives in segment).
#[allow(unsafe_code)]
impl SendComm for ShmSend {
    fn reg_mr(&mut self, _ptr: *mut u8, _size: usize, _t: PtrType) -> NetResult<MrHandle> {
        // Copies go through the ring: nothing to register.
        Ok(MrHandle(0))
    }

    fn dereg_mr(&mut self, _mr: MrHandle) -> NetResult<()> {
        Ok(())
    }

    unsafe fn isend(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        _mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        // SAFETY: isend's own contract, passed on: `data` stays readable and
        // unchanged until the request completes (or is dropped, which
        // takes the buffer out of the queue).
        let buf = unsafe { SendBuf::new(data, size) };
        let mut c = lock(&self.conn);
        if let Some(e) = c.fifo.failure() {
            return Err(net_error(e.clone()));
        }
        let id = c.fifo.post(buf, tag);
        // Start at once: a small message is in the ring before isend returns.
        c.progress().map_err(net_error)?;
        drop(c);
        Ok(Some(Box::new(SendReq {
            conn: self.conn.clone(),
            id,
            size,
            done: false,
        })))
    }
}

impl Drop for ShmSend {
    fn drop(&mut self) {
        lock(&self.conn).seg.control().close(End::Send);
    }
}

struct ShmRecv {
    conn: Arc<Mutex<RecvConn>>,
}

// As for ShmSend's isend.
#[allow(unsafe_code)]
impl RecvComm for ShmRecv {
    fn reg_mr(&mut self, _ptr: *mut u8, _size: usize, _t: PtrType) -> NetResult<MrHandle> {
        Ok(MrHandle(0))
    }

    fn dereg_mr(&mut self, _mr: MrHandle) -> NetResult<()> {
        Ok(())
    }

    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        _mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        // SAFETY: irecv's own contract, passed on, as in isend.
        let buf = unsafe { RecvBuf::new(data, size) };
        let mut c = lock(&self.conn);
        if let Some(e) = c.fifo.failure() {
            return Err(net_error(e.clone()));
        }
        let id = c.fifo.post(buf, tag);
        drop(c);
        Ok(Some(Box::new(RecvReq {
            conn: self.conn.clone(),
            id,
            got: None,
        })))
    }
}

impl Drop for ShmRecv {
    fn drop(&mut self) {
        lock(&self.conn).seg.control().close(End::Recv);
    }
}

struct SendReq {
    conn: Arc<Mutex<SendConn>>,
    id: Id,
    size: usize,
    done: bool,
}

impl Request for SendReq {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        let mut c = lock(&self.conn);
        if !c.fifo.is_done(self.id) {
            c.progress().map_err(net_error)?;
        }
        self.done = c.fifo.is_done(self.id);
        Ok(self.done.then(|| vec![self.size]))
    }
}

impl Drop for SendReq {
    fn drop(&mut self) {
        if !self.done {
            let mut c = lock(&self.conn);
            if !c.fifo.is_done(self.id) {
                c.fail(RingError::Abandoned);
            }
        }
    }
}

struct RecvReq {
    conn: Arc<Mutex<RecvConn>>,
    id: Id,
    /// The size received, once done.
    got: Option<usize>,
}

impl Request for RecvReq {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        if let Some(size) = self.got {
            return Ok(Some(vec![size]));
        }
        let mut c = lock(&self.conn);
        if c.fifo.is_pending(self.id) {
            c.progress().map_err(net_error)?;
        }
        match c.fifo.take(self.id) {
            Some((size, _buf)) => {
                self.got = Some(size);
                Ok(Some(vec![size]))
            }
            None if c.fifo.is_pending(self.id) => Ok(None),
            // Neither queued nor finished: the FIFO failed under it.
            None => Err(net_error(
                c.fifo.failure().cloned().unwrap_or(RingError::Abandoned),
            )),
        }
    }
}

impl Drop for RecvReq {
    fn drop(&mut self) {
        if self.got.is_none() {
            let mut c = lock(&self.conn);
            if c.fifo.is_pending(self.id) {
                c.fail(RingError::Abandoned);
            }
        }
    }
}

#[cfg(test)]
mod tests;
