//! How a rank joins: through one root, which answers its hello with the
//! neighbours' addresses, or through several (`ncclCommInitRankScalable`,
//! the blocks' first ranks passing their addresses along, `super::roots`);
//! the hello and answer with a root ([`join_root`]). The bootstrap then
//! runs as `super` describes, whichever way it was joined.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_secure::{Key, Role};
use tracing::{debug, info};

use super::inbox::{Counters, Notices, Shared};
use super::proto::{self, Frame, FrameReader, Hello, IdContents};
use super::service::Service;
use super::tcp::{self, Link, Outgoing};
use super::{
    bootstrap_iface, listen_on, protection_lines, root, root_thread_name, roots, socket_key,
    Bootstrap, UniqueId, HANDSHAKE_WAIT,
};
use crate::config::Config;
use crate::error::{Error, Result};

impl Bootstrap {
    /// Joins the communicator described by `id` as `rank` of `nranks`:
    /// starts serving peers, reaches the root (retrying until
    /// `NCCL_TIMEOUT` while it is not up), and learns every rank's address.
    pub fn init(id: &UniqueId, rank: usize, nranks: usize, cfg: &Config) -> Result<Bootstrap> {
        Bootstrap::init_keyed(id, rank, nranks, cfg, socket_key(cfg)?)
    }

    /// Joins through several roots, one per id (NCCL's
    /// `ncclCommInitRankScalable`): the ranks are spread over the roots as
    /// NCCL spreads them ([`roots::first_of`]), each rank says hello to its
    /// own root, and the first rank of each root's block also to the root
    /// before, which links the blocks; each root answers with neighbours,
    /// the first ranks pass their addresses along and back, and each hands
    /// them down its block ([`roots::pass_leaders`]). Other addresses are
    /// looked up when needed, as after one root. One id is
    /// [`Bootstrap::init`].
    pub fn init_scalable(
        ids: &[UniqueId],
        rank: usize,
        nranks: usize,
        cfg: &Config,
    ) -> Result<Bootstrap> {
        match ids {
            [] => Err(Error::InvalidArgument(
                "no unique id: nId is 0, and at least one is needed".into(),
            )),
            [one] => Bootstrap::init(one, rank, nranks, cfg),
            _ => Bootstrap::init_roots(ids, rank, nranks, cfg, socket_key(cfg)?),
        }
    }

