//! The root's thread: drives [`proto::Root`] over a non-blocking listener.
//! It serves one communicator init and always ends: when the table went
//! out, or at the root's deadline. With a key, each connection first runs
//! the handshake (sans-IO, so a silent or slow client never stalls the
//! others) and only what it decrypts reaches the frame reader.
//!
//! What a stranger may hold here: a connection that has not said hello
//! reads at most a hello's bytes ([`proto::MAX_HELLO`]; 64 KiB of key
//! exchange with a key), is dropped after [`super::HANDSHAKE_WAIT`], and one
//! address holds at most [`UNJOINED_PER_ADDR`] such connections at once
//! (twice the ranks known, if more): the one past it is closed at once.

use std::collections::{BTreeMap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use oxccl_secure::{Role, SecureError, Session};

use super::proto::{self, ConnId, Frame, FrameReader, Hello, Root, RootAction};
use super::tcp::{self, SharedKey};
use crate::error::{Error, Result};

/// Connections from one address that have not said hello yet, at most
/// (or twice the ranks the hellos so far announce, if that is more): the
/// ranks of a host connect at once, and each says hello at once.
pub(super) const UNJOINED_PER_ADDR: usize = 1024;

/// Counts the connections of each address that have not said hello.
#[derive(Default)]
struct Unjoined {
    by_addr: HashMap<IpAddr, usize>,
    refused: HashMap<IpAddr, u64>,
}

impl Unjoined {
    fn add(&mut self, ip: IpAddr) {
        *self
            .by_addr
            .entry(super::limits::canonical(ip))
            .or_insert(0) += 1;
    }

    fn remove(&mut self, ip: IpAddr) {
        let ip = super::limits::canonical(ip);
        if let Some(n) = self.by_addr.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_addr.remove(&ip);
            }
        }
    }

    /// Whether one more from `ip` is over `cap`; counts the refusal.
    fn full(&mut self, ip: IpAddr, cap: usize) -> Option<u64> {
        let ip = super::limits::canonical(ip);
        if self.by_addr.get(&ip).copied().unwrap_or(0) < cap {
            return None;
        }
        let r = self.refused.entry(ip).or_insert(0);
        *r += 1;
        Some(*r)
    }
}

/// Starts the root on `listener`; returns its address.
pub(super) fn spawn(
    listener: TcpListener,
    magic: u64,
    timeout: Duration,
    key: SharedKey,
    name: String,
) -> Result<SocketAddr> {
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("bootstrap root", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("bootstrap root", e))?;
    std::thread::Builder::new()
        .name(name)
        .spawn(move || run(listener, addr, magic, timeout, key))
        .map_err(|e| Error::System(format!("cannot start the bootstrap root thread: {e}")))?;
    debug!(target: "oxccl::bootstrap", "root listening at {addr}");
    Ok(addr)
}

struct Conn {
    s: TcpStream,
    peer: SocketAddr,
    reader: FrameReader,
    /// Said a hello the root took.
    joined: bool,
    /// With a key: the connection's session (handshake, then records).
    secure: Option<Session>,
    /// When it was accepted: the handshake must end within HANDSHAKE_WAIT.
    since: Instant,
    /// The communicator's magic.
    magic: u64,
    /// Its hello asked for its neighbours' addresses only.
    neighbours: bool,
}

enum Event {
    Idle,
    Hello(Hello),
    Closed,
    Bad(String),
    /// A key exchange that failed as one between ranks holding different
    /// keys (or one none) fails: most likely a rank of this job.
    KeyRefused(String),
}

/// Whether a frame reader's refusal is the start of a key exchange
/// (a 2-byte big-endian length of 48): a rank with a key at a root without.
fn looks_encrypted(e: &proto::FrameError) -> bool {
    let hs = (oxccl_secure::session::HANDSHAKE_MESSAGE as u16).to_be_bytes();
    matches!(e, proto::FrameError::BadMagic(m) if m.to_le_bytes()[..2] == hs)
}

