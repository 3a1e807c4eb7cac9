//! A rank's incoming side. The service thread accepts peers' connections;
//! one reader thread per connection files messages into the rank's inbox
//! (`super::inbox`, keyed by sender and tag, so that they may arrive in any
//! order), records failure notices, and answers progress queries on the
//! connection they came on. What a peer may hold here (connections, bytes,
//! time) is capped as `limits` says.

use std::io::{ErrorKind, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::limits::{self};
use super::proto::{self, Frame, FrameReader, Reassembler};
use super::tcp::{lock, Link};
use crate::error::{Error, Result};

use super::inbox::Shared;

/// The service thread of one rank, and how to stop it.
pub(super) struct Service {
    shared: Arc<Shared>,
    pub listen: SocketAddr,
    /// A clone of the listening socket, to wake `accept` at close.
    listener: TcpListener,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Service {
    pub fn start(shared: Arc<Shared>, listener: TcpListener) -> Result<Service> {
        let listen = listener
            .local_addr()
            .map_err(|e| Error::io("bootstrap listener", e))?;
        let clone = listener
            .try_clone()
            .map_err(|e| Error::io("bootstrap listener", e))?;
        let sh = shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("oxccl-bootstrap-{}", shared.rank))
            .spawn(move || accept_loop(sh, listener))
            .map_err(|e| {
                Error::System(format!("cannot start the bootstrap service thread: {e}"))
            })?;
        Ok(Service {
            shared,
            listen,
            listener: clone,
            handle: Mutex::new(Some(handle)),
        })
    }

    /// Stops accepting, wakes every waiter with an error, closes every
    /// accepted connection and joins the threads. Idempotent.
    pub fn stop(&self) {
        let Some(h) = lock(&self.handle).take() else {
            return;
        };
        self.shared.close();
        // Linux wakes a blocked accept() when its socket is shut down; the
        // connection to ourselves wakes it elsewhere.
        let _ = socket2::SockRef::from(&self.listener).shutdown(Shutdown::Both);
        if !h.is_finished() {
            let _ = TcpStream::connect_timeout(&self.listen, Duration::from_millis(200));
        }
        let start = Instant::now();
        while !h.is_finished() && start.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if h.is_finished() {
            let _ = h.join();
        } else {
            warn!(target: "oxccl::bootstrap", "rank {}: the bootstrap service thread did not stop; leaving it blocked in accept", self.shared.rank);
        }
        self.shared.stop_readers();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let r = listener.accept();
        if shared.is_closed() {
            return;
        }
        match r {
            Ok((s, peer)) => {
                shared.prune_readers();
                if let Err(full) = lock(&shared.admission).admit(peer.ip()) {
                    let line = format!(
                        "rank {}: closed a connection from {peer}: its address holds {} connections, at most {} (4 per rank listening there, 4 more); {} refused so far",
                        shared.rank, full.open, full.cap, full.refused
                    );
                    if limits::warn_at(full.refused) {
                        warn!(target: "oxccl::bootstrap", "{line}");
                    } else {
                        debug!(target: "oxccl::bootstrap", "{line}");
                    }
                    let _ = s.shutdown(Shutdown::Both);
                    continue;
                }
                let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
                let _ = s.set_nodelay(true);
                let Ok(clone) = s.try_clone() else {
                    warn!(target: "oxccl::bootstrap", "rank {}: dropped a connection from {peer}: cannot clone its socket", shared.rank);
                    shared.leave(peer.ip(), conn);
                    continue;
                };
                let sh = shared.clone();
                match std::thread::Builder::new()
                    .name(format!("oxccl-bootstrap-rx-{}", shared.rank))
                    .spawn(move || {
                        let end = s.try_clone();
                        accept_one(&sh, s, peer, conn);
                        // Its clone in `readers` keeps the socket open: end it here.
                        if let Ok(s) = end {
                            let _ = s.shutdown(Shutdown::Both);
                        }
                        sh.leave(peer.ip(), conn);
                    }) {
                    Ok(h) => lock(&shared.readers).push((clone, h)),
                    Err(e) => {
                        warn!(target: "oxccl::bootstrap", "rank {}: dropped a connection from {peer}: no reader thread: {e}", shared.rank);
                        shared.leave(peer.ip(), conn);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin.
                debug!(target: "oxccl::bootstrap", "rank {}: accept failed: {e}", shared.rank);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// How a connection ended, for its log line.
enum Stop {
    /// Nothing worth a warning (a peer gone, this rank closing).
    Quiet(String),
    /// Refused: a warning naming the peer.
    Refused(String),
    /// What an authenticated rank sent was refused: what it sent after is
    /// lost, so the rank counts as failed (waiting for it would only end at
    /// the timeout).
    Broken(String),
}

/// One accepted connection as its reader sees it.
struct Conn<'a> {
    shared: &'a Shared,
    link: Link,
    peer: SocketAddr,
    id: u64,
    reader: FrameReader,
    pieces: Reassembler,
    sender: Option<u32>,
    /// Bytes of `reader` and `pieces` counted in `Shared::in_flight`.
    counted: usize,
    /// When the message (or non-DATA frame) being read began.
    begun: Option<Instant>,
    /// Holds its address's slot (see `limits`).
    slot: bool,
}

impl Conn<'_> {
    fn keyed(&self) -> bool {
        matches!(self.link, Link::Secure(_))
    }

    /// Brings `Shared::in_flight` up to date with what this connection holds.
    fn recount(&mut self) {
        let now = self.reader.held() + self.pieces.held();
        let f = &self.shared.in_flight;
        if now >= self.counted {
            f.fetch_add(now - self.counted, Ordering::SeqCst);
        } else {
            f.fetch_sub(self.counted - now, Ordering::SeqCst);
        }
        self.counted = now;
    }

    /// When the next read must have brought something: within the first
    /// wait, and by the deadline of the message begun.
    fn progress_deadline(&self) -> Instant {
        let sh = self.shared;
        let next = Instant::now() + sh.first_wait;
        match self.begun {
            Some(t) => next.min(limits::message_deadline(
                t,
                sh.first_wait,
                self.reader.held() + self.pieces.pending(),
            )),
            None => next,
        }
    }

    /// One read into the reader, waiting until `until` (`None`: without
    /// limit); the bytes read, 0 at the end of the stream.
    fn fill(&mut self, until: Option<Instant>) -> std::io::Result<usize> {
        let mut buf = [0u8; 16 << 10];
        loop {
            let t = match until {
                None => None,
                Some(u) => {
                    let left = u.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(ErrorKind::TimedOut.into());
                    }
                    Some(left)
                }
            };
            self.link.tcp().set_read_timeout(t)?;
            match self.link.read(&mut buf) {
                Ok(n) => {
                    self.reader.push(&buf[..n]);
                    self.recount();
                    return Ok(n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn release_slot(&mut self) {
        if std::mem::take(&mut self.slot) {
            self.shared.free_slot(self.peer.ip(), self.id);
        }
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        self.shared
            .in_flight
            .fetch_sub(self.counted, Ordering::SeqCst);
        self.release_slot();
    }
}

/// The handshake (with a key), then the connection's frames; logs how it
/// ended.
fn accept_one(shared: &Shared, s: TcpStream, peer: SocketAddr, id: u64) {
    let me = shared.rank;
    let link = match Link::open(
        s,
        shared.key.as_deref(),
        oxccl_secure::Role::Responder,
        shared.magic,
        shared.first_wait,
    ) {
        Ok(l) => l,
        Err(_) if shared.is_closed() => return,
        Err(e) => {
            warn!(target: "oxccl::bootstrap", "rank {me}: refused a connection from {peer}: {e}");
            return;
        }
    };
    let mut c = Conn {
        shared,
        link,
        peer,
        id,
        reader: FrameReader::new(shared.magic, proto::MAX_CHUNK),
        pieces: Reassembler::new(proto::MAX_MESSAGE),
        sender: None,
        counted: 0,
        begun: None,
        slot: false,
    };
    match serve(&mut c) {
        Ok(()) => {}
        Err(_) if shared.is_closed() => {
            debug!(target: "oxccl::bootstrap", "rank {me}: connection from {peer} ended at close");
        }
        Err(Stop::Quiet(why)) => {
            debug!(target: "oxccl::bootstrap", "rank {me}: connection from {peer} ended: {why}");
        }
        Err(Stop::Refused(why)) => {
            warn!(target: "oxccl::bootstrap", "rank {me}: {why}");
        }
        Err(Stop::Broken(why)) => {
            warn!(target: "oxccl::bootstrap", "rank {me}: refused a connection from {peer}: {why}");
            if let (Some(from), true) = (c.sender, c.keyed()) {
                shared.fail(
                    from as usize,
                    format!("a message from rank {from} ({peer}) was refused: {why}"),
                );
            }
        }
    }
}

/// Reads the connection's frames until it ends (cleanly: `Ok`), delivering
/// messages, recording failure notices and answering progress queries. A
/// failure notice or a query is the last frame of its connection.
fn serve(c: &mut Conn) -> std::result::Result<(), Stop> {
    let sh = c.shared;
    let (me, peer) = (sh.rank, c.peer);
    let first_deadline = Instant::now() + sh.first_wait;
    let refused = |why: String| Stop::Refused(format!("refused a connection from {peer}: {why}"));
    loop {
        let first = c.sender.is_none();
        // A header.
        let h = loop {
            if let Some(h) = c.reader.header().map_err(|e| refused(e.to_string()))? {
                break h;
            }
            let idle = !first && c.reader.is_empty() && c.pieces.pending() == 0;
            let until = if first {
                Some(first_deadline)
            } else if idle {
                None
            } else {
                Some(c.progress_deadline())
            };
            match c.fill(until) {
                Ok(0) if c.reader.is_empty() && c.pieces.pending() == 0 => return Ok(()),
                Ok(0) => return Err(Stop::Quiet("closed inside a frame".into())),
                Ok(_) => {}
                Err(e) => return Err(read_failed(c, e, first)),
            }
        };
        // Judged before a byte of its payload is read.
        let limit = proto::rank_frame_limit(h.kind)
            .ok_or_else(|| refused(format!("unexpected frame kind {}", h.kind)))?;
        if h.len > limit {
            return Err(refused(format!(
                "a frame of kind {} announcing {} bytes (at most {limit})",
                h.kind, h.len
            )));
        }
        if h.from as usize >= sh.nranks || c.sender.is_some_and(|r| r != h.from) {
            return Err(refused(format!(
                "a frame claims to come from rank {} of {}",
                h.from, sh.nranks
            )));
        }
        // A lookup asks only what any rank of the job may know: it is
        // answered without checking its sender's address (which would
        // need a lookup in turn).
        if first && h.kind != proto::LOOKUP {
            check_sender(c, h.from, h.kind, first_deadline)?;
        }
        if first {
            c.sender = Some(h.from);
        }
        let from = h.from as usize;
        let data = h.kind & !proto::MORE == proto::DATA;
        if c.begun.is_none() {
            // A message's first frame: its sender's messages not taken yet
            // must leave room (else TCP holds the sender back meanwhile).
            if data && !sh.wait_room(from, Instant::now() + sh.timeout) {
                return Err(refused(format!(
                    "rank {from}'s messages were not taken for {} (NCCL_TIMEOUT) while {} bytes of them waited",
                    proto::secs(sh.timeout),
                    limits::MAILBOX_QUOTA
                )));
            }
            c.begun = Some(Instant::now());
        }
        let long = data && (h.kind & proto::MORE != 0 || c.pieces.pending() > 0);
        if !c.slot && (h.len > limits::SMALL_FRAME || long) {
            if !sh.wait_slot(peer.ip(), c.id, Instant::now() + sh.timeout) {
                return Err(refused(format!(
                    "another connection from its address was reading a long message for {} (NCCL_TIMEOUT)",
                    proto::secs(sh.timeout)
                )));
            }
            c.slot = true;
            // It has the slot: the message's time is counted from here.
            c.begun = Some(Instant::now());
        }
        c.reader.reserve_frame();
        c.recount();
        // The rest of the frame.
        let f = loop {
            if let Some(f) = c.reader.next_frame().map_err(|e| refused(e.to_string()))? {
                break f;
            }
            match c.fill(Some(c.progress_deadline())) {
                Ok(0) => return Err(Stop::Quiet("closed inside a frame".into())),
                Ok(_) => {}
                Err(e) => return Err(read_failed(c, e, false)),
            }
        };
        c.recount();
        match f.kind {
            k if k & !proto::MORE == proto::DATA => {
                match c.pieces.push(f.tag, k & proto::MORE != 0, f.payload) {
                    Ok(Some(m)) => {
                        c.begun = None;
                        c.release_slot();
                        c.recount();
                        sh.deliver(from, f.tag, m);
                    }
                    Ok(None) => c.recount(),
                    Err(e) => {
                        return Err(Stop::Broken(format!("rank {from}: {e}")));
                    }
                }
            }
            proto::ABORT => {
                let msg = String::from_utf8_lossy(&f.payload).into_owned();
                warn!(target: "oxccl::bootstrap", "rank {me}: rank {from} reports a failure: {msg}");
                sh.fail(from, msg);
                return Ok(());
            }
            proto::QUERY => {
                let n = sh.progress.load(Ordering::SeqCst);
                let mut payload = n.to_le_bytes().to_vec();
                // A query naming a collective asks for that call too.
                if let Ok(seq) = <[u8; 8]>::try_from(&f.payload[..]) {
                    if let Some(call) = sh.calls.get(u64::from_le_bytes(seq)) {
                        payload.extend_from_slice(&call);
                    }
                }
                let reply = Frame {
                    magic: sh.magic,
                    kind: proto::PROGRESS,
                    from: me as u32,
                    tag: f.tag,
                    payload,
                };
                let _ = c.link.tcp().set_write_timeout(Some(Duration::from_secs(1)));
                if let Err(e) = std::io::Write::write_all(&mut c.link, &reply.encode()) {
                    debug!(target: "oxccl::bootstrap", "rank {me}: cannot answer rank {from}'s progress query: {e}");
                }
                return Ok(());
            }
            proto::LOOKUP => {
                let target = <[u8; 4]>::try_from(&f.payload[..])
                    .map(|b| u32::from_le_bytes(b) as usize)
                    .ok()
                    .filter(|&t| t < sh.nranks)
                    .ok_or_else(|| refused("a malformed lookup".into()))?;
                sh.traffic.received(4);
                let Some(near) = sh.closest_known(target) else {
                    return Ok(());
                };
                let reply = Frame {
                    magic: sh.magic,
                    kind: proto::ADDRS,
                    from: me as u32,
                    tag: 0,
                    payload: proto::encode_entries(&[near]),
                };
                sh.traffic.sent(reply.payload.len());
                let _ = c.link.tcp().set_write_timeout(Some(Duration::from_secs(1)));
                if let Err(e) = std::io::Write::write_all(&mut c.link, &reply.encode()) {
                    debug!(target: "oxccl::bootstrap", "rank {me}: cannot answer rank {from}'s lookup of rank {target}: {e}");
                }
                return Ok(());
            }
            k => return Err(refused(format!("unexpected frame kind {k}"))),
        }
    }
}

/// Without a key, a connection's first frame must come from the address
/// of the rank it names (a stranger's forged failure notice ended whole
/// jobs); with one, the key exchange has authenticated it.
fn check_sender(c: &Conn, from: u32, kind: u8, until: Instant) -> std::result::Result<(), Stop> {
    if c.keyed() {
        return Ok(());
    }
    let (peer, me) = (c.peer, c.shared.rank);
    let Some(addr) = c.shared.rank_addr(from as usize, until) else {
        return Err(Stop::Quiet(format!(
            "no address table by the time its first frame came (from rank {from})"
        )));
    };
    if limits::canonical(addr.ip()) == limits::canonical(peer.ip()) {
        return Ok(());
    }
    let what = match kind {
        proto::ABORT => "ignored a failure notice",
        proto::QUERY => "ignored a progress query",
        _ => "refused a message",
    };
    Err(Stop::Refused(format!(
        "{what} from {peer} that claims to come from rank {from}, which is at {}: forged (set NCCL_SOCKET_KEY_FILE to authenticate ranks), or rank {from}'s connections leave by another address than it listens on (rank {me} closed the connection)",
        addr.ip()
    )))
}

/// What a failed read means for the connection.
fn read_failed(c: &Conn, e: std::io::Error, first: bool) -> Stop {
    let (peer, sh) = (c.peer, c.shared);
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut if first => Stop::Refused(format!(
            "dropped a connection from {peer}: it sent no whole frame header within {} of connecting (a stalled process, or not an oxccl rank)",
            proto::secs(sh.first_wait)
        )),
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Stop::Refused(format!(
            "dropped a connection from {peer}: a frame of it stalled ({} bytes in; each read is due within {}, a message at {} MiB/s)",
            c.reader.held() + c.pieces.pending(),
            proto::secs(sh.first_wait),
            limits::MIN_RATE >> 20
        )),
        ErrorKind::InvalidData => Stop::Broken(e.to_string()),
        _ => Stop::Quiet(format!("broke: {e}")),
    }
}
