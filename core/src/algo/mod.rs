//! Algorithms as pure schedules: for one rank, the ordered steps that move
//! and combine data. Host and GPU executors both run the same [`Step`]s.
//!
//! A step works element-wise over `count` elements, sliced by the executor
//! for pipelining; for each slice:
//!
//! ```text
//! received = data from `recv` (if any)
//! local    = `src` (scaled on entry if it is this rank's input, see reduce.rs)
//! result   = combine(local, received) | received | local
//! result   = finalize ? post_op(result) : result
//! `dst` <- result;  `send` <- send_local ? local : result
//! ```
//!
//! which covers NCCL's primitives (send, recvReduceSend, recvReduceCopySend,
//! recvCopySend, recv) and the exchange of recursive doubling.

pub mod cost;
pub mod pat;
pub mod pull;
pub mod rec_doubling;
pub mod ring;
pub mod setting;
pub mod tree;

/// Which user buffer a region lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    Input,
    Output,
    /// Room the executor gives the operation for partial results that
    /// wait for a later step (PAT's reduce-scatter); its size is the
    /// schedule's to say ([`pat::scratch_blocks`]).
    Scratch,
}

/// `count` elements (given by the step) starting at `offset` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub buf: Buf,
    pub offset: usize,
}

impl Region {
    pub fn input(offset: usize) -> Region {
        Region {
            buf: Buf::Input,
            offset,
        }
    }
    pub fn output(offset: usize) -> Region {
        Region {
            buf: Buf::Output,
            offset,
        }
    }
    pub fn scratch(offset: usize) -> Region {
        Region {
            buf: Buf::Scratch,
            offset,
        }
    }
}

/// One step of a schedule (see the module doc for its meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub count: usize,
    pub recv: Option<usize>,
    pub send: Option<usize>,
    pub src: Option<Region>,
    pub dst: Option<Region>,
    /// Send the local operand as it stands, before combining (an exchange);
    /// the send is posted before waiting for the receive.
    pub send_local: bool,
    /// The result is final: apply the op's post-processing (integer average).
    pub finalize: bool,
}

impl Step {
    pub(crate) fn new(count: usize) -> Step {
        Step {
            count,
            recv: None,
            send: None,
            src: None,
            dst: None,
            send_local: false,
            finalize: false,
        }
    }
    pub(crate) fn recv(mut self, peer: usize) -> Step {
        self.recv = Some(peer);
        self
    }
    pub(crate) fn send(mut self, peer: usize) -> Step {
        self.send = Some(peer);
        self
    }
    pub(crate) fn src(mut self, r: Region) -> Step {
        self.src = Some(r);
        self
    }
    pub(crate) fn dst(mut self, r: Region) -> Step {
        self.dst = Some(r);
        self
    }
    pub(crate) fn finalize(mut self) -> Step {
        self.finalize = true;
        self
    }
    pub(crate) fn send_local(mut self) -> Step {
        self.send_local = true;
        self
    }
}

/// A collective, with its per-rank element count (`count` as NCCL defines
/// it for each: all-gather's send count, reduce-scatter's receive count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    Broadcast { root: usize },
    Reduce { root: usize },
    AllGather,
    ReduceScatter,
}

impl Coll {
    pub fn name(&self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::Broadcast { .. } => "broadcast",
            Coll::Reduce { .. } => "reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
        }
    }
}

/// An algorithm a collective can run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Pipelined ring (chain for broadcast and reduce): bandwidth-optimal.
    Ring,
    /// Recursive doubling: log2(n) exchanges, for small all-reduces.
    RecDoubling,
    /// Double binary tree: reduce up, broadcast down, 2·log2(n) hops, for
    /// all-reduces on many ranks.
    Tree,
    /// Log-depth all-gather and reduce-scatter for one rank per node
    /// (NCCL's PAT row; see [`pat`] for what it is and how it differs
    /// from NCCL's).
    Pat,
}

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "Ring",
            Algo::RecDoubling => "RecDoubling",
            Algo::Tree => "Tree",
            Algo::Pat => "PAT",
        }
    }

    /// NCCL_ALGO names. NCCL's `Tree` is the tree row of the cost table,
    /// which holds both our tree-shaped all-reduces (see
    /// [`cost::nccl_cell`]); it parses as [`Algo::Tree`] and a forced
    /// algorithm admits every algorithm of its row.
    pub fn parse(s: &str) -> Option<Algo> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ring" => Some(Algo::Ring),
            "tree" => Some(Algo::Tree),
            "recdoubling" | "rd" => Some(Algo::RecDoubling),
            "pat" => Some(Algo::Pat),
            _ => None,
        }
    }

    pub fn supports(self, coll: Coll) -> bool {
        match self {
            Algo::Ring => true,
            Algo::RecDoubling | Algo::Tree => coll == Coll::AllReduce,
            Algo::Pat => matches!(coll, Coll::AllGather | Coll::ReduceScatter),
        }
    }

    /// Every algorithm, in the order the cost model tries them (new ones
    /// go last: [`Algo::code`] is a place in this list).
    pub const ALL: [Algo; 4] = [Algo::Ring, Algo::RecDoubling, Algo::Tree, Algo::Pat];

    /// One byte on the wire (operation headers, rank facts): 1 + its place
    /// in [`Algo::ALL`]; 0 is left for "none".
    pub fn code(self) -> u8 {
        1 + Algo::ALL.iter().position(|&a| a == self).unwrap_or(0) as u8
    }

    /// The algorithm of [`Algo::code`] `c`, if any.
    pub fn from_code(c: u8) -> Option<Algo> {
        Algo::ALL.get((c as usize).checked_sub(1)?).copied()
    }
}

