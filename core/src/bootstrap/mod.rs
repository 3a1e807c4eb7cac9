//! Bootstrap: the unique id, the root, the exchange of listen addresses,
//! and the small out-of-band messages ranks send each other (connection
//! handles, split colors, failure notices, progress queries).
//!
//! `proto` holds the protocol without sockets; this file drives it over TCP.
//! Each rank runs a service thread that accepts peers' connections and
//! files their frames into a mailbox keyed by (sender, tag), so messages
//! may arrive in any order.

pub mod proto;

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxccl_netif::Family;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::error::{Error, Result};
use proto::{Frame, Hello, IdContents, Root, RootAction, FRAME_HEADER};

/// NCCL's `ncclUniqueId`: 128 opaque bytes holding the root's address and a
/// random magic.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match IdContents::decode(&self.0) {
            Some(c) => write!(f, "UniqueId(root {})", c.root),
            None => write!(f, "UniqueId(?)"),
        }
    }
}

/// Tags at and above this are the bootstrap's own.
const TAG_RESERVED: u64 = 1 << 62;
const TAG_ALLGATHER: u64 = TAG_RESERVED;
const TAG_REPLY: u64 = TAG_RESERVED | (1 << 61);

fn family(cfg: &Config) -> Result<Family> {
    Family::parse(cfg.socket_family.as_deref()).map_err(|e| Error::InvalidArgument(e.to_string()))
}

fn netif_err(e: oxccl_netif::NetifError) -> Error {
    match e {
        oxccl_netif::NetifError::System(m) => Error::System(m),
        other => Error::InvalidArgument(other.to_string()),
    }
}

/// Creates a unique id (and, unless `NCCL_COMM_ID` is set, starts the root
/// in this process).
pub fn get_unique_id(cfg: &Config) -> Result<UniqueId> {
    if let Some(s) = cfg.comm_id.as_deref() {
        let root = oxccl_netif::parse_socket_addr(s)
            .map_err(|e| Error::InvalidArgument(format!("NCCL_COMM_ID: {e}")))?;
        // Every rank computes the same id from the same setting.
        let magic = s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        info!(target: "oxccl::bootstrap", "NCCL_COMM_ID set to {s}: rank 0 hosts the root at {root}");
        return Ok(UniqueId(
            IdContents {
                from_env: true,
                magic,
                root,
            }
            .encode(),
        ));
    }
    let iface = oxccl_netif::find_interfaces(cfg.socket_ifname.as_deref(), family(cfg)?, 1)
        .map_err(netif_err)?
        .remove(0);
    let listener = TcpListener::bind(SocketAddr::new(iface.addr, 0)).map_err(|e| {
        Error::io(
            format!(
                "bootstrap root: cannot listen on {} ({})",
                iface.name, iface.addr
            ),
            e,
        )
    })?;
    let root = listener
        .local_addr()
        .map_err(|e| Error::io("bootstrap root", e))?;
    let magic: u64 = rand::random();
    start_root(listener, magic, cfg.timeout())?;
    Ok(UniqueId(
        IdContents {
            from_env: false,
            magic,
            root,
        }
        .encode(),
    ))
}

fn start_root(listener: TcpListener, magic: u64, timeout: Duration) -> Result<()> {
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("bootstrap root", e))?;
    std::thread::Builder::new()
        .name("oxccl-root".into())
        .spawn(move || root_loop(listener, magic, timeout))
        .map_err(|e| Error::System(format!("cannot start the bootstrap root thread: {e}")))?;
    Ok(())
}

fn write_frame(s: &mut TcpStream, f: &Frame) -> std::io::Result<()> {
    s.write_all(&f.encode())
}

/// Reads one frame; `None` payload length beyond the limit is an error.
fn read_frame(s: &mut TcpStream) -> std::io::Result<Frame> {
    let mut h = [0u8; FRAME_HEADER];
    s.read_exact(&mut h)?;
    let (mut f, len) = Frame::decode_header(&h);
    if len > proto::MAX_PAYLOAD {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("frame of {len} bytes"),
        ));
    }
    f.payload = vec![0u8; len];
    s.read_exact(&mut f.payload)?;
    Ok(f)
}

