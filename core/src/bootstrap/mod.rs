//! Bootstrap: the unique id, the root, the exchange of listen addresses,
//! and the small out-of-band messages ranks send each other (connection
//! handles, split colors, failure notices, progress queries).
//!
//! - `proto`: the protocol without sockets (id layout, frames, tags, the
//!   allgather and barrier schedules, the root's state machine);
//! - `root`: the root's thread, serving one communicator init;
//! - `join`: a rank's init, through one root or several (`roots`: who
//!   joins which, and how the blocks' first ranks become known);
//! - `service`: each rank's incoming side (service thread, readers, mailbox);
//! - `tcp`: frames on sockets, retries, cached outgoing connections;
//! - `calls`: the collectives a rank called last, which peers ask about.
//!
//! The flow: `get_unique_id` starts the root (unless `NCCL_COMM_ID` names
//! it; then rank 0 hosts it inside `init`). Each rank binds a listener on
//! its bootstrap interface and says hello to the root with its listen
//! address. From then on ranks talk directly: messages are matched by
//! (sender, tag) in FIFO order, over one lazily made connection per peer
//! and direction.
//!
//! What it costs at scale, per rank of `n` (`L = ceil(log2 n)`; counted by
//! [`Bootstrap::traffic`], checked by the test
//! `messages_and_bytes_per_rank_at_init_grow_with_log_n`):
//! - init through one root: one message each way. The root answers each
//!   rank with its neighbours' addresses only (`me +- 2^k`,
//!   [`proto::neighbours`]: at most `2L` addresses of 19 bytes), not the
//!   whole table, so the root sends `O(n L)` bytes in all, not `n^2`
//!   addresses;
//! - an address not known is looked up when first needed (a message to
//!   that rank, a message from it to check, a failure notice, a progress
//!   query): the rank asks the known rank nearest before it, which names
//!   the one it knows nearest before it, and so on ([`proto::LOOKUP`],
//!   [`proto::closest`]); the neighbours halve the distance at each answer,
//!   so at most `L` questions of 4 bytes and answers of 23, and the
//!   answers are kept;
//! - [`Bootstrap::allgather`] is Bruck's: `L` messages each way, to and
//!   from neighbours (no lookup), each block received once (`n - 1`
//!   blocks: the bytes an allgather must move);
//! - [`Bootstrap::barrier`] is a dissemination barrier: `L` each way.
//!
//! Through several roots (`ncclCommInitRankScalable`, [`roots`], `k`
//! ids) each root answers its set of about `n/k` ranks with their
//! neighbours in the set, as one root does; the first rank of each block
//! (its leader) passes the leaders' addresses along the leaders and down
//! its block, so that every rank also knows the `k` leaders: at most 3
//! messages received and `2 + ceil(log2(n/k))` sent per rank, of at most
//! `k` addresses, besides the hello and the root's answer (two of each for
//! a leader). Other addresses are looked up as through one root, starting
//! at the target's leader.
//!
//! With NCCL_SOCKET_KEY_FILE set, every one of these connections (the
//! root's included) starts with the handshake of `oxccl_secure` and carries
//! encrypted records: a peer without the key is refused, with its address
//! logged, before any byte of it reaches a frame reader.

mod calls;
mod inbox;
mod join;
mod limits;
pub mod proto;
mod root;
mod roots;
mod service;
mod tcp;

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_netif::{Family, Iface};
use oxccl_secure::Key;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::error::{Error, Result};
pub use calls::CALL_BYTES;
use inbox::{Notices, Shared};
use proto::{Frame, IdContents};
use service::Service;
use tcp::Outgoing;

