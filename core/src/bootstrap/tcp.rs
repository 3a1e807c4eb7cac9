//! Socket helpers of the bootstrap: writing and reading frames, connecting
//! with retries, the cached connections to peers, the one-shot connections
//! of progress queries and failure notices, and the encrypted link every
//! connection becomes when NCCL_SOCKET_KEY_FILE is set.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use oxccl_secure::{Key, Role, SecureError, SecureStream, Session};
use tracing::debug;

use super::calls::CALL_BYTES;
use super::proto::{self, Frame, FrameReader};
use crate::error::{Error, Result};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The bootstrap's key, shared by its threads.
pub(super) type SharedKey = Option<Arc<Key>>;

/// Binds a session to the bootstrap and to one communicator: a connection
/// of the socket network or of another job cannot be passed off as ours.
pub(super) fn prologue(magic: u64) -> Vec<u8> {
    let mut p = b"oxccl bootstrap v1".to_vec();
    p.extend_from_slice(&magic.to_le_bytes());
    p
}

/// A bootstrap connection: in clear, or authenticated and encrypted.
pub(super) enum Link {
    Plain(TcpStream),
    Secure(Box<SecureStream<TcpStream>>),
}

impl Link {
    /// The socket, for timeouts and shutdown.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Link::Plain(s) => s,
            Link::Secure(s) => s.get_ref(),
        }
    }

    /// Runs the handshake on a fresh connection (when there is a key), as
    /// the side that connected (`Role::Initiator`) or accepted, bounded by
    /// `wait`; the socket's read timeout is cleared afterwards.
    pub fn open(
        s: TcpStream,
        key: Option<&Key>,
        role: Role,
        magic: u64,
        wait: Duration,
    ) -> Result<Link, SecureError> {
        let Some(key) = key else {
            return Ok(Link::Plain(s));
        };
        let mut s = s;
        let mut sess = Session::new(role, key, &prologue(magic))?;
        // One deadline for the whole exchange: a peer that trickles its
        // bytes cannot hold this thread past it.
        sess.handshake_until(&mut s, Instant::now() + wait, |s, left| {
            s.set_read_timeout(Some(left))?;
            s.set_write_timeout(Some(left))
        })?;
        s.set_read_timeout(None)?;
        s.set_write_timeout(Some(wait))?;
        Ok(Link::Secure(Box::new(SecureStream::from_parts(s, sess))))
    }
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Link::Plain(s) => s.read(buf),
            Link::Secure(s) => s.read(buf),
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Link::Plain(s) => s.write(buf),
            Link::Secure(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Link::Plain(s) => s.flush(),
            Link::Secure(s) => s.flush(),
        }
    }
}

/// Writes one message as frames of at most [`proto::MAX_CHUNK`] bytes
/// (`MORE` set on all but the last).
pub(super) fn write_message(
    s: &mut impl Write,
    magic: u64,
    kind: u8,
    from: u32,
    tag: u64,
    payload: &[u8],
) -> std::io::Result<()> {
    for (more, piece) in proto::chunks(payload, proto::MAX_CHUNK) {
        let k = if more { kind | proto::MORE } else { kind };
        let mut b = Vec::with_capacity(proto::FRAME_HEADER + piece.len());
        b.extend_from_slice(&proto::encode_header(magic, k, from, tag, piece.len()));
        b.extend_from_slice(piece);
        s.write_all(&b)?;
    }
    Ok(())
}

