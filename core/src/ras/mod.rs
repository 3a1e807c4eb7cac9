//! RAS: a live view of a running job, answering NCCL's RAS client protocol
//! (`ncclras`, `oxccl ras`, or `echo status | nc localhost 28028`).
//!
//! Each process keeps a [`CommRecord`] per communicator rank it holds:
//! state, error, collectives launched per kind and the one in flight. With
//! NCCL_RAS_ENABLE=1 (NCCL's default) the first communicator starts the
//! process's RAS service ([`service`]): a peer listener on the bootstrap's
//! interface, whose address every rank learns at creation (the ranks'
//! facts exchange), and a client listener on NCCL_RAS_ADDR, which every
//! process of the job binds together (SO_REUSEPORT) as NCCL's does.
//!
//! A client's `STATUS` makes the process that took the connection ask every
//! process it knows of (and those they know of) for its records, each
//! within the client's timeout, and answer with NCCL's report
//! ([`report`]): the job summary, the communicators table, errors and
//! warnings, plus oxccl's own rank table naming the ranks that are missing
//! or stuck and the operation each is in. The wire format between
//! processes is [`wire`]'s; gathering and formatting are pure functions
//! tested without sockets.

pub mod report;
pub mod service;
pub mod wire;

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// NCCL's RAS client protocol version (ras_internal.h,
/// NCCL_RAS_CLIENT_PROTOCOL).
pub const CLIENT_PROTOCOL: u32 = 2;

/// NCCL's default RAS client port (NCCL_RAS_CLIENT_PORT).
pub const CLIENT_PORT: u16 = 28028;

/// How long a query waits for each process, unless the client says
/// (NCCL's RAS_COLLECTIVE_LEG_TIMEOUT_SEC), before NCCL_RAS_TIMEOUT_FACTOR.
pub const LEG_TIMEOUT: Duration = Duration::from_secs(5);

/// NCCL's collective names, in NCCL's order (`ncclFuncStr`), by which the
/// report counts operations.
pub const FUNCS: [&str; 5] = [
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AllReduce",
];

/// The index in [`FUNCS`] of collective `c`.
pub fn func_index(c: crate::algo::Coll) -> usize {
    use crate::algo::Coll;
    match c {
        Coll::Broadcast { .. } => 0,
        Coll::Reduce { .. } => 1,
        Coll::AllGather => 2,
        Coll::ReduceScatter => 3,
        Coll::AllReduce => 4,
    }
}

/// A rank's state as the report names it (NCCL's statusStr, NOCOMM aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    Init = 1,
    Running = 2,
    Finalize = 3,
    Abort = 4,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Init => "INIT",
            State::Running => "RUNNING",
            State::Finalize => "FINALIZE",
            State::Abort => "ABORT",
        }
    }

    pub fn from_name(s: &str) -> Option<State> {
        Some(match s {
            "INIT" => State::Init,
            "RUNNING" => State::Running,
            "FINALIZE" => State::Finalize,
            "ABORT" => State::Abort,
            _ => return None,
        })
    }

    fn from_u8(v: u8) -> State {
        match v {
            1 => State::Init,
            3 => State::Finalize,
            4 => State::Abort,
            _ => State::Running,
        }
    }
}

/// The collective a rank is in: its kind ([`FUNCS`] index) and its number
/// among the communicator's collectives (1 for the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Flight {
    func: usize,
    number: u64,
    since: Instant,
}

/// One rank of one communicator in this process, as RAS reports it.
#[derive(Debug)]
pub struct CommRecord {
    pub hash: u64,
    pub rank: usize,
    pub nranks: usize,
    pub device: Option<usize>,
    state: AtomicU8,
    retired: std::sync::atomic::AtomicBool,
    counts: [AtomicU64; 5],
    error: Mutex<Option<String>>,
    flight: Mutex<Option<Flight>>,
    /// Every rank's process and GPU, learnt at creation.
    map: Mutex<Vec<(wire::PeerId, i32)>>,
}

/// The records of this process; dropped ones fall out.
static RECORDS: Mutex<Vec<Weak<CommRecord>>> = Mutex::new(Vec::new());