/// How long an accepted connection may take over its handshake, and a
/// rank's connection then over its first frame (the root's over its hello).
const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// The pre-shared key NCCL_SOCKET_KEY_FILE names; `None` when unset (the
/// bootstrap then talks in clear, as before). Only the environment may set
/// it: the socket network, which never links the core, reads it there, and
/// the two must agree.
pub fn socket_key(cfg: &Config) -> Result<Option<Arc<Key>>> {
    let Some(path) = cfg
        .socket_key_file
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    else {
        return Ok(None);
    };
    // The socket network reads the process environment only: a value
    // from elsewhere (a file, the API, an env plugin) would leave it in clear.
    if std::env::var(oxccl_secure::KEY_ENV)
        .ok()
        .as_deref()
        .map(str::trim)
        != Some(path)
    {
        let src = cfg
            .source("SOCKET_KEY_FILE")
            .map_or("?".into(), |s| s.to_string());
        return Err(Error::InvalidArgument(format!(
            "NCCL_SOCKET_KEY_FILE is set from {src}: set it in the process environment instead (the socket network reads only the environment, and the bootstrap and the network must use one key)"
        )));
    }
    let key = Key::from_file(Path::new(path)).map_err(|e| Error::InvalidArgument(e.to_string()))?;
    if Key::readable_by_others(Path::new(path)) {
        warn!(target: "oxccl::init", "NCCL_SOCKET_KEY_FILE={path} can be read by other users: `chmod 600 {path}`");
    }
    Ok(Some(Arc::new(key)))
}

/// What the key protects, one line per kind of connection: for the INFO
/// log at init and `oxccl info`. Transports that never touch a TCP socket
/// are named as outside the protection, as NCCL does.
pub fn protection_lines(keyed: bool) -> Vec<String> {
    if !keyed {
        return vec![
            "traffic is NOT encrypted: NCCL_SOCKET_KEY_FILE is unset, so bootstrap and socket-network connections go in clear (set it to a file from `oxccl keygen` to authenticate and encrypt them)".into(),
        ];
    }
    let with = oxccl_secure::describe();
    vec![
        format!("bootstrap root connections: {with}"),
        format!("bootstrap rank-to-rank connections: {with}"),
        format!("socket network (NCCL_NET=Socket, built in or as liboxccl_net_socket.so) control and data connections: {with}"),
        "outside the protection: P2P (NVLink, PCIe), SHM, IB/RoCE (verbs) and external net plugins"
            .into(),
    ]
}

/// NCCL's `ncclUniqueId`: 128 opaque bytes holding the root's address and a
/// magic (layout in [`proto::IdContents`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl UniqueId {
    /// The root's address, if these bytes are an oxccl id.
    pub fn root_addr(&self) -> Option<SocketAddr> {
        IdContents::decode(&self.0).map(|c| c.root)
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match IdContents::decode(&self.0) {
            Some(c) if c.from_env => write!(f, "UniqueId(root {}, from NCCL_COMM_ID)", c.root),
            Some(c) => write!(f, "UniqueId(root {})", c.root),
            None => write!(f, "UniqueId(?)"),
        }
    }
}

/// User tags are below this; the bootstrap's own are at and above it.
pub const TAG_RESERVED: u64 = proto::TAG_RESERVED;

/// How long a progress query waits for the peers' answers, at most.
const QUERY_WAIT: Duration = Duration::from_secs(2);
/// How long `broadcast_failure` may take in all, and per peer.
const ABORT_WAIT: Duration = Duration::from_secs(2);
const ABORT_PER_PEER: Duration = Duration::from_millis(500);
/// How long a failure notice waits for a peer to take it (its reader
/// closes the connection once it has recorded the notice): a live peer's
/// reader answers in well under a millisecond; a stopped one never does.
const ABORT_TAKEN: Duration = Duration::from_millis(100);
/// Threads that talk to peers at once in queries and failure notices.
const FANOUT: usize = 16;

fn family(cfg: &Config) -> Result<Family> {
    Family::parse(cfg.socket_family.as_deref()).map_err(netif_err)
}

fn netif_err(e: oxccl_netif::NetifError) -> Error {
    match e {
        oxccl_netif::NetifError::System(m) => Error::System(m),
        other => Error::InvalidArgument(other.to_string()),
    }
}

/// The bootstrap interface: NCCL_SOCKET_IFNAME's first match; else the
/// interface on the root's subnet (loopback for a loopback root); else the
/// first by NCCL's default order.
fn bootstrap_iface(cfg: &Config, root: Option<IpAddr>) -> Result<Iface> {
    let fam = family(cfg)?;
    let ifname = cfg
        .socket_ifname
        .as_deref()
        .filter(|s| !s.trim().is_empty());
    if ifname.is_none() {
        if let Some(i) = root
            .map(|r| oxccl_netif::find_for_remote(r, fam))
            .transpose()
            .map_err(netif_err)?
            .flatten()
        {
            return Ok(i);
        }
    }
    oxccl_netif::find_interfaces(ifname, fam, 1)
        .map_err(netif_err)?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Internal("find_interfaces returned no interface".into()))
}

