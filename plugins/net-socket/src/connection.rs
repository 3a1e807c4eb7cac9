//! Connections: one control socket plus the data sockets, opened in order by
//! the connecting side and gathered by the listening side, both as state
//! machines that never block (the core drives many connections from one
//! thread). Then the two ends a connection has once established.
//!
//! With a key (NCCL_SOCKET_KEY_FILE), every socket runs `oxccl_secure`'s
//! handshake first and its introduction is the first encrypted record: a
//! socket from a peer without the key is refused before it is placed.

use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxccl_plugin::{MrHandle, NetError, NetProf, NetResult, PtrType, RecvComm, Request, SendComm};
use oxccl_secure::{Key, Role, SecureError, Session};
use socket2::{Domain, Protocol, Socket, Type};

use crate::handle::Handle;
use crate::request::{lock, DataPath, Queue, SocketRequest};
use crate::stream::{io_error, Io, Stream, MSG_NOSIGNAL};
use crate::threads::Worker;

#[cfg(any(target_os = "linux", target_os = "android"))]
const EINPROGRESS: i32 = 115;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const EINPROGRESS: i32 = 36;

/// Each socket opens with these bytes: which connection, which position.
const INTRO: usize = 16;
const INTRO_MAGIC: u32 = 0x4f58_4931; // "OXI1"

/// How long a refused or timed-out connect is retried: the listener may sit
/// behind a full backlog for a moment, but a handle to nowhere must end.
pub const CONNECT_RETRY_FOR: Duration = Duration::from_secs(10);
const CONNECT_RETRY_EVERY: Duration = Duration::from_millis(10);

/// How long one socket may take from its connect to its introduction (the
/// key exchange included) on either side: a peer that connects and then
/// stalls, by fault or on purpose, is dropped after it (with a warning that
/// names it) instead of being kept, and a listener that never answers fails
/// the connect. Generous: on a working network both take milliseconds.
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// Binds every session to this network: a bootstrap connection cannot be
/// passed off as one of ours.
const PROLOGUE: &[u8] = b"oxccl net-socket v1";

/// A WARN line of this network: through the logger NCCL (or the core)
/// gave at `init`, as NCCL's socket transport logs ("NET/Socket : ..."),
/// else to stderr in NCCL's line form.
pub fn warn(msg: &str) {
    oxccl_plugin::net::export::log(
        oxccl_plugin::ffi::NCCL_LOG_WARN,
        &format!("NET/Socket : {msg}"),
    );
}

fn session(role: Role, key: &Key) -> NetResult<Box<Session>> {
    Session::new(role, key, PROLOGUE)
        .map(Box::new)
        .map_err(|e| NetError::Internal(format!("cannot start an encrypted session: {e}")))
}

fn intro(conn_id: u64, index: u32) -> [u8; INTRO] {
    let mut b = [0u8; INTRO];
    b[0..8].copy_from_slice(&conn_id.to_le_bytes());
    b[8..12].copy_from_slice(&index.to_le_bytes());
    b[12..16].copy_from_slice(&INTRO_MAGIC.to_le_bytes());
    b
}

/// A socket being opened by the connecting side.
struct Opening {
    sock: Socket,
    since: Instant,
    connected: bool,
    intro: [u8; INTRO],
    sent: usize,
    sess: Option<Box<Session>>,
}

/// The connecting side's progress, kept between calls to `connect`.
pub struct Connecting {
    handle: Handle,
    key: Option<Arc<Key>>,
    open: Vec<Stream>,
    current: Option<Opening>,
    started: Instant,
    retry_for: Duration,
    /// NCCL's retries, where set: they replace `retry_for`.
    nccl_retry: Option<oxccl_netif::Retry>,
    /// Connects failed so far (counted against `nccl_retry`).
    failures: u32,
    retry_at: Option<Instant>,
    handshake_wait: Duration,
}

impl Connecting {
    /// `retry`: how long oxccl retries a refused connect, and NCCL's
    /// retries (NCCL_SOCKET_RETRY_CNT and _SLEEP_MSEC) that replace it where
    /// set.
    pub fn new(
        handle: Handle,
        retry: (Duration, Option<oxccl_netif::Retry>),
        handshake_wait: Duration,
        key: Option<Arc<Key>>,
    ) -> Connecting {
        let (retry_for, nccl_retry) = retry;
        Connecting {
            handle,
            key,
            open: Vec::new(),
            current: None,
            started: Instant::now(),
            retry_for,
            nccl_retry,
            failures: 0,
            retry_at: None,
            handshake_wait,
        }
    }

