//! A rank's incoming side. The service thread accepts peers' connections;
//! one reader thread per connection files messages into the mailbox (keyed
//! by sender and tag, so that they may arrive in any order), records
//! failure notices, and answers progress queries on the connection they
//! came on.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::proto::{self, Frame, FrameReader, Reassembler};
use super::tcp::{lock, read_frame, Link, SharedKey};
use crate::error::{Error, Result};

#[derive(Default)]
struct Mail {
    msgs: HashMap<(usize, u64), VecDeque<Vec<u8>>>,
    failure: Option<(usize, String)>,
    /// Failure notices no longer end waits: the communicator was revoked,
    /// and what follows (split, shrink) is the recovery from them.
    forgiven: bool,
    /// While set, every wait ends at once with this reason (a revoke
    /// ending the operations in flight); cleared once they have ended.
    interrupted: Option<String>,
    closed: bool,
}

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
    /// Operations started, as the engine counts them; peers read it.
    pub progress: Arc<AtomicU64>,
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
    ) -> Shared {
        Shared {
            rank,
            nranks,
            magic,
            key,
            first_wait,
            progress: Arc::default(),
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
        lock(&self.mail)
            .msgs
            .entry((from, tag))
            .or_default()
            .push_back(payload);
        self.cv.notify_all();
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
        self.wait_until(timeout, notices, &from, &hint, |mail| {
            let q = mail.msgs.get_mut(&(peer, tag))?;
            let m = q.pop_front();
            if q.is_empty() {
                mail.msgs.remove(&(peer, tag));
            }
            m
        })
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
            let q = mail.msgs.get_mut(&(p, tag))?;
            let m = q.pop_front()?;
            if q.is_empty() {
                mail.msgs.remove(&(p, tag));
            }
            Some((p, m))
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
                let _ = s.set_nodelay(true);
                let Ok(clone) = s.try_clone() else {
                    warn!(target: "oxccl::bootstrap", "rank {}: dropped a connection from {peer}: cannot clone its socket", shared.rank);
                    continue;
                };
                let sh = shared.clone();
                match std::thread::Builder::new()
                    .name(format!("oxccl-bootstrap-rx-{}", shared.rank))
                    .spawn(move || {
                        let end = s.try_clone();
                        accept_one(&sh, s, peer);
                        // Its clone in `readers` keeps the socket open: end it here.
                        if let Ok(s) = end {
                            let _ = s.shutdown(Shutdown::Both);
                        }
                    }) {
                    Ok(h) => lock(&shared.readers).push((clone, h)),
                    Err(e) => {
                        warn!(target: "oxccl::bootstrap", "rank {}: dropped a connection from {peer}: no reader thread: {e}", shared.rank)
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

/// The handshake (with a key), then the connection's frames, the first of
/// them by the same deadline.
fn accept_one(shared: &Shared, s: TcpStream, peer: SocketAddr) {
    let key = shared.key.as_deref();
    let deadline = Instant::now() + shared.first_wait;
    match Link::open(
        s,
        key,
        oxccl_secure::Role::Responder,
        shared.magic,
        shared.first_wait,
    ) {
        Ok(mut link) => match first_frame(shared, &mut link, deadline) {
            Ok(Some(reader)) => read_loop(shared, &mut link, peer, reader),
            Ok(None) => {}
            Err(_) if shared.is_closed() => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                warn!(target: "oxccl::bootstrap", "rank {}: dropped a connection from {peer}: it sent no whole frame within {} of connecting (a stalled process, or not an oxccl rank)", shared.rank, proto::secs(shared.first_wait));
            }
            Err(e) if e.kind() == ErrorKind::InvalidData => {
                warn!(target: "oxccl::bootstrap", "rank {}: refused a connection from {peer}: {e}", shared.rank);
            }
            Err(e) => {
                debug!(target: "oxccl::bootstrap", "rank {}: connection from {peer} broke before its first frame: {e}", shared.rank);
            }
        },
        Err(_) if shared.is_closed() => {}
        Err(e) => {
            warn!(target: "oxccl::bootstrap", "rank {}: refused a connection from {peer}: {e}", shared.rank)
        }
    }
}

/// Reads until `s` has delivered its first whole frame, or `deadline`
/// passes (a `TimedOut` error); the reader with that frame in it, `None`
/// if the connection ended cleanly first. The socket waits without a
/// limit afterwards: a rank's cached connection is idle between messages.
fn first_frame(
    shared: &Shared,
    s: &mut Link,
    deadline: Instant,
) -> std::io::Result<Option<FrameReader>> {
    let mut reader = FrameReader::new(shared.magic, proto::MAX_CHUNK);
    let mut buf = [0u8; 16 << 10];
    loop {
        if reader
            .has_frame()
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e.to_string()))?
        {
            s.tcp().set_read_timeout(None)?;
            return Ok(Some(reader));
        }
        // Before every read: a peer that trickles bytes cannot stretch it.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        s.tcp().set_read_timeout(Some(left))?;
        match s.read(&mut buf) {
            Ok(0) if reader.is_empty() => return Ok(None),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => reader.push(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn read_loop(shared: &Shared, s: &mut Link, peer: SocketAddr, mut reader: FrameReader) {
    let me = shared.rank;
    let mut pieces = Reassembler::new(proto::MAX_MESSAGE);
    let mut sender: Option<u32> = None;
    loop {
        let f = match read_frame(s, &mut reader) {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) if shared.is_closed() => {
                debug!(target: "oxccl::bootstrap", "rank {me}: connection from {peer} ended at close: {e}");
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                warn!(target: "oxccl::bootstrap", "rank {me}: refused a connection from {peer}: {e}");
                // A rank's authenticated stream broke: what it sent after
                // is lost, so waiting for it would only end at the timeout.
                if let (Some(from), Link::Secure(_)) = (sender, &*s) {
                    shared.fail(
                        from as usize,
                        format!("a message from rank {from} ({peer}) was refused: {e}"),
                    );
                }
                return;
            }
            Err(e) => {
                debug!(target: "oxccl::bootstrap", "rank {me}: connection from {peer} broke: {e}");
                return;
            }
        };
        if f.from as usize >= shared.nranks || sender.is_some_and(|r| r != f.from) {
            warn!(target: "oxccl::bootstrap", "rank {me}: refused a connection from {peer}: a frame claims to come from rank {} of {}", f.from, shared.nranks);
            return;
        }
        sender = Some(f.from);
        let from = f.from as usize;
        match f.kind {
            k if k & !proto::MORE == proto::DATA => {
                match pieces.push(f.tag, k & proto::MORE != 0, f.payload) {
                    Ok(Some(m)) => shared.deliver(from, f.tag, m),
                    Ok(None) => {}
                    Err(e) => {
                        warn!(target: "oxccl::bootstrap", "rank {me}: refused a connection from rank {from} ({peer}): {e}");
                        // As for a broken record: the message is lost, and
                        // an authenticated sender is a rank that failed.
                        if let Link::Secure(_) = &*s {
                            shared.fail(
                                from,
                                format!("a message from rank {from} ({peer}) was refused: {e}"),
                            );
                        }
                        return;
                    }
                }
            }
            proto::ABORT => {
                let msg = String::from_utf8_lossy(&f.payload).into_owned();
                warn!(target: "oxccl::bootstrap", "rank {me}: rank {from} reports a failure: {msg}");
                shared.fail(from, msg);
            }
            proto::QUERY => {
                let n = shared.progress.load(Ordering::SeqCst);
                let reply = Frame {
                    magic: shared.magic,
                    kind: proto::PROGRESS,
                    from: me as u32,
                    tag: f.tag,
                    payload: n.to_le_bytes().to_vec(),
                };
                let _ = s.tcp().set_write_timeout(Some(Duration::from_secs(1)));
                if let Err(e) = std::io::Write::write_all(s, &reply.encode()) {
                    debug!(target: "oxccl::bootstrap", "rank {me}: cannot answer rank {from}'s progress query: {e}");
                    return;
                }
            }
            k => {
                warn!(target: "oxccl::bootstrap", "rank {me}: refused a connection from rank {from} ({peer}): unexpected frame kind {k}");
                return;
            }
        }
    }
}