/// Reads until `r` yields a frame; `None` at a clean end of stream.
pub(super) fn read_frame(s: &mut impl Read, r: &mut FrameReader) -> std::io::Result<Option<Frame>> {
    let mut buf = [0u8; 16 << 10];
    loop {
        if let Some(f) = r
            .next_frame()
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e.to_string()))?
        {
            return Ok(Some(f));
        }
        match s.read(&mut buf) {
            Ok(0) if r.is_empty() => return Ok(None),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => r.push(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Connects to `addr`, retrying while it refuses or times out, until
/// `deadline`: with backoff (10 ms doubling to 500 ms), or NCCL's way where
/// NCCL_SOCKET_RETRY_CNT or _SLEEP_MSEC is set (`nccl`: the n-th failure
/// waits n x the sleep, and the count ends the retries).
pub(super) fn connect_retry(
    addr: SocketAddr,
    deadline: Instant,
    nccl: Option<oxccl_netif::Retry>,
) -> std::io::Result<TcpStream> {
    let mut backoff = Duration::from_millis(10);
    let mut failures = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = match TcpStream::connect_timeout(
            &addr,
            left.clamp(Duration::from_millis(1), Duration::from_secs(5)),
        ) {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        if let Some(r) = nccl {
            failures += 1;
            let transient = matches!(
                e.kind(),
                ErrorKind::ConnectionRefused | ErrorKind::TimedOut | ErrorKind::HostUnreachable
            );
            let Some(wait) = r.wait_after(failures).filter(|_| transient) else {
                return Err(if transient {
                    std::io::Error::new(
                        e.kind(),
                        format!(
                            "{e}; gave up after {} retries (NCCL_SOCKET_RETRY_CNT)",
                            r.count
                        ),
                    )
                } else {
                    e
                });
            };
            if Instant::now() + wait >= deadline {
                return Err(e);
            }
            debug!(target: "oxccl::bootstrap", "{addr} not reachable yet ({e}); retry {failures}/{} in {wait:?}", r.count);
            std::thread::sleep(wait);
            continue;
        }
        if Instant::now() + backoff >= deadline {
            return Err(e);
        }
        debug!(target: "oxccl::bootstrap", "{addr} not reachable yet ({e}); retrying in {backoff:?}");
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// Connects to `addr` from the address `local` (port chosen by the
/// system), within `wait`: a rank's connections leave by the address it
/// listens on, which is how a peer without a key tells it from a stranger
/// (see `limits`). Unbound where `local` is of the other family or cannot
/// be bound.
pub(super) fn connect_from(
    local: Option<IpAddr>,
    addr: SocketAddr,
    wait: Duration,
) -> std::io::Result<TcpStream> {
    if let Some(ip) = local.filter(|ip| ip.is_ipv4() == addr.is_ipv4()) {
        let s = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        if s.bind(&SocketAddr::new(ip, 0).into()).is_ok() {
            s.connect_timeout(&addr.into(), wait)?;
            return Ok(s.into());
        }
    }
    TcpStream::connect_timeout(&addr, wait)
}

/// One frame on a fresh connection from `local`, every step bounded by
/// `deadline`; returns the connection (to read an answer from, or to close).
pub(super) fn one_shot(
    local: Option<IpAddr>,
    addr: SocketAddr,
    key: Option<&Key>,
    frame: &Frame,
    deadline: Instant,
) -> std::io::Result<Link> {
    let left = || {
        let l = deadline.saturating_duration_since(Instant::now());
        if l.is_zero() {
            Err(std::io::Error::from(ErrorKind::TimedOut))
        } else {
            Ok(l)
        }
    };
    let s = connect_from(local, addr, left()?)?;
    let _ = s.set_nodelay(true);
    let mut s = Link::open(s, key, Role::Initiator, frame.magic, left()?)?;
    s.tcp().set_write_timeout(Some(left()?))?;
    s.write_all(&frame.encode())?;
    Ok(s)
}

/// Waits until the other end closes `s` (it read all it wanted), an error,
/// or `deadline`; anything it sends meanwhile is dropped.
pub(super) fn wait_closed(s: &TcpStream, deadline: Instant) {
    let mut sink = [0u8; 64];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match (&mut &*s).read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Asks the rank at `addr` for its progress counter, and with `call` for
/// what it called under that collective number (`None` where it does not
/// know it); `None` if it does not answer by `deadline`.
pub(super) fn query(
    local: Option<IpAddr>,
    addr: SocketAddr,
    key: Option<&Key>,
    magic: u64,
    me: u32,
    call: Option<u64>,
    deadline: Instant,
) -> Option<(u64, Option<[u8; CALL_BYTES]>)> {
    let q = Frame {
        magic,
        kind: proto::QUERY,
        from: me,
        tag: 0,
        payload: call.map(|s| s.to_le_bytes().to_vec()).unwrap_or_default(),
    };
    let mut s = one_shot(local, addr, key, &q, deadline).ok()?;
    let left = deadline.saturating_duration_since(Instant::now());
    s.tcp()
        .set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .ok()?;
    let f = read_frame(&mut s, &mut FrameReader::new(magic, 8 + CALL_BYTES)).ok()??;
    let _ = s.tcp().shutdown(Shutdown::Both);
    if f.kind != proto::PROGRESS || f.payload.len() < 8 {
        return None;
    }
    let (n, rest) = f.payload.split_at(8);
    let n = u64::from_le_bytes(n.try_into().ok()?);
    Some((n, rest.try_into().ok()))
}

/// Asks the rank at `addr` which rank it knows nearest before `target`
/// ([`proto::LOOKUP`]); its answer (rank, address), or `None` if it does
/// not give one by `deadline`.
pub(super) fn lookup(
    local: Option<IpAddr>,
    addr: SocketAddr,
    key: Option<&Key>,
    magic: u64,
    me: u32,
    target: usize,
    deadline: Instant,
) -> Option<(usize, SocketAddr)> {
    let q = Frame {
        magic,
        kind: proto::LOOKUP,
        from: me,
        tag: 0,
        payload: (target as u32).to_le_bytes().to_vec(),
    };
    let mut s = one_shot(local, addr, key, &q, deadline).ok()?;
    let left = deadline.saturating_duration_since(Instant::now());
    s.tcp()
        .set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .ok()?;
    let f = read_frame(&mut s, &mut FrameReader::new(magic, 4 + proto::ADDR_BYTES)).ok()??;
    let _ = s.tcp().shutdown(Shutdown::Both);
    if f.kind != proto::ADDRS {
        return None;
    }
    match proto::decode_entries(&f.payload)?[..] {
        [one] => Some(one),
        _ => None,
    }
}

/// The connections this rank opened to its peers: made on first use,
/// cached, one lock per peer (a message is written whole under it).
pub(super) struct Outgoing {
    me: u32,
    magic: u64,
    key: SharedKey,
    pub addrs: Vec<SocketAddr>,
    slots: Vec<Mutex<Option<Link>>>,
    /// Clones of the cached streams, so that `close` can shut them down
    /// while a sender holds the slot's lock.
    clones: Vec<Mutex<Option<TcpStream>>>,
    closed: AtomicBool,
}

impl Outgoing {
    pub fn new(me: usize, magic: u64, key: SharedKey, addrs: Vec<SocketAddr>) -> Outgoing {
        Outgoing {
            me: me as u32,
            magic,
            key,
            slots: addrs.iter().map(|_| Mutex::new(None)).collect(),
            clones: addrs.iter().map(|_| Mutex::new(None)).collect(),
            addrs,
            closed: AtomicBool::new(false),
        }
    }

    /// The address this rank listens on, which its connections leave by.
    pub fn local(&self) -> Option<IpAddr> {
        self.addrs.get(self.me as usize).map(SocketAddr::ip)
    }

    /// Sends one message to `peer`. A cached connection that fails is
    /// replaced once (a peer drops connections only when it closes, so a
    /// failure on a fresh one is the answer).
    pub fn send(&self, peer: usize, tag: u64, payload: &[u8], timeout: Duration) -> Result<()> {
        self.send_to(peer, self.addrs[peer], tag, payload, timeout)
    }

    /// [`Outgoing::send`] to `peer` at `addr` (for a peer whose address
    /// was learned after this was made; a cached connection is used as
    /// it is).
    pub fn send_to(
        &self,
        peer: usize,
        addr: SocketAddr,
        tag: u64,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        let mut slot = lock(&self.slots[peer]);
        loop {
            let fresh = slot.is_none();
            if fresh {
                if self.closed.load(Ordering::Acquire) {
                    return Err(Error::InvalidUsage(format!(
                        "bootstrap: rank {} sending to rank {peer} after its communicator was closed",
                        self.me
                    )));
                }
                let s = connect_from(self.local(), addr, timeout).map_err(|e| {
                    Error::Remote(format!(
                        "bootstrap: rank {} cannot reach rank {peer} at {addr}: {e} (rank {peer} died or closed its communicator)",
                        self.me
                    ))
                })?;
                let _ = s.set_nodelay(true);
                *lock(&self.clones[peer]) = s.try_clone().ok();
                let s = Link::open(s, self.key.as_deref(), Role::Initiator, self.magic, timeout)
                    .map_err(|e| {
                        *lock(&self.clones[peer]) = None;
                        Error::Remote(format!(
                            "bootstrap: rank {} cannot open an encrypted connection to rank {peer} at {addr}: {e}",
                            self.me
                        ))
                    })?;
                *slot = Some(s);
            }
            let s = slot.as_mut().expect("connected above");
            let r = s
                .tcp()
                .set_write_timeout(Some(timeout))
                .and_then(|_| write_message(s, self.magic, proto::DATA, self.me, tag, payload));
            let e = match r {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            *slot = None;
            *lock(&self.clones[peer]) = None;
            if !fresh {
                debug!(target: "oxccl::bootstrap", "rank {}: connection to rank {peer} broke ({e}); reconnecting", self.me);
                continue;
            }
            let why = if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                format!(
                    "rank {peer} read nothing for {} (NCCL_TIMEOUT): hung?",
                    proto::secs(timeout)
                )
            } else {
                e.to_string()
            };
            return Err(Error::Remote(format!(
                "bootstrap: rank {} sending {} bytes to rank {peer} at {addr} failed: {why}",
                self.me,
                payload.len()
            )));
        }
    }

    /// Shuts every cached connection down (a sender blocked on one fails)
    /// and refuses new ones.
    pub fn shutdown_all(&self) {
        self.closed.store(true, Ordering::Release);
        for c in &self.clones {
            if let Some(s) = lock(c).take() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}
