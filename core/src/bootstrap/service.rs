//! A rank's incoming side. The service thread accepts peers' connections;
//! one reader thread per connection files messages into the mailbox (keyed
//! by sender and tag, so that they may arrive in any order), records
//! failure notices, and answers progress queries on the connection they
//! came on. What a peer may hold here (connections, bytes, time) is capped
//! as `limits` says.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::calls::CallBook;
use super::limits::{self, Admission};
use super::proto::{self, Frame, FrameReader, Reassembler};
use super::tcp::{self, lock, Link, SharedKey};
use crate::error::{Error, Result};

#[derive(Default)]
struct Mail {
    msgs: HashMap<(usize, u64), VecDeque<Vec<u8>>>,
    /// Bytes of each sender's messages in `msgs`.
    held: HashMap<usize, usize>,
    /// Every rank's listen address, once the root has sent them.
    table: Option<Vec<SocketAddr>>,
    failure: Option<(usize, String)>,
    /// Failure notices no longer end waits: the communicator was revoked,
    /// and what follows (split, shrink) is the recovery from them.
    forgiven: bool,
    /// While set, every wait ends at once with this reason (a revoke
    /// ending the operations in flight); cleared once they have ended.
    interrupted: Option<String>,
    closed: bool,
}

impl Mail {
    /// The next message from `peer` under `tag`, if one is here.
    fn pop(&mut self, peer: usize, tag: u64) -> Option<Vec<u8>> {
        let q = self.msgs.get_mut(&(peer, tag))?;
        let m = q.pop_front();
        if q.is_empty() {
            self.msgs.remove(&(peer, tag));
        }
        if let (Some(m), Some(h)) = (&m, self.held.get_mut(&peer)) {
            *h = h.saturating_sub(m.len());
        }
        m
    }
}

/// Messages a rank sent to and received from others (the root
/// included), and their payload bytes: what [`super::Traffic`] reports.
#[derive(Default)]
pub(super) struct Counters {
    sent: AtomicU64,
    sent_bytes: AtomicU64,
    received: AtomicU64,
    received_bytes: AtomicU64,
}

impl Counters {
    pub fn sent(&self, bytes: usize) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.sent_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn received(&self, bytes: usize) {
        self.received.fetch_add(1, Ordering::Relaxed);
        self.received_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn get(&self) -> super::Traffic {
        super::Traffic {
            sent: self.sent.load(Ordering::Relaxed),
            sent_bytes: self.sent_bytes.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            received_bytes: self.received_bytes.load(Ordering::Relaxed),
        }
    }
}

/// How long one question of a lookup waits for its answer before the
/// asker tries another rank (a live rank answers in well under a
/// millisecond; a stopped one never does): first [`LOOKUP_FIRST_WAIT`],
/// so that a stopped rank on the way costs little; where that passed
/// over every way there (ranks slowed down by a loaded host), the walk
/// starts again with this.
const LOOKUP_WAIT: Duration = Duration::from_secs(2);
const LOOKUP_FIRST_WAIT: Duration = Duration::from_millis(250);

/// Which failure notices end a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Notices {
    /// Any, unless the mailbox forgave them (after a revoke).
    Heed,
    /// None: a shrink's survivors talk on while the excluded ranks' notices
    /// stand.
    Ignore,
}

/// What the service and reader threads share with the rank's API.
pub(super) struct Shared {
    pub rank: usize,
    pub nranks: usize,
    pub magic: u64,
    /// The pre-shared key: every accepted connection must pass the
    /// handshake with it before a byte of it is read as a frame.
    pub key: SharedKey,
    /// How long an accepted connection may take over its handshake (with
    /// a key) and then over its first whole frame: a rank writes at once
    /// on a connection it opens, so a silent one is a stranger, a stalled
    /// process or a port scanner, and its reader thread is freed at this
    /// deadline.
    pub first_wait: Duration,
    /// NCCL_TIMEOUT: how long a connection waits for its address's slot or
    /// for room in the mailbox (a sender's write gives up then too).
    pub timeout: Duration,
    /// Connections per address and the slots (see `limits`).
    admission: Mutex<Admission>,
    admission_cv: Condvar,
    /// Bytes the readers hold in frames and messages being read.
    in_flight: AtomicUsize,
    next_conn: AtomicU64,
    /// Operations started, as the engine counts them; peers read it.
    pub progress: Arc<AtomicU64>,
    /// The collectives this rank called last; peers ask about one.
    pub calls: CallBook,
    /// Messages and bytes this rank exchanged with others.
    pub traffic: Counters,
    /// The table holds some ranks' addresses only (one root's join): the
    /// others are looked up through the ranks known ([`Shared::resolve`]),
    /// not waited for.
    lazy: AtomicBool,
    mail: Mutex<Mail>,
    cv: Condvar,
    closed: AtomicBool,
    /// Accepted connections (a clone each, to shut down) and their readers.
    readers: Mutex<Vec<(TcpStream, JoinHandle<()>)>>,
}