    fn init_roots(
        ids: &[UniqueId],
        rank: usize,
        nranks: usize,
        cfg: &Config,
        key: Option<Arc<Key>>,
    ) -> Result<Bootstrap> {
        let k = ids.len();
        if k > nranks {
            return Err(Error::InvalidArgument(format!(
                "nId is {k}, more unique ids than the {nranks} ranks (at most one root per rank)"
            )));
        }
        if rank >= nranks || nranks > proto::MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} of nranks {nranks}: rank must be below nranks, and nranks at most {}",
                proto::MAX_RANKS
            )));
        }
        let mut cs = Vec::with_capacity(k);
        for (i, id) in ids.iter().enumerate() {
            let c = IdContents::decode(&id.0).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unique id {i} of {k} was not made by oxccl's get_unique_id (unknown version or address)"
                ))
            })?;
            if c.from_env {
                return Err(Error::InvalidArgument(format!(
                    "unique id {i} of {k} names NCCL_COMM_ID's root, which is one: with NCCL_COMM_ID set, pass one id (nId 1)"
                )));
            }
            if let Some(j) = cs
                .iter()
                .position(|o: &IdContents| o.root == c.root && o.magic == c.magic)
            {
                return Err(Error::InvalidArgument(format!(
                    "unique ids {j} and {i} of {k} are the same: each root needs its own id (call ncclGetUniqueId once per id)"
                )));
            }
            cs.push(c);
        }
        let timeout = cfg.timeout();
        let mine = roots::root_of(rank, nranks, k);
        // Ranks talk under the first id's magic; each root under its own.
        let magic = cs[0].magic;
        let (iface, shared, service) =
            serve(cfg, cs[mine].root.ip(), rank, nranks, magic, key.clone())?;
        let unknown = SocketAddr::from(([0, 0, 0, 0], 0));
        let mut table: Vec<Option<SocketAddr>> = vec![None; nranks];
        // The first rank of a block after the first joins the root before
        // too (as the last of its set), then its own.
        let mut joins = Vec::new();
        if mine > 0 && roots::first_of(mine, nranks, k) == rank {
            joins.push(mine - 1);
        }
        joins.push(mine);
        for r in joins {
            let set = roots::set_of(r, nranks, k);
            let local = set
                .iter()
                .position(|&x| x == rank)
                .expect("a rank of its set");
            let hello = Hello {
                rank: local,
                nranks: set.len(),
                listen: service.listen,
                neighbours: true,
            };
            let t = join_root(&cs[r], &hello, key.as_deref(), timeout, cfg.socket_retry(), &shared.traffic).map_err(|e| {
                e.context(format!(
                    "joining root {r} of {k} (ranks {}..={} of {nranks}; its ranks are numbered from 0 in its messages)",
                    set[0],
                    set[set.len() - 1]
                ))
            })?;
            // The root answers with the neighbours in the set (and this
            // rank); the others are unknown here.
            for (x, a) in set.iter().zip(t) {
                if a != unknown {
                    table[*x] = Some(a);
                }
            }
        }
        let partial: Vec<_> = table.iter().map(|a| a.unwrap_or(unknown)).collect();
        shared.set_table(&partial);
        let out = Outgoing::new(rank, magic, key, partial.clone());
        let leaders = roots::pass_leaders(rank, nranks, k, service.listen, |peer, step, t| {
            let tag = proto::internal_tag(proto::TAG_JOIN, 0, step);
            match t {
                Some(t) => {
                    let b = proto::encode_entries(t);
                    shared.traffic.sent(b.len());
                    out.send(peer, tag, &b, timeout).map(|_| None)
                }
                None => shared
                    .wait(peer, tag, timeout, Notices::Heed, &|| {
                        "the addresses of the blocks' first ranks".to_string()
                    })
                    .and_then(|b| {
                        proto::decode_entries(&b)
                            .filter(|e| e.len() <= k && e.iter().all(|&(r, _)| r < nranks))
                            .map(Some)
                            .ok_or_else(|| {
                                Error::Internal(format!(
                                    "bootstrap: rank {rank} got a malformed list of the blocks' first ranks from rank {peer}"
                                ))
                            })
                    }),
            }
        })?;
        let mut full = partial;
        for (r, a) in leaders {
            full[r] = a;
        }
        debug!(target: "oxccl::bootstrap", rank, nranks, roots = k, "bootstrap ready on {} ({}) through {k} roots", iface.name, service.listen);
        // The connections the leaders' pass opened (to neighbours, each
        // after a key exchange where a key is set) serve the bootstrap on.
        Ok(ready(full, out, shared, service))
    }

    /// [`Bootstrap::init`] with the key given.
    pub(super) fn init_keyed(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        cfg: &Config,
        key: Option<Arc<Key>>,
    ) -> Result<Bootstrap> {
        if rank >= nranks {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is out of range: nranks is {nranks}, so rank must be below it"
            )));
        }
        if nranks > proto::MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "nranks {nranks} is above the {} ranks oxccl supports",
                proto::MAX_RANKS
            )));
        }
        let c = IdContents::decode(&id.0).ok_or_else(|| {
            Error::InvalidArgument(
                "the unique id was not made by oxccl's get_unique_id (unknown version or address)"
                    .into(),
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
            root::spawn(l, c.magic, timeout, key.clone(), root_thread_name(cfg))?;
        }
        let (iface, shared, service) = serve(cfg, c.root.ip(), rank, nranks, c.magic, key.clone())?;
        let hello = Hello {
            rank,
            nranks,
            listen: service.listen,
            neighbours: true,
        };
        // On failure, dropping `service` stops its thread. The root sends
        // the neighbours' addresses only; the others are looked up through
        // them when first needed.
        let near = join_root(
            &c,
            &hello,
            key.as_deref(),
            timeout,
            cfg.socket_retry(),
            &shared.traffic,
        )?;
        debug!(target: "oxccl::bootstrap", rank, nranks, "bootstrap ready on {} ({}), root {}", iface.name, service.listen, c.root);
        let out = Outgoing::new(rank, c.magic, key, near.clone());
        Ok(ready(near, out, shared, service))
    }
}

/// Binds this rank's listener on the bootstrap interface (the one that
/// reaches `root`), says which (NCCL's INIT line, which users grep for),
/// and starts serving peers: before the table exists, since peers may
/// write as soon as they have it.
fn serve(
    cfg: &Config,
    root: std::net::IpAddr,
    rank: usize,
    nranks: usize,
    magic: u64,
    key: Option<Arc<Key>>,
) -> Result<(oxccl_netif::Iface, Arc<Shared>, Service)> {
    let iface = bootstrap_iface(cfg, Some(root))?;
    let listener = listen_on(&iface, "bootstrap")?;
    info!(target: "oxccl::init", "Bootstrap: Using {}:{}<0>", iface.name, iface.addr);
    if rank == 0 {
        for line in protection_lines(key.is_some()) {
            info!(target: "oxccl::init", "Security: {line}");
        }
    }
    // Bounded by NCCL_TIMEOUT too, so that a short one (tests, quick
    // failure detection) frees silent connections' threads as soon.
    let timeout = cfg.timeout();
    let first_wait = HANDSHAKE_WAIT.min(timeout.max(Duration::from_secs(1)));
    let shared = Arc::new(Shared::new(rank, nranks, magic, key, first_wait, timeout));
    let service = Service::start(shared.clone(), listener)?;
    Ok((iface, shared, service))
}