fn listen_on(iface: &Iface, what: &str) -> Result<TcpListener> {
    TcpListener::bind(SocketAddr::new(iface.addr, 0)).map_err(|e| {
        Error::io(
            format!("{what}: cannot listen on {} ({})", iface.name, iface.addr),
            e,
        )
    })
}

/// Creates a unique id. Unless `NCCL_COMM_ID` is set, this also starts the
/// root in this process, on the bootstrap interface; it serves one
/// communicator init and ends (at the latest `NCCL_TIMEOUT` after the first
/// rank arrived, or after its start when none does).
pub fn get_unique_id(cfg: &Config) -> Result<UniqueId> {
    if let Some(s) = cfg.comm_id.as_deref().filter(|s| !s.trim().is_empty()) {
        let root = oxccl_netif::parse_socket_addr(s)
            .map_err(|e| Error::InvalidArgument(format!("NCCL_COMM_ID: {e}")))?;
        info!(target: "oxccl::bootstrap", "NCCL_COMM_ID is {s}: rank 0 hosts the root at {root}");
        return Ok(UniqueId(
            IdContents {
                from_env: true,
                magic: proto::comm_id_magic(s),
                root,
            }
            .encode(),
        ));
    }
    start_root(cfg)
}

/// The root thread's name: NCCL's under NCCL_SET_THREAD_NAME=1.
fn root_thread_name(cfg: &Config) -> String {
    crate::log::thread_name(cfg.set_thread_name, "oxccl-bootstrap-root".into(), || {
        "NCCL BootstrapR".into()
    })
}

/// Starts a root in this process and returns its id, whatever
/// `NCCL_COMM_ID` says: for communicators made from another one (splits),
/// which must not all meet at the one NCCL_COMM_ID address.
pub fn start_root(cfg: &Config) -> Result<UniqueId> {
    start_root_keyed(cfg, socket_key(cfg)?)
}

/// [`start_root`] with the key given (tests give one without the environment).
fn start_root_keyed(cfg: &Config, key: Option<Arc<Key>>) -> Result<UniqueId> {
    // Near the NCCL_COMM_ID address when there is one (the network the job uses).
    let near = cfg
        .comm_id
        .as_deref()
        .and_then(|s| oxccl_netif::parse_socket_addr(s).ok())
        .map(|a| a.ip());
    let iface = bootstrap_iface(cfg, near)?;
    let listener = listen_on(&iface, "bootstrap root")?;
    let magic: u64 = rand::random();
    let root = root::spawn(listener, magic, cfg.timeout(), key, root_thread_name(cfg))?;
    Ok(UniqueId(
        IdContents {
            from_env: false,
            magic,
            root,
        }
        .encode(),
    ))
}

/// What one rank reports about its progress when a peer asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerProgress {
    /// The peer answered: number of operations it has started.
    Started(u64),
    /// The peer did not answer in time or refused the connection.
    Unreachable,
}

/// A peer's answer to a query naming a collective: its count of
/// operations started, and its call of that number if it knows it.
type Answer = (u64, Option<[u8; CALL_BYTES]>);

/// What a peer answers about one collective ([`Bootstrap::query_call`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerCall {
    /// What it called under that number (an operation header's bytes).
    Called([u8; CALL_BYTES]),
    /// It knows no such call (not there yet, or long past): how many
    /// operations it has started.
    Started(u64),
}

/// Messages this rank's bootstrap sent to and received from other ranks
/// and its root, and their payload bytes (frame headers not counted),
/// since it began: [`Bootstrap::traffic`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub sent: u64,
    pub sent_bytes: u64,
    pub received: u64,
    pub received_bytes: u64,
}