impl Shared {
    pub fn new(
        rank: usize,
        nranks: usize,
        magic: u64,
        key: SharedKey,
        first_wait: Duration,
        timeout: Duration,
    ) -> Shared {
        Shared {
            rank,
            nranks,
            magic,
            key,
            first_wait,
            timeout,
            admission: Mutex::new(Admission::new(nranks)),
            admission_cv: Condvar::new(),
            in_flight: AtomicUsize::new(0),
            next_conn: AtomicU64::new(0),
            progress: Arc::default(),
            calls: CallBook::default(),
            traffic: Counters::default(),
            lazy: AtomicBool::new(false),
            mail: Mutex::default(),
            cv: Condvar::new(),
            closed: AtomicBool::new(false),
            readers: Mutex::default(),
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub fn deliver(&self, from: usize, tag: u64, payload: Vec<u8>) {
        if from != self.rank {
            self.traffic.received(payload.len());
        }
        let mut mail = lock(&self.mail);
        *mail.held.entry(from).or_insert(0) += payload.len();
        mail.msgs.entry((from, tag)).or_default().push_back(payload);
        drop(mail);
        self.cv.notify_all();
    }

    /// Every rank's listen address, by rank, from the root.
    pub fn set_table(&self, table: &[SocketAddr]) {
        lock(&self.admission).set_table(table);
        lock(&self.mail).table = Some(table.to_vec());
        self.cv.notify_all();
    }

    /// The table holds its neighbours' addresses only: look the others
    /// up when needed.
    pub fn set_lazy(&self) {
        // Under the mail lock, so that a sender check waiting in
        // `rank_addr` for the table cannot miss the switch.
        let _mail = lock(&self.mail);
        self.lazy.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// Of the ranks whose address this rank knows (itself included), the
    /// one nearest before `target` ([`proto::closest`]), with its address.
    pub fn closest_known(&self, target: usize) -> Option<(usize, SocketAddr)> {
        let mail = lock(&self.mail);
        let t = mail.table.as_ref()?;
        let known = (0..t.len()).filter(|&r| !t[r].ip().is_unspecified());
        let r = proto::closest(target, self.nranks, known)?;
        Some((r, t[r]))
    }

    /// Rank `rank` listens at `addr` (learned from a lookup).
    fn learn(&self, rank: usize, addr: SocketAddr) {
        let mut mail = lock(&self.mail);
        if let Some(t) = mail.table.as_mut() {
            if t.get(rank).is_some_and(|a| a.ip().is_unspecified()) {
                t[rank] = addr;
                lock(&self.admission).set_table(t);
            }
        }
    }

    /// Rank `rank`'s listen address: from the table, else (in a lazy
    /// table) looked up by asking the known rank nearest before it, then
    /// the one that names, and so on ([`proto::LOOKUP`]): at most
    /// `ceil(log2 n)` questions, each a one-shot connection. `None` when
    /// no answer leads to it by `until`.
    pub fn resolve(&self, rank: usize, until: Instant) -> Option<SocketAddr> {
        if !self.lazy.load(Ordering::Acquire) {
            return self.rank_addr(rank, until);
        }
        let n = self.nranks;
        let local = self.closest_known(self.rank).map(|(_, a)| a.ip());
        let dist = |r: usize| (rank + n - r) % n;
        // Ranks that did not answer (dead, stopped) or led to one that
        // did not: the walk starts again from the nearest known rank
        // outside them, until none is left or the time is up.
        let mut skip: Vec<usize> = Vec::new();
        let mut wait = LOOKUP_FIRST_WAIT;
        'walk: loop {
            // This rank is always known and never passed over: `None` only
            // without a table.
            let (mut at, mut addr) = self.closest_known_but(rank, &skip)?;
            let mut path = Vec::new();
            while at != rank {
                if Instant::now() >= until {
                    return None;
                }
                // No known rank leads nearer: where ranks were passed over
                // on the short wait, once more, waiting long.
                if at == self.rank {
                    if wait < LOOKUP_WAIT && !skip.is_empty() {
                        (wait, skip) = (LOOKUP_WAIT, Vec::new());
                        continue 'walk;
                    }
                    return None;
                }
                self.traffic.sent(4);
                let answer = tcp::lookup(
                    local,
                    addr,
                    self.key.as_deref(),
                    self.magic,
                    self.rank as u32,
                    rank,
                    until.min(Instant::now() + wait),
                )
                .filter(|&(next, a)| {
                    next < n
                        && dist(next) < dist(at)
                        && !a.ip().is_unspecified()
                        && !skip.contains(&next)
                });
                let Some((next, a)) = answer else {
                    debug!(target: "oxccl::bootstrap", "rank {}: looking up rank {rank}, rank {at} at {addr} gave no nearer rank in time; asking another", self.rank);
                    skip.push(at);
                    skip.append(&mut path);
                    continue 'walk;
                };
                self.traffic.received(4 + proto::ADDR_BYTES);
                self.learn(next, a);
                path.push(at);
                (at, addr) = (next, a);
            }
            return Some(addr);
        }
    }

    /// [`Shared::closest_known`] outside the ranks of `skip`.
    fn closest_known_but(&self, target: usize, skip: &[usize]) -> Option<(usize, SocketAddr)> {
        let mail = lock(&self.mail);
        let t = mail.table.as_ref()?;
        let known = (0..t.len()).filter(|&r| !t[r].ip().is_unspecified() && !skip.contains(&r));
        let r = proto::closest(target, self.nranks, known)?;
        Some((r, t[r]))
    }

    /// Rank `rank`'s listen address, waiting until `until` for a table
    /// that has it or for the table to become lazy: through several roots
    /// a rank holds its sets' neighbours while it joins, and a rank that
    /// joined first may already write. In a lazy table, looked up
    /// ([`Shared::resolve`]).
    fn rank_addr(&self, rank: usize, until: Instant) -> Option<SocketAddr> {
        let mut mail = lock(&self.mail);
        loop {
            // Through several roots the table becomes lazy when the join
            // ends, while a rank that finished first may already write: its
            // address is then looked up.
            if self.lazy.load(Ordering::Acquire) {
                drop(mail);
                return self.resolve(rank, until);
            }
            if let Some(t) = &mail.table {
                match t.get(rank) {
                    Some(a) if a.ip().is_unspecified() => {}
                    other => return other.copied(),
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if mail.closed || left.is_zero() {
                return None;
            }
            mail = self
                .cv
                .wait_timeout(mail, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Waits until fewer than [`limits::MAILBOX_QUOTA`] bytes of `from`'s
    /// messages wait to be taken; false at `until` or at close.
    fn wait_room(&self, from: usize, until: Instant) -> bool {
        let mut mail = lock(&self.mail);
        loop {
            if mail.held.get(&from).copied().unwrap_or(0) < limits::MAILBOX_QUOTA {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if mail.closed || left.is_zero() {
                return false;
            }
            mail = self
                .cv
                .wait_timeout(mail, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Waits for `ip`'s slot for connection `conn`; false at `until` or at
    /// close.
    fn wait_slot(&self, ip: IpAddr, conn: u64, until: Instant) -> bool {
        let mut a = lock(&self.admission);
        loop {
            if a.take_slot(ip, conn) {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if self.is_closed() || left.is_zero() {
                return false;
            }
            // Bounded so that a close (which does not signal this
            // condition) is seen soon.
            a = self
                .admission_cv
                .wait_timeout(a, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn free_slot(&self, ip: IpAddr, conn: u64) {
        lock(&self.admission).free_slot(ip, conn);
        self.admission_cv.notify_all();
    }

    /// Connection `conn` from `ip` ended.
    fn leave(&self, ip: IpAddr, conn: u64) {
        lock(&self.admission).leave(ip, conn);
        self.admission_cv.notify_all();
    }

    /// Bytes held for peers: frames and messages being read, and messages
    /// not taken yet.
    #[cfg(test)]
    pub fn held_bytes(&self) -> usize {
        let mail: usize = lock(&self.mail).held.values().sum();
        self.in_flight.load(Ordering::SeqCst) + mail
    }

    /// Connections open from `ip`.
    #[cfg(test)]
    pub fn open_from(&self, ip: IpAddr) -> usize {
        lock(&self.admission).open(ip)
    }

    fn fail(&self, from: usize, message: String) {
        lock(&self.mail).failure.get_or_insert((from, message));
        self.cv.notify_all();
    }

    pub fn failure(&self) -> Option<(usize, String)> {
        lock(&self.mail).failure.clone()
    }

    /// Ends every wait, now and until [`Shared::resume`], with `why`.
    pub fn interrupt(&self, why: String) {
        lock(&self.mail).interrupted = Some(why);
        self.cv.notify_all();
    }

    pub fn resume(&self) {
        lock(&self.mail).interrupted = None;
    }

    /// From now on, failure notices (those received and those to come) no
    /// longer end waits; a wait still ends at the timeout.
    pub fn forgive(&self) {
        lock(&self.mail).forgiven = true;
    }

    /// Marks the mailbox closed and wakes every waiter.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        lock(&self.mail).closed = true;
        self.cv.notify_all();
    }

    /// Waits up to `timeout` for the next message from `peer` under `tag`;
    /// `what` names it in errors.
    pub fn wait(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        notices: Notices,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<u8>> {
        let from = || format!("{} from rank {peer}", what());
        let hint = format!(": rank {peer} is dead, hung, or not making the same calls");
        self.wait_until(timeout, notices, &from, &hint, |mail| mail.pop(peer, tag))
    }

    /// As [`Shared::wait`], for the next message under `tag` from any
    /// rank (the lowest-numbered sender's first), with its sender.
    pub fn wait_any(
        &self,
        tag: u64,
        timeout: Duration,
        what: &dyn Fn() -> String,
    ) -> Result<(usize, Vec<u8>)> {
        let from = || format!("{} from any rank", what());
        self.wait_until(timeout, Notices::Heed, &from, "", |mail| {
            let p = mail
                .msgs
                .iter()
                .filter(|((_, t), q)| *t == tag && !q.is_empty())
                .map(|((p, _), _)| *p)
                .min()?;
            mail.pop(p, tag).map(|m| (p, m))
        })
    }

    /// Waits up to `timeout` until `take` finds what it wants in the
    /// mailbox, failing at once on an interrupt, a close, or (as `notices`
    /// says) a failure notice; `what` and `hint` make the errors.
    fn wait_until<T>(
        &self,
        timeout: Duration,
        notices: Notices,
        what: &dyn Fn() -> String,
        hint: &str,
        mut take: impl FnMut(&mut Mail) -> Option<T>,
    ) -> Result<T> {
        let start = Instant::now();
        let mut mail = lock(&self.mail);
        loop {
            if let Some(m) = take(&mut mail) {
                // Room in the mailbox: a reader may wait for it.
                self.cv.notify_all();
                return Ok(m);
            }
            if let Some(why) = &mail.interrupted {
                return Err(Error::InvalidUsage(format!(
                    "bootstrap: rank {} stopped waiting for {}: {why}",
                    self.rank,
                    what()
                )));
            }
            match &mail.failure {
                Some((who, msg)) if notices == Notices::Heed && !mail.forgiven => {
                    return Err(Error::Remote(format!("rank {who} failed: {msg}")));
                }
                _ => {}
            }
            if mail.closed {
                return Err(Error::InvalidUsage(format!(
                    "bootstrap: rank {} was closed while waiting for {}",
                    self.rank,
                    what()
                )));
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::Remote(format!(
                    "bootstrap: rank {} waited {} (NCCL_TIMEOUT) for {}{hint}",
                    self.rank,
                    proto::secs(waited),
                    what()
                )));
            }
            mail = self
                .cv
                .wait_timeout(mail, timeout - waited)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Reader threads still running.
    #[cfg(test)]
    pub fn live_readers(&self) -> usize {
        lock(&self.readers)
            .iter()
            .filter(|(_, h)| !h.is_finished())
            .count()
    }

    /// Joins the readers that ended on their own.
    fn prune_readers(&self) {
        let mut rs = lock(&self.readers);
        let (done, live): (Vec<_>, Vec<_>) = rs.drain(..).partition(|(_, h)| h.is_finished());
        *rs = live;
        drop(rs);
        for (_, h) in done {
            let _ = h.join();
        }
    }

    /// Shuts every accepted connection down and joins its reader.
    fn stop_readers(&self) {
        let rs: Vec<_> = lock(&self.readers).drain(..).collect();
        for (s, _) in &rs {
            let _ = s.shutdown(Shutdown::Both);
        }
        for (_, h) in rs {
            let _ = h.join();
        }
    }
}

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