/// The joined bootstrap: `table` holds the addresses this rank learned
/// (the others unspecified, looked up when needed); `out` sends to them.
fn ready(
    table: Vec<SocketAddr>,
    out: Outgoing,
    shared: Arc<Shared>,
    service: Service,
) -> Bootstrap {
    shared.set_table(&table);
    shared.set_lazy();
    Bootstrap {
        out,
        timeout: shared.timeout,
        shared,
        service,
        allgathers: AtomicU64::new(0),
        last_probe: std::sync::Mutex::new(None),
        barriers: AtomicU64::new(0),
    }
}

/// Says hello to the root (retrying while it is not up) and reads the
/// address table, or the root's error.
fn join_root(
    c: &IdContents,
    hello: &Hello,
    key: Option<&Key>,
    timeout: Duration,
    retry: Option<oxccl_netif::Retry>,
    traffic: &Counters,
) -> Result<Vec<std::net::SocketAddr>> {
    let (rank, nranks) = (hello.rank, hello.nranks);
    let hint = if c.from_env {
        " (rank 0 hosts it, as NCCL_COMM_ID is set: is rank 0 running?)"
    } else {
        ""
    };
    let start = Instant::now();
    let s = tcp::connect_retry(c.root, start + timeout, retry).map_err(|e| {
        Error::Remote(format!(
            "bootstrap: rank {rank} could not reach the root at {} within {} (NCCL_TIMEOUT): {e}{hint}",
            c.root,
            proto::secs(timeout)
        ))
    })?;
    let _ = s.set_nodelay(true);
    let mut s = Link::open(s, key, Role::Initiator, c.magic, timeout).map_err(|e| {
        Error::Remote(format!(
            "bootstrap: rank {rank} was refused by the root at {} in the key exchange: {e}",
            c.root
        ))
    })?;
    let hello_frame = Frame {
        magic: c.magic,
        kind: proto::HELLO,
        from: rank as u32,
        tag: 0,
        payload: hello.encode(),
    };
    traffic.sent(hello_frame.payload.len());
    s.tcp()
        .set_write_timeout(Some(timeout))
        .and_then(|_| std::io::Write::write_all(&mut s, &hello_frame.encode()))
        .map_err(|e| {
            Error::Remote(format!(
                "bootstrap: rank {rank} cannot send its hello to the root at {}: {e}",
                c.root
            ))
        })?;
    // The root answers when every rank is in, or at its deadline (at most
    // NCCL_TIMEOUT after the first hello): wait a little longer than that.
    let _ = s
        .tcp()
        .set_read_timeout(Some(timeout + Duration::from_secs(2)));
    let max = (nranks * proto::ADDR_BYTES).max(64 << 10);
    let why = if key.is_some() {
        ", or it refused a message of ours as tampered"
    } else {
        ", or it expects encrypted traffic: NCCL_SOCKET_KEY_FILE set there and not here"
    };
    let f = match tcp::read_frame(&mut s, &mut FrameReader::new(c.magic, max)) {
        Ok(Some(f)) => f,
        Ok(None) => {
            return Err(Error::Remote(format!(
                "bootstrap: the root at {} closed the connection without answering rank {rank} (its process died, it serves another unique id, the communicator formed without this rank{why}; its log says why)",
                c.root
            )))
        }
        Err(e) => {
            return Err(Error::Remote(format!(
                "bootstrap: rank {rank} got no answer from the root at {} after {}: {e}{}",
                c.root,
                proto::secs(start.elapsed()),
                if e.kind() == std::io::ErrorKind::ConnectionReset { format!(" ({why})") } else { String::new() }
            )))
        }
    };
    traffic.received(f.payload.len());
    match f.kind {
        proto::NEIGHBOURS => {
            let unknown = SocketAddr::from(([0, 0, 0, 0], 0));
            let mut t = vec![unknown; nranks];
            t[rank] = hello.listen;
            let near = proto::neighbours(rank, nranks);
            let got = proto::decode_entries(&f.payload)
                .filter(|e| e.iter().map(|(r, _)| *r).eq(near.iter().copied()))
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "bootstrap: rank {rank} got a malformed list of neighbours from the root at {}",
                        c.root
                    ))
                })?;
            for (r, a) in got {
                t[r] = a;
            }
            Ok(t)
        }
        proto::TABLE => {
            let t = proto::decode_table(&f.payload)
                .filter(|t| t.len() == nranks && t[rank] == hello.listen)
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "bootstrap: rank {rank} got a malformed address table from the root at {}",
                        c.root
                    ))
                })?;
            Ok(t)
        }
        proto::ERROR => Err(proto::decode_error(&f.payload)),
        k => Err(Error::Internal(format!(
            "bootstrap: unexpected frame kind {k} from the root at {}",
            c.root
        ))),
    }
}