    /// Moves as far as it can without blocking; the sockets, control first,
    /// once all are open and introduced.
    pub fn step(&mut self) -> NetResult<Option<Vec<Stream>>> {
        let addr = self.handle.addr;
        let sys = |e: io::Error| NetError::System(format!("connect to {addr}: {e}"));
        loop {
            if self.open.len() == self.handle.nsocks() + 1 {
                return Ok(Some(std::mem::take(&mut self.open)));
            }
            if let Some(t) = self.retry_at {
                if Instant::now() < t {
                    return Ok(None);
                }
                self.retry_at = None;
            }
            let Some(op) = self.current.as_mut() else {
                let sock =
                    Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
                        .map_err(sys)?;
                sock.set_nonblocking(true).map_err(sys)?;
                tune(&sock);
                let connected = match sock.connect(&addr.into()) {
                    Ok(()) => true,
                    Err(e) if in_progress(&e) => false,
                    Err(e) => {
                        self.retry_or_fail(e)?;
                        continue;
                    }
                };
                let index = self.open.len() as u32;
                let sess = match &self.key {
                    Some(k) => Some(session(Role::Initiator, k)?),
                    None => None,
                };
                self.current = Some(Opening {
                    sock,
                    since: Instant::now(),
                    connected,
                    intro: intro(self.handle.conn_id, index),
                    sent: 0,
                    sess,
                });
                continue;
            };
            if op.since.elapsed() > self.handshake_wait {
                let what = if op.connected {
                    "did not answer the key exchange and introduction"
                } else {
                    "did not accept the connection"
                };
                return Err(NetError::Remote(format!(
                    "connect to {addr}: the listener {what} within {:?} (a stalled peer, or not an oxccl listener)",
                    self.handshake_wait
                )));
            }
            if !op.connected {
                if let Some(e) = op.sock.take_error().map_err(sys)? {
                    self.retry_or_fail(e)?;
                    continue;
                }
                match op.sock.peer_addr() {
                    Ok(_) => op.connected = true,
                    Err(e) if e.kind() == ErrorKind::NotConnected => return Ok(None),
                    Err(e) => return Err(sys(e)),
                }
            }
            if let Some(sess) = op.sess.as_mut() {
                // The handshake, then the introduction as its first record.
                let refused = |e: SecureError| {
                    NetError::Remote(format!(
                        "connect to {addr}: refused in the key exchange: {e}"
                    ))
                };
                if !sess.handshake_step(&mut Io(&op.sock)).map_err(refused)? {
                    return Ok(None);
                }
                if op.sent < INTRO {
                    sess.seal(&[&op.intro], INTRO).map_err(refused)?;
                    op.sent = INTRO;
                }
                match sess.flush_with(|b| Io(&op.sock).write(b)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                    Err(e) => return Err(io_error(&addr.to_string(), e)),
                }
            } else {
                match op.sock.send_with_flags(&op.intro[op.sent..], MSG_NOSIGNAL) {
                    Ok(n) => op.sent += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(io_error(&addr.to_string(), e)),
                }
            }
            if op.sent == INTRO {
                let op = self.current.take().expect("checked above");
                self.open.push(Stream {
                    sock: op.sock,
                    sess: op.sess,
                });
            }
        }
    }

    fn retry_or_fail(&mut self, e: io::Error) -> NetResult<()> {
        self.current = None;
        let transient = matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::TimedOut);
        if let Some(r) = self.nccl_retry {
            // NCCL's: after the n-th refused, timed-out or unreachable
            // connect, wait n x the sleep; give up after the count.
            let transient = transient || e.kind() == ErrorKind::HostUnreachable;
            self.failures += 1;
            if let Some(wait) = r.wait_after(self.failures).filter(|_| transient) {
                self.retry_at = Some(Instant::now() + wait);
                return Ok(());
            }
            let msg = format!(
                "connect to {} failed: {e}{}",
                self.handle.addr,
                if transient {
                    format!(" (after {} retries: NCCL_SOCKET_RETRY_CNT)", r.count)
                } else {
                    String::new()
                }
            );
            return Err(if transient {
                NetError::Remote(msg)
            } else {
                NetError::System(msg)
            });
        }
        if transient && self.started.elapsed() < self.retry_for {
            self.retry_at = Some(Instant::now() + CONNECT_RETRY_EVERY);
            return Ok(());
        }
        let msg = format!("connect to {} failed: {e}", self.handle.addr);
        Err(if transient {
            NetError::Remote(msg)
        } else {
            NetError::System(msg)
        })
    }
}

fn in_progress(e: &io::Error) -> bool {
    e.raw_os_error() == Some(EINPROGRESS) || e.kind() == ErrorKind::WouldBlock
}