/// Bruck's allgather of `mine` among `n` ranks, over `io`: `io(peer, tag,
/// Some(bytes))` sends, `io(peer, tag, None)` receives `peer`'s message
/// under `tag`. `ceil(log2 n)` messages each way per rank; rank `r`'s
/// block at index `r` of the result.
fn bruck(
    me: usize,
    n: usize,
    mine: &[u8],
    kind: u64,
    epoch: u64,
    mut io: impl FnMut(usize, u64, Option<&[u8]>, usize) -> Result<Option<Vec<u8>>>,
) -> Result<Vec<Vec<u8>>> {
    // held[i]: the block of rank me + i (mod n).
    let mut held: Vec<Vec<u8>> = vec![mine.to_vec()];
    for k in 0..proto::bruck_steps(n) {
        let (d, count) = proto::bruck_step(n, k);
        let tag = proto::internal_tag(kind, epoch, k);
        let out = proto::encode_blocks(held[..count].iter().map(Vec::as_slice));
        io((me + n - d) % n, tag, Some(&out), k)?;
        let from = (me + d) % n;
        let got = io(from, tag, None, k)?.unwrap_or_default();
        let blocks = proto::decode_blocks(&got)
            .filter(|b| b.len() == count)
            .ok_or_else(|| {
                Error::Internal(format!(
                    "bootstrap: rank {me} got a malformed message from rank {from} at step {k} of an allgather ({} bytes, {count} blocks expected)",
                    got.len()
                ))
            })?;
        held.extend(blocks);
    }
    let mut all = vec![Vec::new(); n];
    for (i, b) in held.into_iter().enumerate() {
        all[(me + i) % n] = b;
    }
    Ok(all)
}

/// A rank's bootstrap endpoint within one communicator. `Send + Sync`:
/// point-to-point calls may come from any thread; `allgather` and
/// `barrier` are collective, called by every rank in the same order (one
/// at a time per rank).
pub struct Bootstrap {
    shared: Arc<Shared>,
    service: Service,
    out: Outgoing,
    timeout: Duration,
    allgathers: AtomicU64,
    barriers: AtomicU64,
    /// The last [`Bootstrap::query_progress`] answers and when they came,
    /// which a failure report reuses rather than asking again (a hung rank
    /// costs the whole wait each time).
    last_probe: std::sync::Mutex<Option<(Instant, Vec<PeerProgress>)>>,
}

impl Bootstrap {
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    pub fn nranks(&self) -> usize {
        self.shared.nranks
    }

    /// The address this rank's service listens on.
    pub fn listen_addr(&self) -> SocketAddr {
        self.service.listen
    }

    fn check_peer(&self, peer: usize, what: &str) -> Result<()> {
        if peer >= self.nranks() {
            return Err(Error::InvalidArgument(format!(
                "bootstrap {what}: peer {peer} is out of range for {} ranks",
                self.nranks()
            )));
        }
        Ok(())
    }

    fn check_tag(tag: u64, what: &str) -> Result<()> {
        if tag >= TAG_RESERVED {
            return Err(Error::InvalidArgument(format!(
                "bootstrap {what}: tag {tag:#x} is reserved (user tags are below 2^62)"
            )));
        }
        Ok(())
    }

