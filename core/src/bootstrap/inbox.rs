//! What a rank's incoming side holds, shared by its service threads and
//! by the rank's own calls: the mailbox of messages filed by sender and
//! tag, the addresses of the other ranks (a table, or learned one by one
//! when the join was lazy), the failure notices received, the counts of
//! what each peer holds here against `limits`, and the waits on all of it.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::debug;

use super::calls::CallBook;
use super::limits::{self, Admission};
use super::proto::{self};
use super::tcp::{self, lock, SharedKey};
use crate::error::{Error, Result};

#[derive(Default)]
pub(super) struct Mail {
    pub(super) msgs: HashMap<(usize, u64), VecDeque<Vec<u8>>>,
    /// Bytes of each sender's messages in `msgs`.
    pub(super) held: HashMap<usize, usize>,
    /// Every rank's listen address, once the root has sent them.
    pub(super) table: Option<Vec<SocketAddr>>,
    pub(super) failure: Option<(usize, String)>,
    /// Failure notices no longer end waits: the communicator was revoked,
    /// and what follows (split, shrink) is the recovery from them.
    pub(super) forgiven: bool,
    /// While set, every wait ends at once with this reason (a revoke
    /// ending the operations in flight); cleared once they have ended.
    pub(super) interrupted: Option<String>,
    pub(super) closed: bool,
}

impl Mail {
    /// The next message from `peer` under `tag`, if one is here.
    pub(super) fn pop(&mut self, peer: usize, tag: u64) -> Option<Vec<u8>> {
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
    pub(super) fn sent(&self, bytes: usize) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.sent_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(super) fn received(&self, bytes: usize) {
        self.received.fetch_add(1, Ordering::Relaxed);
        self.received_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(super) fn get(&self) -> super::Traffic {
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
    pub(super) admission: Mutex<Admission>,
    pub(super) admission_cv: Condvar,
    /// Bytes the readers hold in frames and messages being read.
    pub(super) in_flight: AtomicUsize,
    pub(super) next_conn: AtomicU64,
    /// Operations started, as the engine counts them; peers read it.
    pub progress: Arc<AtomicU64>,
    /// The collectives this rank called last; peers ask about one.
    pub calls: CallBook,
    /// Messages and bytes this rank exchanged with others.
    pub traffic: Counters,
    /// The table holds some ranks' addresses only (one root's join): the
    /// others are looked up through the ranks known ([`Shared::resolve`]),
    /// not waited for.
    pub(super) lazy: AtomicBool,
    pub(super) mail: Mutex<Mail>,
    pub(super) cv: Condvar,
    pub(super) closed: AtomicBool,
    /// Accepted connections (a clone each, to shut down) and their readers.
    pub(super) readers: Mutex<Vec<(TcpStream, JoinHandle<()>)>>,
}

impl Shared {
    pub(super) fn new(
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

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(super) fn deliver(&self, from: usize, tag: u64, payload: Vec<u8>) {
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
    pub(super) fn set_table(&self, table: &[SocketAddr]) {
        lock(&self.admission).set_table(table);
        lock(&self.mail).table = Some(table.to_vec());
        self.cv.notify_all();
    }

    /// The table holds its neighbours' addresses only: look the others
    /// up when needed.
    pub(super) fn set_lazy(&self) {
        // Under the mail lock, so that a sender check waiting in
        // `rank_addr` for the table cannot miss the switch.
        let _mail = lock(&self.mail);
        self.lazy.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// Of the ranks whose address this rank knows (itself included), the
    /// one nearest before `target` ([`proto::closest`]), with its address.
    pub(super) fn closest_known(&self, target: usize) -> Option<(usize, SocketAddr)> {
        let mail = lock(&self.mail);
        let t = mail.table.as_ref()?;
        let known = (0..t.len()).filter(|&r| !t[r].ip().is_unspecified());
        let r = proto::closest(target, self.nranks, known)?;
        Some((r, t[r]))
    }

    /// Rank `rank` listens at `addr` (learned from a lookup).
    pub(super) fn learn(&self, rank: usize, addr: SocketAddr) {
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
    pub(super) fn resolve(&self, rank: usize, until: Instant) -> Option<SocketAddr> {
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
    pub(super) fn closest_known_but(
        &self,
        target: usize,
        skip: &[usize],
    ) -> Option<(usize, SocketAddr)> {
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
    pub(super) fn rank_addr(&self, rank: usize, until: Instant) -> Option<SocketAddr> {
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
    pub(super) fn wait_room(&self, from: usize, until: Instant) -> bool {
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
    pub(super) fn wait_slot(&self, ip: IpAddr, conn: u64, until: Instant) -> bool {
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

    pub(super) fn free_slot(&self, ip: IpAddr, conn: u64) {
        lock(&self.admission).free_slot(ip, conn);
        self.admission_cv.notify_all();
    }

    /// Connection `conn` from `ip` ended.
    pub(super) fn leave(&self, ip: IpAddr, conn: u64) {
        lock(&self.admission).leave(ip, conn);
        self.admission_cv.notify_all();
    }

    /// Bytes held for peers: frames and messages being read, and messages
    /// not taken yet.
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> usize {
        let mail: usize = lock(&self.mail).held.values().sum();
        self.in_flight.load(Ordering::SeqCst) + mail
    }

    /// Connections open from `ip`.
    #[cfg(test)]
    pub(super) fn open_from(&self, ip: IpAddr) -> usize {
        lock(&self.admission).open(ip)
    }

    pub(super) fn fail(&self, from: usize, message: String) {
        lock(&self.mail).failure.get_or_insert((from, message));
        self.cv.notify_all();
    }

    pub(super) fn failure(&self) -> Option<(usize, String)> {
        lock(&self.mail).failure.clone()
    }

    /// Ends every wait, now and until [`Shared::resume`], with `why`.
    pub(super) fn interrupt(&self, why: String) {
        lock(&self.mail).interrupted = Some(why);
        self.cv.notify_all();
    }

    pub(super) fn resume(&self) {
        lock(&self.mail).interrupted = None;
    }

    /// From now on, failure notices (those received and those to come) no
    /// longer end waits; a wait still ends at the timeout.
    pub(super) fn forgive(&self) {
        lock(&self.mail).forgiven = true;
    }

    /// Marks the mailbox closed and wakes every waiter.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        lock(&self.mail).closed = true;
        self.cv.notify_all();
    }

    /// Waits up to `timeout` for the next message from `peer` under `tag`;
    /// `what` names it in errors.
    pub(super) fn wait(
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
    pub(super) fn wait_any(
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
    pub(super) fn wait_until<T>(
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
    pub(super) fn live_readers(&self) -> usize {
        lock(&self.readers)
            .iter()
            .filter(|(_, h)| !h.is_finished())
            .count()
    }

    /// Joins the readers that ended on their own.
    pub(super) fn prune_readers(&self) {
        let mut rs = lock(&self.readers);
        let (done, live): (Vec<_>, Vec<_>) = rs.drain(..).partition(|(_, h)| h.is_finished());
        *rs = live;
        drop(rs);
        for (_, h) in done {
            let _ = h.join();
        }
    }

    /// Shuts every accepted connection down and joins its reader.
    pub(super) fn stop_readers(&self) {
        let rs: Vec<_> = lock(&self.readers).drain(..).collect();
        for (s, _) in &rs {
            let _ = s.shutdown(Shutdown::Both);
        }
        for (_, h) in rs {
            let _ = h.join();
        }
    }
}