fn root_loop(listener: TcpListener, magic: u64, timeout: Duration) {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let start = Instant::now();
    let mut root = Root::default();
    let mut conns: Vec<Option<TcpStream>> = Vec::new();
    let reply = |s: &mut TcpStream, kind: u8, payload: Vec<u8>| {
        let _ = write_frame(
            s,
            &Frame {
                magic,
                kind,
                from: u32::MAX,
                tag: 0,
                payload,
            },
        );
    };
    loop {
        match listener.accept() {
            Ok((mut s, peer)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let f = match read_frame(&mut s) {
                    Ok(f) if f.magic == magic && f.kind == proto::HELLO => f,
                    Ok(_) => {
                        warn!(target: "oxccl::bootstrap", "root {addr}: refused a connection from {peer}: wrong magic or not a hello (another job, or a stray client)");
                        continue;
                    }
                    Err(e) => {
                        warn!(target: "oxccl::bootstrap", "root {addr}: refused a connection from {peer}: {e}");
                        continue;
                    }
                };
                let Some(h) = Hello::decode(f.from, &f.payload) else {
                    warn!(target: "oxccl::bootstrap", "root {addr}: refused a malformed hello from {peer}");
                    continue;
                };
                conns.push(Some(s));
                let conn = conns.len() - 1;
                match root.hello(conn, &h) {
                    None => {}
                    Some(RootAction::Refuse { conn, message }) => {
                        warn!(target: "oxccl::bootstrap", "root {addr}: {message}");
                        if let Some(mut s) = conns[conn].take() {
                            reply(&mut s, proto::ERROR, message.into_bytes());
                        }
                    }
                    Some(RootAction::Table(t)) => {
                        let payload = proto::encode_table(&t);
                        for s in conns.iter_mut().flatten() {
                            reply(s, proto::TABLE, payload.clone());
                        }
                        debug!(target: "oxccl::bootstrap", "root {addr}: {} ranks joined", t.len());
                        return;
                    }
                    Some(RootAction::Fail(m)) => {
                        for s in conns.iter_mut().flatten() {
                            reply(s, proto::ERROR, m.clone().into_bytes());
                        }
                        return;
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => {
                warn!(target: "oxccl::bootstrap", "root {addr}: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if start.elapsed() > timeout {
            if let RootAction::Fail(m) = root.deadline(
                listener
                    .local_addr()
                    .unwrap_or_else(|_| ([0, 0, 0, 0], 0).into()),
                timeout.as_secs_f64(),
            ) {
                warn!(target: "oxccl::bootstrap", "{m}");
                for s in conns.iter_mut().flatten() {
                    reply(s, proto::ERROR, m.clone().into_bytes());
                }
            }
            return;
        }
    }
}

/// What one rank reports about its progress when a peer asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerProgress {
    /// The peer answered: number of operations it has started.
    Started(u64),
    /// The peer did not answer in time or refused the connection.
    Unreachable,
}

#[derive(Default)]
struct Mail {
    msgs: HashMap<(usize, u64), VecDeque<Vec<u8>>>,
    failure: Option<(usize, String)>,
}

/// State shared with the service and reader threads.
struct Inner {
    rank: usize,
    magic: u64,
    peers: Vec<SocketAddr>,
    out: Vec<Mutex<Option<TcpStream>>>,
    mail: Mutex<Mail>,
    cv: Condvar,
    closed: AtomicBool,
    progress: Arc<AtomicU64>,
    /// Accepted streams, shut down on close to end their readers.
    accepted: Mutex<Vec<TcpStream>>,
}

impl Inner {
    fn lock_mail(&self) -> std::sync::MutexGuard<'_, Mail> {
        self.mail.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, from: usize, tag: u64, payload: Vec<u8>) {
        self.lock_mail()
            .msgs
            .entry((from, tag))
            .or_default()
            .push_back(payload);
        self.cv.notify_all();
    }

    /// Sends one frame to `peer` over the cached connection, reconnecting once.
    fn send_frame(
        &self,
        peer: usize,
        kind: u8,
        tag: u64,
        payload: &[u8],
        connect_timeout: Duration,
    ) -> Result<()> {
        let f = Frame {
            magic: self.magic,
            kind,
            from: self.rank as u32,
            tag,
            payload: payload.to_vec(),
        };
        let mut slot = self.out[peer].lock().unwrap_or_else(|p| p.into_inner());
        for attempt in 0..2 {
            if slot.is_none() {
                let s = TcpStream::connect_timeout(&self.peers[peer], connect_timeout).map_err(
                    |e| {
                        Error::Remote(format!(
                            "bootstrap: cannot reach rank {peer} at {}: {e}",
                            self.peers[peer]
                        ))
                    },
                )?;
                let _ = s.set_nodelay(true);
                *slot = Some(s);
            }
            match write_frame(slot.as_mut().expect("connected"), &f) {
                Ok(()) => return Ok(()),
                Err(e) if attempt == 0 => {
                    debug!(target: "oxccl::bootstrap", "rank {}: resending to rank {peer} after {e}", self.rank);
                    *slot = None;
                }
                Err(e) => {
                    return Err(Error::Remote(format!(
                        "bootstrap: sending to rank {peer} failed: {e}"
                    )))
                }
            }
        }
        unreachable!("the loop returns")
    }

    fn serve(self: &Arc<Inner>, listener: TcpListener) {
        let _ = listener.set_nonblocking(true);
        while !self.closed.load(Ordering::Acquire) {
            match listener.accept() {
                Ok((s, peer)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_nodelay(true);
                    if let Ok(c) = s.try_clone() {
                        self.accepted
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(c);
                    }
                    let me = self.clone();
                    let _ = std::thread::Builder::new()
                        .name("oxccl-bootstrap-rx".into())
                        .spawn(move || me.read_from(s, peer));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    fn read_from(self: Arc<Inner>, mut s: TcpStream, peer: SocketAddr) {
        while let Ok(f) = read_frame(&mut s) {
            if f.magic != self.magic {
                warn!(target: "oxccl::bootstrap", "rank {}: refused a connection from {peer}: wrong magic (another job or a stray client)", self.rank);
                return;
            }
            let from = f.from as usize;
            if from >= self.peers.len() {
                warn!(target: "oxccl::bootstrap", "rank {}: refused a frame from {peer} claiming to be rank {from}", self.rank);
                return;
            }
            match f.kind {
                proto::DATA => self.deliver(from, f.tag, f.payload),
                proto::REPLY => self.deliver(from, TAG_REPLY | f.tag, f.payload),
                proto::ABORT => {
                    let msg = String::from_utf8_lossy(&f.payload).into_owned();
                    self.lock_mail().failure.get_or_insert((from, msg));
                    self.cv.notify_all();
                }
                proto::QUERY => {
                    let n = self.progress.load(Ordering::SeqCst).to_le_bytes();
                    let _ = self.send_frame(from, proto::REPLY, f.tag, &n, Duration::from_secs(1));
                }
                other => {
                    warn!(target: "oxccl::bootstrap", "rank {}: unexpected frame kind {other} from rank {from}", self.rank);
                }
            }
        }
    }
}

/// A rank's bootstrap endpoint within one communicator.
pub struct Bootstrap {
    nranks: usize,
    inner: Arc<Inner>,
    timeout: Duration,
    epoch: AtomicU64,
    queries: AtomicU64,
    service: Mutex<Option<JoinHandle<()>>>,
}

impl Bootstrap {
    /// Joins the communicator described by `id`: reaches the root, learns
    /// every rank's address, and starts serving peers.
    pub fn init(id: &UniqueId, rank: usize, nranks: usize, cfg: &Config) -> Result<Bootstrap> {
        if rank >= nranks {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is out of range: nranks is {nranks}"
            )));
        }
        let c = IdContents::decode(&id.0).ok_or_else(|| {
            Error::InvalidArgument(
                "the unique id was not made by oxccl's get_unique_id (bad version)".into(),
            )
        })?;
        let timeout = cfg.timeout();
        if c.from_env && rank == 0 {
            let l = TcpListener::bind(c.root).map_err(|e| {
                Error::io(
                    format!("NCCL_COMM_ID: rank 0 cannot host the root at {}", c.root),
                    e,
                )
            })?;
            start_root(l, c.magic, timeout)?;
        }
        let fam = family(cfg)?;
        let iface = match cfg.socket_ifname.as_deref() {
            Some(s) => oxccl_netif::find_interfaces(Some(s), fam, 1)
                .map_err(netif_err)?
                .remove(0),
            None => match oxccl_netif::find_for_remote(c.root.ip(), fam).map_err(netif_err)? {
                Some(i) => i,
                None => oxccl_netif::find_interfaces(None, fam, 1)
                    .map_err(netif_err)?
                    .remove(0),
            },
        };
        let listener = TcpListener::bind(SocketAddr::new(iface.addr, 0)).map_err(|e| {
            Error::io(
                format!(
                    "bootstrap: cannot listen on {} ({})",
                    iface.name, iface.addr
                ),
                e,
            )
        })?;
        let me = listener
            .local_addr()
            .map_err(|e| Error::io("bootstrap", e))?;
        let peers = Self::join_root(&c, rank, nranks, me, timeout)?;
        let inner = Arc::new(Inner {
            rank,
            magic: c.magic,
            out: (0..nranks).map(|_| Mutex::new(None)).collect(),
            peers,
            mail: Mutex::default(),
            cv: Condvar::new(),
            closed: AtomicBool::new(false),
            progress: Arc::default(),
            accepted: Mutex::default(),
        });
        let svc = inner.clone();
        let service = std::thread::Builder::new()
            .name(format!("oxccl-bootstrap-{rank}"))
            .spawn(move || svc.serve(listener))
            .map_err(|e| {
                Error::System(format!("cannot start the bootstrap service thread: {e}"))
            })?;
        debug!(target: "oxccl::bootstrap", rank, nranks, "bootstrap ready on {} ({})", iface.name, me);
        Ok(Bootstrap {
            nranks,
            inner,
            timeout,
            epoch: AtomicU64::new(0),
            queries: AtomicU64::new(0),
            service: Mutex::new(Some(service)),
        })
    }

    /// Says hello to the root (retrying while it is not up yet) and reads
    /// the address table or the root's error.
    fn join_root(
        c: &IdContents,
        rank: usize,
        nranks: usize,
        me: SocketAddr,
        timeout: Duration,
    ) -> Result<Vec<SocketAddr>> {
        let start = Instant::now();
        let mut s = loop {
            match TcpStream::connect_timeout(&c.root, Duration::from_secs(1)) {
                Ok(s) => break s,
                Err(e) if start.elapsed() < timeout => {
                    debug!(target: "oxccl::bootstrap", "rank {rank}: root {} not reachable yet: {e}", c.root);
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(Error::Remote(format!(
                        "bootstrap: rank {rank} could not reach the root at {} within {:.0} s: {e}",
                        c.root,
                        timeout.as_secs_f64()
                    )))
                }
            }
        };
        let hello = Hello {
            rank,
            nranks,
            listen: me,
        };
        write_frame(
            &mut s,
            &Frame {
                magic: c.magic,
                kind: proto::HELLO,
                from: rank as u32,
                tag: 0,
                payload: hello.encode(),
            },
        )
        .map_err(|e| Error::io(format!("bootstrap: writing to the root at {}", c.root), e))?;
        // The root answers when every rank has arrived, or at its deadline.
        let _ = s.set_read_timeout(Some(timeout + Duration::from_secs(2)));
        let f = read_frame(&mut s).map_err(|e| {
            Error::Remote(format!(
                "bootstrap: rank {rank} got no answer from the root at {} within {:.0} s: {e}",
                c.root,
                timeout.as_secs_f64()
            ))
        })?;
        match f.kind {
            proto::TABLE => proto::decode_table(&f.payload)
                .filter(|t| t.len() == nranks)
                .ok_or_else(|| {
                    Error::Internal("bootstrap: malformed address table from the root".into())
                }),
            proto::ERROR => Err(Error::Remote(
                String::from_utf8_lossy(&f.payload).into_owned(),
            )),
            k => Err(Error::Internal(format!(
                "bootstrap: unexpected frame kind {k} from the root"
            ))),
        }
    }

    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Sends `data` to `peer` under `tag` (tags at or above 2^62 are reserved).
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        if peer >= self.nranks {
            return Err(Error::InvalidArgument(format!(
                "bootstrap send: peer {peer} out of range"
            )));
        }
        if peer == self.inner.rank {
            self.inner.deliver(peer, tag, data.to_vec());
            return Ok(());
        }
        self.inner.send_frame(
            peer,
            proto::DATA,
            tag,
            data,
            self.timeout.min(Duration::from_secs(10)),
        )
    }

    /// Waits for the next message from `peer` under `tag`.
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        let start = Instant::now();
        let mut mail = self.inner.lock_mail();
        loop {
            if let Some(m) = mail.msgs.get_mut(&(peer, tag)).and_then(|q| q.pop_front()) {
                return Ok(m);
            }
            if let Some((who, msg)) = &mail.failure {
                return Err(Error::Remote(format!("rank {who} failed: {msg}")));
            }
            if self.inner.closed.load(Ordering::Acquire) {
                return Err(Error::InvalidUsage(
                    "the communicator was closed while waiting for a bootstrap message".into(),
                ));
            }
            let left = self.timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::Remote(format!(
                    "bootstrap: rank {} waited {:.1} s (NCCL_TIMEOUT) for a message from rank {peer} (tag {tag:#x}): rank {peer} is dead, stuck, or not calling the same operation",
                    self.inner.rank,
                    self.timeout.as_secs_f64()
                )));
            }
            mail = self
                .inner
                .cv
                .wait_timeout(mail, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Every rank's `mine`, indexed by rank.
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let tag = TAG_ALLGATHER | (self.epoch.fetch_add(1, Ordering::SeqCst) & ((1 << 60) - 1));
        for p in (0..self.nranks).filter(|&p| p != self.inner.rank) {
            self.send(p, tag, mine)?;
        }
        (0..self.nranks)
            .map(|p| {
                if p == self.inner.rank {
                    Ok(mine.to_vec())
                } else {
                    self.recv(p, tag)
                }
            })
            .collect()
    }

    pub fn barrier(&self) -> Result<()> {
        self.allgather(&[]).map(|_| ())
    }

    /// The counter of operations started, which peers read on a timeout.
    pub fn progress(&self) -> &Arc<AtomicU64> {
        &self.inner.progress
    }

    /// Asks every rank how many operations it has started (indexed by rank).
    pub fn query_progress(&self) -> Vec<PeerProgress> {
        let q = self.queries.fetch_add(1, Ordering::SeqCst) & ((1 << 60) - 1);
        let wait = self.timeout.min(Duration::from_secs(2));
        let mut asked = vec![false; self.nranks];
        for (p, a) in asked
            .iter_mut()
            .enumerate()
            .filter(|(p, _)| *p != self.inner.rank)
        {
            *a = self.inner.send_frame(p, proto::QUERY, q, &[], wait).is_ok();
        }
        let start = Instant::now();
        let mut out = vec![PeerProgress::Unreachable; self.nranks];
        out[self.inner.rank] = PeerProgress::Started(self.inner.progress.load(Ordering::SeqCst));
        let mut mail = self.inner.lock_mail();
        loop {
            for p in 0..self.nranks {
                if !asked[p] || out[p] != PeerProgress::Unreachable {
                    continue;
                }
                if let Some(m) = mail
                    .msgs
                    .get_mut(&(p, TAG_REPLY | q))
                    .and_then(|x| x.pop_front())
                {
                    out[p] = PeerProgress::Started(u64::from_le_bytes(
                        m.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]),
                    ));
                }
            }
            let pending = (0..self.nranks).any(|p| asked[p] && out[p] == PeerProgress::Unreachable);
            if !pending || start.elapsed() >= wait {
                return out;
            }
            mail = self
                .inner
                .cv
                .wait_timeout(mail, Duration::from_millis(20))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Tells every other rank that this one failed; best effort, bounded to
    /// about two seconds.
    pub fn broadcast_failure(&self, message: &str) {
        let start = Instant::now();
        for p in (0..self.nranks).filter(|&p| p != self.inner.rank) {
            if start.elapsed() > Duration::from_secs(2) {
                break;
            }
            let _ = self.inner.send_frame(
                p,
                proto::ABORT,
                0,
                message.as_bytes(),
                Duration::from_millis(300),
            );
        }
    }

    /// The first failure another rank reported: (rank, message).
    pub fn remote_failure(&self) -> Option<(usize, String)> {
        self.inner.lock_mail().failure.clone()
    }

    /// Stops the service thread and closes every connection; blocked
    /// `recv`s return an error. Idempotent.
    pub fn close(&self) {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.cv.notify_all();
        for s in self
            .inner
            .accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for o in &self.inner.out {
            if let Some(s) = o.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        if let Some(h) = self
            .service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = h.join();
        }
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests;