/// No Nagle delay for small messages. Kernel buffer sizes are left to
/// autotuning: fixing them (1 or 4 MiB) measured 20-40% slower on loopback.
fn tune(s: &Socket) {
    let _ = s.set_tcp_nodelay(true);
}

/// An accepted socket whose introduction has not fully arrived.
struct Arriving {
    sock: Socket,
    since: Instant,
    peer: Option<SocketAddr>,
    intro: [u8; INTRO],
    got: usize,
    sess: Option<Box<Session>>,
}

/// The listening side's progress: sockets arrive in any order (the kernel
/// queues them), each says which connection and which position it is.
pub struct Accepting {
    conn_id: u64,
    key: Option<Arc<Key>>,
    handshake_wait: Duration,
    arriving: Vec<Arriving>,
    slots: Vec<Option<Stream>>,
}

impl Accepting {
    pub fn new(
        conn_id: u64,
        nsocks: usize,
        handshake_wait: Duration,
        key: Option<Arc<Key>>,
    ) -> Accepting {
        Accepting {
            conn_id,
            key,
            handshake_wait,
            arriving: Vec::new(),
            slots: (0..=nsocks).map(|_| None).collect(),
        }
    }

    pub fn offer(&mut self, sock: Socket, peer: Option<SocketAddr>) -> NetResult<()> {
        sock.set_nonblocking(true)
            .map_err(|e| NetError::System(format!("accept: {e}")))?;
        tune(&sock);
        let sess = match &self.key {
            Some(k) => Some(session(Role::Responder, k)?),
            None => None,
        };
        self.arriving.push(Arriving {
            sock,
            since: Instant::now(),
            peer,
            intro: [0; INTRO],
            got: 0,
            sess,
        });
        Ok(())
    }