/// The steps of `rank` for the part `[lo, hi)` of each rank's block, with
/// the ring in rank order and the first tree, one step per block where a
/// schedule could join blocks (see [`schedule_on`]'s `join`).
pub fn schedule(
    algo: Algo,
    coll: Coll,
    rank: usize,
    nranks: usize,
    count: usize,
    lo: usize,
    hi: usize,
) -> Vec<Step> {
    let order: Vec<usize> = (0..nranks).collect();
    schedule_on(algo, coll, rank, &order, 0, count, lo, hi, 0)
}

/// The steps of `rank` for the part `[lo, hi)` of each rank's block on
/// channel `chan`, with the ranks in ring order `order` (a permutation of
/// the ranks; trees are built over it too). Even channels take the first
/// tree and odd ones the second: the double binary tree. `join`: the most
/// elements a step may carry where a schedule joins whole blocks into one
/// step whose reads start elsewhere than the writes before them (PAT's
/// reduce-scatter); 0 for one step per block. The host executor says what
/// it can take ([`crate::exec::joinable`]).
#[allow(clippy::too_many_arguments)]
pub fn schedule_on(
    algo: Algo,
    coll: Coll,
    rank: usize,
    order: &[usize],
    chan: usize,
    count: usize,
    lo: usize,
    hi: usize,
    join: usize,
) -> Vec<Step> {
    let nranks = order.len();
    if nranks == 1 {
        return local_only(coll, lo, hi);
    }
    match (algo, coll) {
        (Algo::RecDoubling, Coll::AllReduce) => rec_doubling::all_reduce(rank, nranks, lo, hi),
        (Algo::Tree, Coll::AllReduce) => tree::all_reduce(rank, order, chan % 2, lo, hi),
        (Algo::Pat, Coll::AllGather) => pat::all_gather(rank, nranks, count, lo, hi),
        (Algo::Pat, Coll::ReduceScatter) => pat::reduce_scatter(rank, nranks, count, lo, hi, join),
        (_, Coll::AllReduce) => ring::all_reduce(rank, order, lo, hi),
        (_, Coll::AllGather) => ring::all_gather(rank, order, count, lo, hi),
        (_, Coll::ReduceScatter) => ring::reduce_scatter(rank, order, count, lo, hi),
        (_, Coll::Broadcast { root }) => ring::broadcast(rank, order, root, lo, hi),
        (_, Coll::Reduce { root }) => ring::reduce(rank, order, root, lo, hi),
    }
}

/// The ring order that crosses between hosts once per host: ranks grouped
/// by host (hosts in order of their lowest rank), rank order inside each.
/// Both ends of every connection must compute the same order, so it
/// depends only on facts every rank holds.
pub fn ring_order(hosts: &[u64]) -> Vec<usize> {
    let mut first: Vec<(usize, u64)> = Vec::new();
    for (r, h) in hosts.iter().enumerate() {
        if !first.iter().any(|(_, x)| x == h) {
            first.push((r, *h));
        }
    }
    first
        .iter()
        .flat_map(|(_, h)| (0..hosts.len()).filter(move |&r| hosts[r] == *h))
        .collect()
}

/// One rank: the output is the input, put through the op's pre and post steps.
fn local_only(coll: Coll, lo: usize, hi: usize) -> Vec<Step> {
    let _ = coll;
    vec![Step::new(hi - lo)
        .src(Region::input(lo))
        .dst(Region::output(lo))
        .finalize()]
}

/// Splits `[lo, hi)` into `parts` nearly equal consecutive pieces.
pub(crate) fn split(lo: usize, hi: usize, parts: usize, i: usize) -> (usize, usize) {
    let len = (hi - lo) as u128;
    let at = |k: usize| lo + (len * k as u128 / parts as u128) as usize;
    (at(i), at(i + 1))
}

#[cfg(test)]
pub(crate) mod sim;