    /// Sends `data` to `peer` under `tag` (below [`TAG_RESERVED`]). Returns
    /// once the data is on its way; the peer may receive it any time later.
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.check_peer(peer, "send")?;
        Self::check_tag(tag, "send")?;
        self.send_raw(peer, tag, data)
    }

    fn send_raw(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        if self.shared.is_closed() {
            return Err(Error::InvalidUsage(format!(
                "bootstrap: rank {} sending to rank {peer} after its communicator was closed",
                self.rank()
            )));
        }
        if data.len() > proto::MAX_MESSAGE {
            return Err(Error::InvalidArgument(format!(
                "bootstrap: rank {} cannot send a message of {} bytes to rank {peer}: the bootstrap carries at most {} bytes a message",
                self.rank(),
                data.len(),
                proto::MAX_MESSAGE
            )));
        }
        if peer == self.rank() {
            self.shared.deliver(peer, tag, data.to_vec());
            return Ok(());
        }
        let addr = self.addr_of(peer, Instant::now() + self.timeout)?;
        self.shared.traffic.sent(data.len());
        self.out.send_to(peer, addr, tag, data, self.timeout)
    }

    /// `peer`'s listen address: known, or looked up (see
    /// [`inbox::Shared::resolve`]) by `until`.
    fn addr_of(&self, peer: usize, until: Instant) -> Result<SocketAddr> {
        self.shared.resolve(peer, until).ok_or_else(|| {
            Error::Remote(format!(
                "bootstrap: rank {} cannot learn rank {peer}'s address: the ranks asked (those nearest before it) did not answer within {} (NCCL_TIMEOUT), or rank {peer}'s communicator is closed",
                self.rank(),
                proto::secs(until.saturating_duration_since(Instant::now()))
            ))
        })
    }

    /// Waits (up to `NCCL_TIMEOUT`) for the next message from `peer` under
    /// `tag`. Fails at once when another rank reports a failure, or when
    /// this bootstrap is closed.
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.check_peer(peer, "recv")?;
        Self::check_tag(tag, "recv")?;
        self.shared
            .wait(peer, tag, self.timeout, Notices::Heed, &|| {
                format!("a message with tag {tag}")
            })
    }

    /// As [`Bootstrap::recv`], but failure notices from other ranks do not
    /// end the wait (only the timeout, an interrupt or a close do): for
    /// survivors that shrink the communicator while the excluded ranks'
    /// notices stand.
    pub fn recv_despite_failures(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.check_peer(peer, "recv")?;
        Self::check_tag(tag, "recv")?;
        self.shared
            .wait(peer, tag, self.timeout, Notices::Ignore, &|| {
                format!("a message with tag {tag}")
            })
    }

    /// Waits (up to `NCCL_TIMEOUT`) for the next message under `tag` from
    /// whichever rank sends one; returns the sender and the message.
    pub fn recv_any(&self, tag: u64) -> Result<(usize, Vec<u8>)> {
        Self::check_tag(tag, "recv")?;
        self.shared
            .wait_any(tag, self.timeout, &|| format!("a message with tag {tag}"))
    }

    /// Ends every wait of this bootstrap (those running and those to come)
    /// with an error naming `why`, until [`Bootstrap::resume`]: how a
    /// revoke stops the operations that wait on peers here.
    pub fn interrupt(&self, why: &str) {
        self.shared.interrupt(why.to_string());
    }

    /// Undoes [`Bootstrap::interrupt`].
    pub fn resume(&self) {
        self.shared.resume();
    }

    /// Failure notices from other ranks no longer end waits: after a
    /// revoke, a split or barrier among ranks that are alive goes on
    /// (one waiting on a dead rank still ends at NCCL_TIMEOUT).
    pub fn forgive_failures(&self) {
        self.shared.forgive();
    }

    /// Every rank's `mine` (of any length, each its own), indexed by rank:
    /// Bruck's exchange, `ceil(log2 nranks)` steps, in step `k` each rank
    /// sending the blocks it holds to `me - 2^k` and taking as many from
    /// `me + 2^k` (see [`proto::bruck_step`]). All blocks of one step
    /// travel as one message, of at most [`proto::MAX_MESSAGE`] bytes.
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (me, n) = (self.rank(), self.nranks());
        let epoch = self.allgathers.fetch_add(1, Ordering::SeqCst);
        bruck(
            me,
            n,
            mine,
            proto::TAG_ALLGATHER,
            epoch,
            |peer, tag, data, k| match data {
                Some(b) => self.send_raw(peer, tag, b).map(|_| None),
                None => self
                    .shared
                    .wait(peer, tag, self.timeout, Notices::Heed, &|| {
                        format!(
                        "the blocks of rank {peer} and after in allgather #{epoch} (step {} of {})",
                        k + 1,
                        proto::bruck_steps(n)
                    )
                    })
                    .map(Some),
            },
        )
    }

    /// Messages and bytes this rank exchanged with others so far (see
    /// [`Traffic`]).
    pub fn traffic(&self) -> Traffic {
        self.shared.traffic.get()
    }

    /// Returns once every rank has entered the barrier (dissemination:
    /// log2(nranks) rounds).
    pub fn barrier(&self) -> Result<()> {
        let (me, n) = (self.rank(), self.nranks());
        let epoch = self.barriers.fetch_add(1, Ordering::SeqCst);
        for (k, d) in proto::barrier_distances(n).enumerate() {
            let tag = proto::internal_tag(proto::TAG_BARRIER, epoch, k);
            self.send_raw((me + d) % n, tag, &[])?;
            self.shared
                .wait((me + n - d) % n, tag, self.timeout, Notices::Heed, &|| {
                    format!("barrier #{epoch} (round {k})")
                })?;
        }
        Ok(())
    }

    /// The counter of operations started, which the engine bumps and peers
    /// read through [`Bootstrap::query_progress`].
    pub fn progress(&self) -> &Arc<AtomicU64> {
        &self.shared.progress
    }

    /// Runs `f` for every other rank, up to [`FANOUT`] at a time.
    fn for_each_peer<T: Send>(&self, f: impl Fn(usize) -> T + Sync) -> Vec<(usize, T)> {
        let me = self.rank();
        let peers: Vec<usize> = (0..self.nranks()).filter(|&p| p != me).collect();
        let next = AtomicUsize::new(0);
        let work = || {
            let mut got = Vec::new();
            while let Some(&p) = peers.get(next.fetch_add(1, Ordering::Relaxed)) {
                got.push((p, f(p)));
            }
            got
        };
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..peers.len().min(FANOUT))
                .filter_map(|_| {
                    std::thread::Builder::new()
                        .name("oxccl-bootstrap-fanout".into())
                        .spawn_scoped(sc, work)
                        .ok()
                })
                .collect();
            // With no thread to spare, do it here.
            let mut all = if hs.is_empty() { work() } else { Vec::new() };
            for h in hs {
                all.extend(h.join().unwrap_or_default());
            }
            all
        })
    }

    /// Asks every rank how many operations it has started, indexed by rank
    /// (this rank's from its own counter). Takes at most about
    /// min(2 s, NCCL_TIMEOUT); a rank that is dead, refuses, or does not
    /// answer by then is [`PeerProgress::Unreachable`].
    pub fn query_progress(&self) -> Vec<PeerProgress> {
        let (me, n) = (self.rank(), self.nranks());
        let mut out = vec![PeerProgress::Unreachable; n];
        out[me] = PeerProgress::Started(self.shared.progress.load(Ordering::SeqCst));
        if self.shared.is_closed() {
            return out;
        }
        let deadline = Instant::now() + self.timeout.min(QUERY_WAIT);
        let magic = self.shared.magic;
        let key = self.shared.key.as_deref();
        let local = self.out.local();
        for (p, a) in self.for_each_peer(|p| {
            tcp::query(
                local,
                self.shared.resolve(p, deadline)?,
                key,
                magic,
                me as u32,
                None,
                deadline,
            )
        }) {
            if let Some((v, _)) = a {
                out[p] = PeerProgress::Started(v);
            }
        }
        *self
            .last_probe
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((Instant::now(), out.clone()));
        out
    }

    /// Writes down collective `seq`, as this rank called it (the
    /// operation header's bytes, without the path it takes), for peers to
    /// ask about ([`Bootstrap::query_call`]). Every collective, a count of
    /// 0 too, before the rank takes its path.
    pub fn record_call(&self, seq: u64, call: [u8; CALL_BYTES]) {
        self.shared.calls.record(seq, call);
    }

    /// What this rank called as collective `seq`, if it is one of the
    /// last it wrote down ([`Bootstrap::record_call`]).
    pub fn own_call(&self, seq: u64) -> Option<[u8; CALL_BYTES]> {
        self.shared.calls.get(seq)
    }

    /// Asks `peers` (each at most once, together) what they called as
    /// collective `seq`, waiting at most `wait`: a peer that answers and
    /// has called it gives [`PeerCall::Called`]; one that answers without
    /// it (not there yet, or long past) [`PeerCall::Started`] with its
    /// count of operations started; one that does not answer is left
    /// out. Costs a connection per peer: for long waits only.
    pub fn query_call(&self, peers: &[usize], seq: u64, wait: Duration) -> Vec<(usize, PeerCall)> {
        if self.shared.is_closed() {
            return Vec::new();
        }
        let me = self.rank();
        let mut peers: Vec<usize> = peers
            .iter()
            .copied()
            .filter(|&p| p != me && p < self.nranks())
            .collect();
        peers.sort_unstable();
        peers.dedup();
        let deadline = Instant::now() + wait.min(self.timeout);
        let (magic, key, local) = (
            self.shared.magic,
            self.shared.key.as_deref(),
            self.out.local(),
        );
        let ask = |p: usize| {
            tcp::query(
                local,
                self.shared.resolve(p, deadline)?,
                key,
                magic,
                me as u32,
                Some(seq),
                deadline,
            )
        };
        let answers: Vec<(usize, Option<Answer>)> = if peers.len() == 1 {
            peers.iter().map(|&p| (p, ask(p))).collect()
        } else {
            std::thread::scope(|sc| {
                let hs: Vec<_> = peers
                    .iter()
                    .take(FANOUT)
                    .map(|&p| (p, sc.spawn(move || ask(p))))
                    .collect();
                hs.into_iter()
                    .map(|(p, h)| (p, h.join().ok().flatten()))
                    .collect()
            })
        };
        answers
            .into_iter()
            .filter_map(|(p, a)| {
                let (n, call) = a?;
                Some((p, call.map_or(PeerCall::Started(n), PeerCall::Called)))
            })
            .collect()
    }

    /// [`Bootstrap::query_progress`]'s answers, taken at most `fresh` ago,
    /// else asked now.
    pub fn recent_progress(&self, fresh: Duration) -> Vec<PeerProgress> {
        self.cached_progress(fresh)
            .unwrap_or_else(|| self.query_progress())
    }

    /// [`Bootstrap::query_progress`]'s answers if taken at most `fresh` ago.
    pub fn cached_progress(&self, fresh: Duration) -> Option<Vec<PeerProgress>> {
        self.last_probe
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .filter(|(at, _)| at.elapsed() <= fresh)
            .map(|(_, p)| p.clone())
    }

    /// Tells every other rank that this one failed, with `message`; their
    /// waiting `recv`s fail with it. Best effort, on fresh connections (a
    /// stuck cached one cannot delay it), bounded to about two seconds.
    /// Each notice is waited for until the peer's reader has recorded it
    /// (it closes the connection after; at most [`ABORT_TAKEN`]), so that
    /// a peer that sees this rank leave afterwards (a closed connection,
    /// a dead process) knows its notice is already there and need not
    /// wait for one.
    pub fn broadcast_failure(&self, message: &str) {
        if self.shared.is_closed() {
            return;
        }
        let me = self.rank();
        let mut payload = message.as_bytes().to_vec();
        payload.truncate(64 << 10);
        let f = Frame {
            magic: self.shared.magic,
            kind: proto::ABORT,
            from: me as u32,
            tag: 0,
            payload,
        };
        let deadline = Instant::now() + ABORT_WAIT;
        let sent = self.for_each_peer(|p| {
            let d = deadline.min(Instant::now() + ABORT_PER_PEER);
            let Some(addr) = self.shared.resolve(p, d) else {
                debug!(target: "oxccl::bootstrap", "rank {me}: cannot tell rank {p} about the failure: its address is not known and no rank asked gave it");
                return false;
            };
            match tcp::one_shot(
                self.out.local(),
                addr,
                self.shared.key.as_deref(),
                &f,
                d,
            ) {
                Ok(s) => {
                    let _ = s.tcp().shutdown(std::net::Shutdown::Write);
                    let taken = d.min(Instant::now() + ABORT_TAKEN);
                    tcp::wait_closed(s.tcp(), taken);
                    true
                }
                Err(e) => {
                    debug!(target: "oxccl::bootstrap", "rank {me}: cannot tell rank {p} about the failure: {e}");
                    false
                }
            }
        });
        let missed: Vec<usize> = sent.iter().filter(|(_, ok)| !ok).map(|(p, _)| *p).collect();
        if !missed.is_empty() {
            info!(target: "oxccl::bootstrap", "rank {me}: could not tell ranks {missed:?} about the failure");
        }
    }

    /// The first failure another rank reported: (rank, message).
    pub fn remote_failure(&self) -> Option<(usize, String)> {
        self.shared.failure()
    }

    /// Stops the service threads and closes every connection; blocked and
    /// later `recv`s and `send`s fail. Idempotent.
    pub fn close(&self) {
        self.service.stop();
        self.out.shutdown_all();
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests;