    /// Reads what introductions have arrived; the sockets, control first,
    /// once every position is filled.
    pub fn step(&mut self) -> Option<Vec<Stream>> {
        let mut i = 0;
        while i < self.arriving.len() {
            let a = &mut self.arriving[i];
            if a.since.elapsed() > self.handshake_wait {
                let peer = a.peer.map_or_else(|| "?".to_string(), |p| p.to_string());
                let what = if a.sess.is_some() {
                    "finish the key exchange and send its introduction"
                } else {
                    "send its introduction"
                };
                warn(&format!(
                    "dropped a connection from {peer}: it did not {what} within {:?}",
                    self.handshake_wait
                ));
                self.arriving.swap_remove(i);
                continue;
            }
            let r = match a.sess.as_mut() {
                None => (&a.sock).read(&mut a.intro[a.got..]),
                Some(sess) => {
                    let io = &mut Io(&a.sock);
                    let r = sess.handshake_step(io).and_then(|ready| match ready {
                        true => sess.read_from(io, &mut a.intro[a.got..]),
                        false => Ok(None),
                    });
                    match r {
                        Ok(Some(n)) => Ok(n),
                        Ok(None) => Err(ErrorKind::WouldBlock.into()),
                        // Gone before saying who it was: not ours to report.
                        Err(SecureError::Io(e)) => Err(e),
                        Err(e) => {
                            let peer = a.peer.map_or_else(|| "?".to_string(), |p| p.to_string());
                            warn(&format!("refused a connection from {peer}: {e}"));
                            self.arriving.swap_remove(i);
                            continue;
                        }
                    }
                }
            };
            match r {
                Ok(0) => {
                    // Gone before saying who it was: not ours to report.
                    self.arriving.swap_remove(i);
                }
                Ok(n) => {
                    a.got += n;
                    if a.got == INTRO {
                        let a = self.arriving.swap_remove(i);
                        self.place(a);
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    i += 1
                }
                Err(_) => {
                    self.arriving.swap_remove(i);
                }
            }
        }
        if self.slots.iter().any(Option::is_none) {
            return None;
        }
        let n = self.slots.len();
        let socks = self.slots.iter_mut().filter_map(Option::take).collect();
        self.slots = (0..n).map(|_| None).collect();
        Some(socks)
    }

    fn place(&mut self, a: Arriving) {
        let b = a.intro;
        let conn = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        let index = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
        let magic = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
        let peer = a.peer.map_or_else(|| "?".to_string(), |p| p.to_string());
        if magic != INTRO_MAGIC || conn != self.conn_id {
            warn(&format!(
                "refused a connection from {peer}: not for this listener"
            ));
            return;
        }
        match self.slots.get_mut(index) {
            Some(slot @ None) => {
                *slot = Some(Stream {
                    sock: a.sock,
                    sess: a.sess,
                })
            }
            _ => warn(&format!(
                "refused a connection from {peer}: socket position {index} is taken or out of range"
            )),
        }
    }
}

/// Builds one end of an established connection from its sockets (control
/// first), starting the helper threads that own the data sockets.
pub fn assemble(
    sending: bool,
    peer: String,
    mut socks: Vec<Stream>,
    nthreads: usize,
) -> NetResult<Arc<Mutex<Queue>>> {
    let peer: Arc<str> = peer.into();
    let sys = |e: io::Error| NetError::System(format!("connection to {peer}: {e}"));
    let ctrl = socks.remove(0);
    ctrl.sock.set_nonblocking(true).map_err(sys)?;
    let nsocks = socks.len();
    let nthreads = if nsocks == 0 {
        0
    } else {
        nthreads.clamp(1, nsocks)
    };
    // Data socket j goes to thread j % nthreads (see `DataPath::dispatch`).
    let mut owned: Vec<Vec<Stream>> = (0..nthreads).map(|_| Vec::new()).collect();
    for (j, s) in socks.into_iter().enumerate() {
        s.sock.set_nonblocking(false).map_err(sys)?;
        owned[j % nthreads].push(s);
    }
    let workers = owned
        .into_iter()
        .map(|s| Worker::spawn(s, sending, peer.clone()))
        .collect::<io::Result<Vec<_>>>()
        .map_err(sys)?;
    Ok(Arc::new(Mutex::new(Queue::new(
        sending,
        peer.clone(),
        ctrl,
        DataPath::new(workers, nsocks),
    ))))
}

fn post(
    queue: &Arc<Mutex<Queue>>,
    addr: usize,
    size: usize,
    tag: i32,
    prof: Option<NetProf>,
) -> NetResult<Option<Box<dyn Request>>> {
    let mut q = lock(queue)?;
    let alone = q.idle();
    let Some(id) = q.post(addr, size, tag, prof)? else {
        return Ok(None);
    };
    // A send starts moving at once: a small one usually leaves in this call.
    // A failure found now is kept and reported by the request's test. A
    // receive that is the only one waits for its first test: posted ahead of
    // the caller's own send, it is seldom complete yet, and reading now
    // would mostly be an empty system call in front of that send. Behind
    // others it reads at once, so that a caller posting many before
    // testing any still drains the socket (the sender may wait on it).
    if q.sending() || !alone {
        q.progress();
    }
    drop(q);
    Ok(Some(Box::new(SocketRequest {
        queue: queue.clone(),
        id,
        done: None,
    })))
}

/// Dropping an end closes its sockets and joins its helper threads, even
/// while requests are still held: they report the closed connection.
fn close(queue: &Mutex<Queue>) {
    queue.lock().unwrap_or_else(|p| p.into_inner()).close();
}

pub struct SocketSend {
    queue: Arc<Mutex<Queue>>,
}

impl SocketSend {
    pub fn new(queue: Arc<Mutex<Queue>>) -> SocketSend {
        SocketSend { queue }
    }
}

impl Drop for SocketSend {
    fn drop(&mut self) {
        close(&self.queue);
    }
}

pub struct SocketRecv {
    queue: Arc<Mutex<Queue>>,
}

impl SocketRecv {
    pub fn new(queue: Arc<Mutex<Queue>>) -> SocketRecv {
        SocketRecv { queue }
    }
}

impl Drop for SocketRecv {
    fn drop(&mut self) {
        close(&self.queue);
    }
}

impl SendComm for SocketSend {
    fn reg_mr(&mut self, ptr: *mut u8, _size: usize, ptr_type: PtrType) -> NetResult<MrHandle> {
        host_only(ptr_type)?;
        Ok(MrHandle(ptr as usize))
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
        post(&self.queue, data as usize, size, tag, None)
    }
    unsafe fn isend_profiled(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        _mr: Option<MrHandle>,
        prof: Option<NetProf>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        post(&self.queue, data as usize, size, tag, prof)
    }
}

impl RecvComm for SocketRecv {
    fn reg_mr(&mut self, ptr: *mut u8, _size: usize, ptr_type: PtrType) -> NetResult<MrHandle> {
        host_only(ptr_type)?;
        Ok(MrHandle(ptr as usize))
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
        post(&self.queue, data as usize, size, tag, None)
    }
    unsafe fn irecv_profiled(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        _mr: Option<MrHandle>,
        prof: Option<NetProf>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        post(&self.queue, data as usize, size, tag, prof)
    }
}

fn host_only(t: PtrType) -> NetResult<()> {
    if t != PtrType::Host {
        return Err(NetError::InvalidArgument(format!(
            "the socket network moves host memory only, not {t:?}"
        )));
    }
    Ok(())
}