/// Reads what `c` has sent without blocking.
fn poll_conn(c: &mut Conn) -> Event {
    if c.secure.is_some() {
        return poll_secure(c);
    }
    let mut buf = [0u8; 256];
    loop {
        match c.s.read(&mut buf) {
            Ok(0) => return Event::Closed,
            // A rank that said hello has nothing more to say; read on to see it close.
            Ok(_) if c.joined => {}
            Ok(n) => {
                if let Some(ev) = take_hello(&mut c.reader, &buf[..n], true) {
                    return ev;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return silent(c),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Event::Closed,
        }
    }
}

/// Idle, unless a connection that has not said hello has been silent past
/// HANDSHAKE_WAIT (a rank says it at once): dropped then, so that strays
/// do not pile up while the root waits for the ranks.
fn silent(c: &Conn) -> Event {
    if !c.joined && c.since.elapsed() > super::HANDSHAKE_WAIT {
        return Event::Bad(format!(
            "no hello within {} of connecting",
            proto::secs(super::HANDSHAKE_WAIT)
        ));
    }
    Event::Idle
}

/// Feeds `bytes` to the reader: the event once a frame is whole. `plain`:
/// the connection is in clear (a root without a key).
fn take_hello(reader: &mut FrameReader, bytes: &[u8], plain: bool) -> Option<Event> {
    reader.push(bytes);
    match reader.next_frame() {
        Err(e) if plain && looks_encrypted(&e) => Some(Event::KeyRefused(
            "it starts a key exchange: NCCL_SOCKET_KEY_FILE is set there and not here".into(),
        )),
        Err(e) => Some(Event::Bad(e.to_string())),
        Ok(None) => None,
        Ok(Some(f)) if f.kind != proto::HELLO => Some(Event::Bad(format!(
            "a frame of kind {} instead of a hello",
            f.kind
        ))),
        Ok(Some(f)) => Some(match Hello::decode(f.from, &f.payload) {
            Some(h) => Event::Hello(h),
            None => Event::Bad("a malformed hello".into()),
        }),
    }
}

/// An encrypted connection: runs the handshake, then hands what it
/// decrypts to the frame reader.
fn poll_secure(c: &mut Conn) -> Event {
    let Conn {
        s, secure, magic, ..
    } = c;
    let magic = *magic;
    let sess = secure.as_mut().expect("checked by the caller");
    loop {
        match sess.read_with(|b| s.read(b)) {
            Ok(0) => return Event::Closed,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Event::Closed,
        }
        // Judged as it comes, so that a stranger cannot make us buffer much.
        if let Err(e) = sess.advance() {
            return match e {
                SecureError::WrongKey => Event::KeyRefused(e.to_string()),
                // Our magic's first bytes where a key exchange starts: a
                // rank of this communicator without the key.
                SecureError::NotEncrypted { len }
                    if (len as u16).to_be_bytes() == magic.to_le_bytes()[..2] =>
                {
                    Event::KeyRefused(
                        "it sends its hello in clear: NCCL_SOCKET_KEY_FILE is not set there".into(),
                    )
                }
                e => Event::Bad(e.to_string()),
            };
        }
        if sess.pending_in() > 64 << 10 {
            return Event::Bad("more bytes than a hello".into());
        }
    }
    if sess.pending_out() > 0 {
        // The handshake's answer: 50 bytes into a fresh socket's buffer.
        if let Err(e) = flush_blocking(s, sess) {
            return Event::Bad(format!("cannot answer its key exchange: {e}"));
        }
    }
    if !sess.is_ready() {
        if c.since.elapsed() > super::HANDSHAKE_WAIT {
            return Event::Bad(format!(
                "no key exchange within {}",
                proto::secs(super::HANDSHAKE_WAIT)
            ));
        }
        return Event::Idle;
    }
    let mut buf = [0u8; 256];
    loop {
        match sess.open(&mut buf) {
            Ok(0) => return silent(c),
            // A rank that said hello has nothing more to say.
            Ok(_) if c.joined => {}
            Ok(n) => {
                if let Some(ev) = take_hello(&mut c.reader, &buf[..n], false) {
                    return ev;
                }
            }
            Err(e) => return Event::Bad(e.to_string()),
        }
    }
}

fn flush_blocking(s: &mut TcpStream, sess: &mut Session) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let r = sess.flush_with(|b| s.write(b));
    s.set_nonblocking(true)?;
    r
}

fn send(c: &mut Conn, magic: u64, kind: u8, payload: Vec<u8>) -> std::io::Result<()> {
    c.s.set_nonblocking(false)?;
    c.s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let f = Frame {
        magic,
        kind,
        from: u32::MAX,
        tag: 0,
        payload,
    };
    match c.secure.as_mut() {
        None => c.s.write_all(&f.encode()),
        Some(sess) => {
            sess.seal(&[&f.encode()], usize::MAX)?;
            let s = &mut c.s;
            sess.flush_with(|b| s.write(b))
        }
    }
}

fn run(listener: TcpListener, addr: SocketAddr, magic: u64, timeout: Duration, key: SharedKey) {
    let mut root = Root::new(addr, timeout, Instant::now());
    let mut conns: BTreeMap<ConnId, Conn> = BTreeMap::new();
    let mut next_id: ConnId = 0;
    let mut unjoined = Unjoined::default();
    let mut idle = Duration::from_millis(1);
    while !root.is_done() {
        let mut busy = false;
        loop {
            match listener.accept() {
                Ok((s, peer)) => {
                    busy = true;
                    let cap = UNJOINED_PER_ADDR.max(2 * root.nranks().unwrap_or(0));
                    if let Some(n) = unjoined.full(peer.ip(), cap) {
                        if super::limits::warn_at(n) {
                            warn!(target: "oxccl::bootstrap", "root {addr}: closed a connection from {peer}: its address holds {cap} connections that have not said hello; {n} refused so far");
                        }
                        continue;
                    }
                    let secure = match key.as_deref() {
                        None => None,
                        Some(k) => match Session::new(Role::Responder, k, &tcp::prologue(magic)) {
                            Ok(sess) => Some(sess),
                            Err(e) => {
                                warn!(target: "oxccl::bootstrap", "root {addr}: dropped a connection from {peer}: {e}");
                                continue;
                            }
                        },
                    };
                    if s.set_nonblocking(true).is_ok() {
                        let _ = s.set_nodelay(true);
                        let reader = FrameReader::new(magic, proto::MAX_HELLO);
                        unjoined.add(peer.ip());
                        conns.insert(
                            next_id,
                            Conn {
                                s,
                                peer,
                                reader,
                                joined: false,
                                secure,
                                since: Instant::now(),
                                magic,
                                neighbours: false,
                            },
                        );
                        next_id += 1;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(target: "oxccl::bootstrap", "root {addr}: accept failed: {e}");
                    break;
                }
            }
        }
        let mut actions = Vec::new();
        let mut gone = Vec::new();
        for (&id, c) in conns.iter_mut() {
            match poll_conn(c) {
                Event::Idle => {}
                Event::Hello(h) => {
                    busy = true;
                    debug!(target: "oxccl::bootstrap", "root {addr}: hello from rank {} of {} at {} (from {})", h.rank, h.nranks, h.listen, c.peer);
                    c.joined = true;
                    c.neighbours = h.neighbours;
                    unjoined.remove(c.peer.ip());
                    actions.extend(root.hello(Instant::now(), id, &h));
                }
                Event::Closed => {
                    busy = true;
                    gone.push(id);
                    if c.joined {
                        warn!(target: "oxccl::bootstrap", "root {addr}: a rank's connection from {} closed before every rank joined", c.peer);
                        root.closed(id);
                    }
                }
                Event::Bad(why) => {
                    busy = true;
                    warn!(target: "oxccl::bootstrap", "root {addr}: refused a connection from {}: {why}", c.peer);
                    gone.push(id);
                    if c.joined {
                        root.closed(id);
                    }
                }
                Event::KeyRefused(why) => {
                    busy = true;
                    warn!(target: "oxccl::bootstrap", "root {addr}: refused a connection from {}: {why}", c.peer);
                    gone.push(id);
                    root.key_refused(Instant::now(), c.peer, &why);
                }
            }
        }
        for id in gone {
            if let Some(c) = conns.remove(&id) {
                if !c.joined {
                    unjoined.remove(c.peer.ip());
                }
            }
        }
        actions.extend(root.poll(Instant::now()));
        for a in actions {
            match a {
                RootAction::Table { conns: to, table } => {
                    let payload = proto::encode_table(&table);
                    let n = table.len();
                    for (rank, id) in to.iter().enumerate() {
                        if let Some(c) = conns.get_mut(id) {
                            // One root's ranks take their neighbours only:
                            // O(log n) addresses each, not n.
                            let (kind, payload) = if c.neighbours {
                                let near: Vec<_> = proto::neighbours(rank, n)
                                    .into_iter()
                                    .map(|r| (r, table[r]))
                                    .collect();
                                (proto::NEIGHBOURS, proto::encode_entries(&near))
                            } else {
                                (proto::TABLE, payload.clone())
                            };
                            if let Err(e) = send(c, magic, kind, payload) {
                                warn!(target: "oxccl::bootstrap", "root {addr}: cannot send the table to rank {rank} at {}: {e}", c.peer);
                            }
                        }
                    }
                    debug!(target: "oxccl::bootstrap", "root {addr}: all {} ranks joined", table.len());
                }
                RootAction::Refuse { conn, error } => {
                    if let Some(mut c) = conns.remove(&conn) {
                        if !c.joined {
                            unjoined.remove(c.peer.ip());
                        }
                        warn!(target: "oxccl::bootstrap", "refused {}: {}", c.peer, error.message());
                        let _ = send(&mut c, magic, proto::ERROR, proto::encode_error(&error));
                    }
                }
                RootAction::Fail { conns: to, error } => {
                    warn!(target: "oxccl::bootstrap", "{}", error.message());
                    let payload = proto::encode_error(&error);
                    for id in to {
                        if let Some(c) = conns.get_mut(&id) {
                            let _ = send(c, magic, proto::ERROR, payload.clone());
                        }
                    }
                }
            }
        }
        if busy {
            idle = Duration::from_millis(1);
        } else {
            std::thread::sleep(idle);
            idle = (idle * 2).min(Duration::from_millis(16));
        }
    }
    // Hellos already here from ranks beyond the table (a duplicate rank
    // that lost the race) get an answer rather than a bare close.
    for c in conns.values_mut().filter(|c| !c.joined) {
        if let Event::Hello(h) = poll_conn(c) {
            let e = Error::InvalidUsage(format!(
                "bootstrap root at {addr}: rank {} of {} came after every rank had joined: two processes were given the same rank?",
                h.rank, h.nranks
            ));
            warn!(target: "oxccl::bootstrap", "refused {}: {}", c.peer, e.message());
            let _ = send(c, magic, proto::ERROR, proto::encode_error(&e));
        }
    }
    debug!(target: "oxccl::bootstrap", "root {addr}: done");
}