impl CommRecord {
    /// A record for rank `rank` of the communicator `hash`, in state INIT,
    /// listed for RAS queries; `None` when RAS is off.
    pub fn new(
        enabled: bool,
        hash: u64,
        rank: usize,
        nranks: usize,
        device: Option<usize>,
    ) -> Option<Arc<CommRecord>> {
        if !enabled {
            return None;
        }
        let r = Arc::new(CommRecord {
            hash,
            rank,
            nranks,
            device,
            state: AtomicU8::new(State::Init as u8),
            retired: Default::default(),
            counts: Default::default(),
            error: Mutex::new(None),
            flight: Mutex::new(None),
            map: Mutex::new(Vec::new()),
        });
        let mut all = RECORDS.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&r));
        Some(r)
    }

    pub fn set_state(&self, s: State) {
        self.state.store(s as u8, Ordering::SeqCst);
    }

    pub fn state(&self) -> State {
        State::from_u8(self.state.load(Ordering::SeqCst))
    }

    /// The communicator failed (init or an operation): the report's ERROR.
    pub fn set_error(&self, why: &str) {
        let mut e = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if e.is_none() {
            *e = Some(why.replace(['\n', '\r'], " "));
        }
    }

    /// Destroyed: no longer reported (NCCL's NOCOMM for peers that ask).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }

    /// Every rank's process (RAS peer id) and GPU (-1: host memory).
    pub fn set_map(&self, map: Vec<(wire::PeerId, i32)>) {
        *self.map.lock().unwrap_or_else(|p| p.into_inner()) = map;
    }

    /// A collective of kind `func` ([`FUNCS`]) launched without being
    /// followed to its end (the device path: stream-ordered).
    pub fn launched(&self, func: usize) {
        if let Some(c) = self.counts.get(func) {
            c.fetch_add(1, Ordering::SeqCst);
        }
        // oxccl's finalize is a barrier after which the communicator still
        // works: an operation after it makes the rank RUNNING again.
        let _ = self.state.compare_exchange(
            State::Finalize as u8,
            State::Running as u8,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// Collective `seq` (0 for the communicator's first) of kind `func`
    /// starts here; it is in flight until the guard drops.
    pub fn begin(self: &Arc<Self>, func: usize, seq: u64) -> InFlight {
        self.launched(func);
        *self.flight.lock().unwrap_or_else(|p| p.into_inner()) = Some(Flight {
            func,
            number: seq + 1,
            since: Instant::now(),
        });
        InFlight {
            record: self.clone(),
            number: seq + 1,
        }
    }

    fn dump(&self, now: Instant) -> wire::RankDump {
        let flight = *self.flight.lock().unwrap_or_else(|p| p.into_inner());
        wire::RankDump {
            hash: self.hash,
            rank: self.rank,
            nranks: self.nranks,
            device: self.device.map_or(-1, |d| d as i32),
            state: self.state(),
            counts: std::array::from_fn(|i| self.counts[i].load(Ordering::SeqCst)),
            flight: flight.map(|f| wire::FlightDump {
                func: f.func,
                number: f.number,
                elapsed: now.saturating_duration_since(f.since),
            }),
            error: self.error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }
}

/// A collective in flight on a record; its drop ends it.
pub struct InFlight {
    record: Arc<CommRecord>,
    number: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut f = self.record.flight.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_some_and(|f| f.number == self.number) {
            *f = None;
        }
    }
}

/// This process's records now, with the communicators' maps (one per
/// communicator) and every process they name.
pub fn local_dump(me: &wire::PeerId, host: &str) -> wire::ProcDump {
    let now = Instant::now();
    let live: Vec<Arc<CommRecord>> = RECORDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|r| !r.retired.load(Ordering::SeqCst))
        .collect();
    let mut out = wire::ProcDump {
        id: me.clone(),
        host: host.to_string(),
        ranks: Vec::new(),
        maps: Vec::new(),
        peers: Vec::new(),
    };
    for r in &live {
        out.ranks.push(r.dump(now));
        let map = r.map.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if map.is_empty() || out.maps.iter().any(|(h, _)| *h == r.hash) {
            continue;
        }
        for (p, _) in &map {
            if p != me && !out.peers.contains(p) {
                out.peers.push(p.clone());
            }
        }
        out.maps.push((r.hash, map));
    }
    out
}

/// The map of a communicator from the ranks' RAS ids and GPUs (-1: host
/// memory), as exchanged at creation; empty where some rank has RAS off.
pub fn map_of(ids: &[String], devices: &[i32]) -> Vec<(wire::PeerId, i32)> {
    let parsed: Option<Vec<wire::PeerId>> = ids.iter().map(|s| s.parse().ok()).collect();
    match parsed {
        Some(p) if p.len() == devices.len() => p.into_iter().zip(devices.iter().copied()).collect(),
        _ => Vec::new(),
    }
}
