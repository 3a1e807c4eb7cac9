//! All-reduce through a CollNet plugin on host memory, as NCCL's CollNet
//! chain: the network reduces in the fabric, and one rank per node talks
//! to it. An all-reduce runs in three steps:
//!
//! 1. a reduce to the first rank of each node (its leader), on the
//!    communicator of the node's ranks, split from this one;
//! 2. on each leader, the collnet's `iallreduce` in place across the
//!    leaders (one per node), driven to completion through `test`;
//! 3. a broadcast from the leader on its node's communicator.
//!
//! All-gather and reduce-scatter run the same way where the plugin offers
//! `iallgather` and `ireducescatter` (v8 on, non-NULL on every rank) and
//! every node has as many ranks: an all-gather inside the node into the
//! node's part of the result, the collnet's `iallgather` of the nodes'
//! parts among the leaders, and a broadcast of the whole result in the
//! node; a reduce-scatter reduces all blocks to the leader, which runs the
//! collnet's `ireducescatter` for its node's blocks and broadcasts them in
//! the node, each rank keeping its own. Where ranks are not numbered node
//! by node, the node-ordered result is staged in host memory and put in
//! rank order. Each call moves windows of at most `maxCollBytes`.
//!
//! Where: `NCCL_COLLNET_ENABLE=1` on every rank, a communicator on host
//! memory spanning at least `NCCL_COLLNET_NODE_THRESHOLD` nodes (ranks
//! with one host hash are a node, `NCCL_HOSTID` included), the net
//! plugin's library exporting an `ncclCollNetPlugin_vN` that reports
//! devices, every rank's plugin supporting the type and operation
//! (`reduceSupport`, for sum, product, min and max), no algorithm forced
//! (`NCCL_ALGO`), and the cost model predicting it no slower than the
//! ring and trees. A group whose collectives are not all such
//! all-reduces, or that holds sends and receives, runs as before.
//!
//! Set up while the communicator is made, on every rank at the same
//! point: the ranks agree that every one can use it (an allgather of what
//! each found), each leader listens, the handles are gathered, the leaders
//! `connect` (collective in the plugin), and they agree it worked; then the
//! node's communicator is split. A failure at any step leaves the
//! communicator without CollNet, with one INFO line saying why.
//!
//! Not done: GPU communicators (NCCL's CollNet on device buffers needs the
//! proxy to feed the collnet from the kernels' step slots); CollNet direct
//! (several ranks per node each talking to the collnet); average and
//! pre-multiplied sums; registration caching (each call registers and
//! deregisters its buffers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{debug, info};

use crate::algo::cost::{self, LinkModel};
use crate::algo::Coll;
use crate::dtype::RedOp;
use crate::error::{Error, Result};
use crate::mem::OpBuffers;
use crate::op::{Op, OpKind};
use crate::plugin::net::collnet::{self as plugin, CollComm, Handle};
use crate::plugin::profiler::{ApiEvents, Handle as ProfHandle};

use super::core::Core;
use super::{Comm, CommConfig};

/// A communicator's CollNet path, where it has one.
pub(super) struct CollPath {
    /// This rank's node's ranks, in this communicator's order (first: the
    /// node's leader).
    local: Comm,
    /// The leader's comm in the CollNet group (one member per node).
    coll: Option<Mutex<CollComm>>,
    /// Bit `dtype * 8 + op` set where every rank's plugin reduces it.
    supported: u64,
    /// Most ranks on one node, for the cost model.
    ppn: usize,
    /// The collnet's link as the slowest rank's plugin reports it.
    link: LinkModel,
    /// Collectives run through the collnet so far.
    used: AtomicU64,
    /// Whether all-gathers and reduce-scatters may take it: every rank's
    /// plugin offers `iallgather` (`ireducescatter`) and every node has
    /// `ppn` ranks.
    gathers: (bool, bool),
    /// Each rank's place in node order (node by node, each node's ranks in
    /// rank order), where the gathered blocks are.
    pos: Vec<usize>,
    /// This rank's node, and whether node order is rank order.
    node: usize,
    contiguous: bool,
}

/// The state a communicator starts with.
pub(super) fn new_state() -> Mutex<Option<Arc<CollPath>>> {
    Mutex::new(None)
}

/// What each rank tells the others before setting up.
const FACTS: usize = 1 + 8 + 4 + 4 + 1;

/// What a rank found: usable, its reductions, speed, latency, and whether
/// its plugin offers `iallgather` (bit 0) and `ireducescatter` (bit 1).
type Facts = (bool, u64, i32, f32, u8);

fn facts(ok: bool, supported: u64, speed: i32, latency: f32, gathers: (bool, bool)) -> Vec<u8> {
    let mut v = Vec::with_capacity(FACTS);
    v.push(u8::from(ok));
    v.extend_from_slice(&supported.to_le_bytes());
    v.extend_from_slice(&speed.to_le_bytes());
    v.extend_from_slice(&latency.to_le_bytes());
    v.push(u8::from(gathers.0) | (u8::from(gathers.1) << 1));
    v
}

fn parse_facts(b: &[u8]) -> Option<Facts> {
    if b.len() != FACTS {
        return None;
    }
    Some((
        b[0] == 1,
        u64::from_le_bytes(b[1..9].try_into().ok()?),
        i32::from_le_bytes(b[9..13].try_into().ok()?),
        f32::from_le_bytes(b[13..17].try_into().ok()?),
        b[17],
    ))
}

/// NCCL's numbering of the operations CollNet may run.
const OPS: [(RedOp, i32); 4] = [
    (RedOp::Sum, 0),
    (RedOp::Prod, 1),
    (RedOp::Max, 2),
    (RedOp::Min, 3),
];

fn op_code(op: RedOp) -> Option<i32> {
    OPS.iter().find(|(o, _)| *o == op).map(|(_, c)| *c)
}

/// The CollNet path of a communicator made on `core`, whose rank `me` is;
/// `None` where it does not apply or could not be set up (said in an INFO
/// line). Every rank calls this at the same point of its creation.
pub(super) fn made(core: &Arc<Core>, me: usize) -> Result<Option<Arc<CollPath>>> {
    if core.cfg.collnet_enable == 0 {
        return Ok(None);
    }
    let nnodes = core.ident.nnodes;
    if core.device.is_some() {
        info!(target: "oxccl::init|net", "rank {me}: NCCL_COLLNET_ENABLE=1, but CollNet runs on host memory only in oxccl: this GPU communicator uses rings and trees");
        return Ok(None);
    }
    if (nnodes as u64) < core.cfg.collnet_node_threshold || nnodes < 2 {
        info!(target: "oxccl::init|net", "rank {me}: no CollNet: {nnodes} node(s), NCCL_COLLNET_NODE_THRESHOLD {}", core.cfg.collnet_node_threshold);
        return Ok(None);
    }
    // Does every rank's process have a usable plugin, and for what?
    let found = plugin::plugin();
    let mine = match &found {
        Ok(p) => {
            let mut bits = 0u64;
            for dt in crate::dtype::DataType::ALL {
                for (_, code) in OPS {
                    if p.reduce_support(dt as i32, code) {
                        bits |= 1 << ((dt as u32) * 8 + code as u32);
                    }
                }
            }
            facts(true, bits, p.speed_mbps, p.latency_us, p.gathers)
        }
        Err(_) => facts(false, 0, 0, 0.0, (false, false)),
    };
    let all = core.bootstrap.allgather(&mine)?;
    let all: Vec<Facts> = all
        .iter()
        .map(|b| parse_facts(b))
        .collect::<Option<_>>()
        .ok_or_else(|| Error::Remote("a rank sent malformed CollNet facts".into()))?;
    let without: Vec<usize> = (0..all.len()).filter(|&r| !all[r].0).collect();
    let plugin = match found {
        Ok(p) if without.is_empty() => p,
        Ok(_) => {
            info!(target: "oxccl::init|net", "rank {me}: no CollNet: ranks {without:?} have no usable collnet plugin");
            return Ok(None);
        }
        Err(why) => {
            info!(target: "oxccl::init|net", "rank {me}: NCCL_COLLNET_ENABLE=1 but no CollNet: {why}");
            return Ok(None);
        }
    };
    let supported = all.iter().fold(u64::MAX, |acc, f| acc & f.1);
    let link = all
        .iter()
        .map(|f| LinkModel::from_net(f.2, f.3))
        .reduce(LinkModel::worse)
        .unwrap_or_default();
    // Nodes in the order of their first ranks; a node's first rank leads.
    let hosts = &core.locality.hosts;
    let mut order: Vec<u64> = Vec::new();
    for h in hosts {
        if !order.contains(h) {
            order.push(*h);
        }
    }
    let node_of = |r: usize| order.iter().position(|h| *h == hosts[r]).unwrap_or(0);
    let leader_of = |node: usize| hosts.iter().position(|h| *h == order[node]).unwrap_or(0);
    let node = node_of(me);
    let leader = leader_of(node) == me;
    let per_node: Vec<usize> = (0..order.len())
        .map(|n| hosts.iter().filter(|h| **h == order[n]).count())
        .collect();
    let ppn = per_node.iter().copied().max().unwrap_or(1);
    let uniform = per_node.iter().all(|&n| n == ppn);
    let offered = all.iter().fold(3u8, |acc, f| acc & f.4);
    let gathers = (uniform && offered & 1 != 0, uniform && offered & 2 != 0);
    let pos: Vec<usize> = (0..hosts.len())
        .map(|r| node_of(r) * ppn + (0..r).filter(|&q| hosts[q] == hosts[r]).count())
        .collect();
    let contiguous = pos.iter().enumerate().all(|(r, p)| r == *p);
    // The leaders listen; every rank passes on what its leader needs.
    let listened = if leader {
        Some(plugin.listen(core.ident.comm_hash))
    } else {
        None
    };
    let mut mine = vec![0u8; 1 + std::mem::size_of::<Handle>()];
    let mut listening = None;
    match listened {
        Some(Ok((l, h))) => {
            mine[0] = 1;
            mine[1..].copy_from_slice(&h);
            listening = Some(l);
        }
        Some(Err(e)) => {
            info!(target: "oxccl::init|net", "rank {me}: collnet listen failed: {e}");
        }
        None => mine[0] = 1,
    }
    let all = core.bootstrap.allgather(&mine)?;
    let failed: Vec<usize> = (0..all.len())
        .filter(|&r| all[r].first() != Some(&1))
        .collect();
    let coll = match listening {
        Some(l) if failed.is_empty() => {
            let handles: Vec<Handle> = (0..order.len())
                .map(|n| {
                    let mut h = [0u8; std::mem::size_of::<Handle>()];
                    h.copy_from_slice(&all[leader_of(n)][1..]);
                    h
                })
                .collect();
            match l.connect(&handles, node) {
                Ok(c) => Some(Ok(c)),
                Err(e) => Some(Err(e)),
            }
        }
        _ => None,
    };
    let ok = failed.is_empty() && !matches!(coll, Some(Err(_)));
    if let Some(Err(e)) = &coll {
        info!(target: "oxccl::init|net", "rank {me}: collnet connect failed: {e}");
    }
    let agreed = core.bootstrap.allgather(&[u8::from(ok)])?;
    let bad: Vec<usize> = (0..agreed.len())
        .filter(|&r| agreed[r].first() != Some(&1))
        .collect();
    if !bad.is_empty() {
        info!(target: "oxccl::init|net", "rank {me}: no CollNet: setting it up failed on ranks {bad:?}");
        return Ok(None);
    }
    let coll = coll.and_then(|c| c.ok()).map(Mutex::new);
    // The node's ranks, without CollNet of their own.
    let cfg = CommConfig::default().with("COLLNET_ENABLE", "0");
    let local = Comm::split_core(core, me, false, node as i32, me as i32, &cfg)?
        .ok_or_else(|| Error::Internal("no communicator for this rank's node".into()))?;
    info!(target: "oxccl::init|net",
        "rank {me}: CollNet {} ({}) on: all_reduce on host memory as a reduce to each node's first rank, an all_reduce of the {} nodes' first ranks in the collnet{}, and a broadcast on each node",
        plugin.name(), plugin.symbol(), order.len(),
        if leader { " (this rank is node's first)" } else { "" });
    if gathers != (true, true) {
        let why = if !uniform {
            format!("the nodes have unequal numbers of ranks ({per_node:?})")
        } else {
            let lacks: Vec<&str> = [(1, "iallgather"), (2, "ireducescatter")]
                .into_iter()
                .filter(|(b, _)| offered & b == 0)
                .map(|(_, n)| n)
                .collect();
            format!(
                "the collnet plugin {} ({}) has no {} on every rank (NULL, or a version before v8)",
                plugin.name(),
                plugin.symbol(),
                lacks.join(" or ")
            )
        };
        let colls: Vec<&str> = [(gathers.0, "all_gather"), (gathers.1, "reduce_scatter")]
            .into_iter()
            .filter(|(g, _)| !g)
            .map(|(_, n)| n)
            .collect();
        info!(target: "oxccl::init|net", "rank {me}: {} through rings and trees, not CollNet: {why}", colls.join(" and "));
    } else {
        info!(target: "oxccl::init|net", "rank {me}: CollNet also runs all_gather and reduce_scatter on host memory ({})",
            if contiguous { "ranks node by node" } else { "ranks not node by node: staged in host memory" });
    }
    Ok(Some(Arc::new(CollPath {
        local,
        coll,
        supported,
        ppn,
        link,
        used: AtomicU64::new(0),
        gathers,
        pos,
        node,
        contiguous,
    })))
}

impl CollPath {
    /// Whether every collective of a group takes the CollNet: each an
    /// all-reduce of a type and operation every rank's plugin reduces,
    /// chosen by the cost model; no sends or receives with them.
    fn takes(&self, core: &Core, ops: &[(Op, OpBuffers)]) -> bool {
        let (fabric, forced) = core.model();
        let reduces = |op: &Op| {
            op_code(op.redop).is_some_and(|code| {
                self.supported & (1 << ((op.dtype as u32) * 8 + code as u32)) != 0
            })
        };
        !ops.is_empty()
            && ops.iter().all(|(op, _)| {
                let bytes = op.count * op.dtype.size();
                let gather = |coll: Coll| {
                    cost::collnet_gather_wins(
                        coll,
                        bytes,
                        core.nranks,
                        self.ppn,
                        fabric,
                        self.link,
                        forced,
                    )
                };
                op.count > 0
                    && match op.kind {
                        OpKind::AllReduce => {
                            reduces(op)
                                && cost::collnet_wins(
                                    bytes,
                                    core.nranks,
                                    self.ppn,
                                    fabric,
                                    self.link,
                                    forced,
                                )
                        }
                        OpKind::AllGather => self.gathers.0 && gather(Coll::AllGather),
                        OpKind::ReduceScatter => {
                            self.gathers.1 && reduces(op) && gather(Coll::ReduceScatter)
                        }
                        _ => false,
                    }
            })
    }

    /// One all-reduce in the three steps.
    fn all_reduce(&self, core: &Core, op: &Op) -> Result<()> {
        let me = core.rank;
        let local = &self.local;
        let step = |kind: OpKind, input: *const u8| -> Result<()> {
            let o = Op { kind, input, ..*op };
            let c = local.core()?;
            let bufs = o.validate(local.user_rank(), local.count())?;
            c.execute(&[(o, bufs)], &ApiEvents::new(None, ProfHandle::NONE))
                .inspect_err(|e| local.record_failure(e))
        };
        let what = |s: &str| {
            format!(
                "rank {me}: {s} of an all_reduce of {} x {} through CollNet",
                op.count,
                op.dtype.name()
            )
        };
        step(OpKind::Reduce { root: 0 }, op.input)
            .map_err(|e| e.context(what("the reduce to the node's first rank")))?;
        if let Some(c) = &self.coll {
            let code = op_code(op.redop).expect("checked by takes");
            let c = c
                .lock()
                .map_err(|_| Error::Internal("collnet comm poisoned by an earlier panic".into()))?;
            let stopped = || core.stop.error("all_reduce through CollNet");
            // SAFETY: the output holds `count` elements of host memory
            // (validated at enqueue), this call's until it returns.
            #[allow(unsafe_code)]
            unsafe {
                c.all_reduce(
                    op.output,
                    op.output,
                    op.count,
                    op.dtype.size(),
                    op.dtype as i32,
                    code,
                    core.cfg.timeout(),
                    &stopped,
                )
            }
            .map_err(|e| e.context(what("the collnet all_reduce among the nodes' first ranks")))?;
        }
        step(OpKind::Broadcast { root: 0 }, op.output)
            .map_err(|e| e.context(what("the broadcast from the node's first rank")))?;
        let n = self.used.fetch_add(1, Ordering::Relaxed) + 1;
        debug!(target: "oxccl::coll", rank = me, "all_reduce of {} x {} through CollNet ({n} so far)", op.count, op.dtype.name());
        Ok(())
    }
}

/// Host memory for staging, aligned for every type.
struct Staging(Vec<u64>);

impl Staging {
    fn new(bytes: usize) -> Staging {
        Staging(vec![0u64; bytes.div_ceil(8)])
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
}

impl CollPath {
    /// Runs `kind` on the node's communicator, of `count` elements of the
    /// call's type, from `input` into `output`.
    fn local_step(
        &self,
        op: &Op,
        kind: OpKind,
        input: *const u8,
        output: *mut u8,
        count: usize,
    ) -> Result<()> {
        let local = &self.local;
        let o = Op {
            kind,
            input,
            output,
            count,
            ..*op
        };
        let c = local.core()?;
        let bufs = o.validate(local.user_rank(), local.count())?;
        c.execute(&[(o, bufs)], &ApiEvents::new(None, ProfHandle::NONE))
            .inspect_err(|e| local.record_failure(e))
    }

    fn what(me: usize, op: &Op, s: &str) -> String {
        format!(
            "rank {me}: {s} of a {} of {} x {} through CollNet",
            op.kind.name(),
            op.count,
            op.dtype.name()
        )
    }

    /// One all-gather: inside the node into the node's part, the collnet
    /// among the leaders, a broadcast of the whole in the node.
    #[allow(
        unsafe_code,
        reason = "the collnet call and the staging copies, each with its SAFETY"
    )]
    fn all_gather(&self, core: &Core, op: &Op) -> Result<()> {
        let me = core.rank;
        let e = op.dtype.size();
        let block = op.count * e;
        let per = self.ppn * block;
        let total = core.nranks * block;
        let mut staging = (!self.contiguous).then(|| Staging::new(total));
        let buf = staging.as_mut().map_or(op.output, Staging::ptr);
        // SAFETY: `buf` holds `total` bytes (the caller's output, or the
        // staging), of which the node's part is `per` bytes at `node * per`.
        let part = unsafe { buf.add(self.node * per) };
        self.local_step(op, OpKind::AllGather, op.input, part, op.count)
            .map_err(|e| e.context(Self::what(me, op, "the all_gather inside the node")))?;
        if let Some(c) = &self.coll {
            let c = c
                .lock()
                .map_err(|_| Error::Internal("collnet comm poisoned by an earlier panic".into()))?;
            let stopped = || core.stop.error("all_gather through CollNet");
            // SAFETY: `buf` holds one part of `per` bytes per node, this
            // node's at `part`; host memory this call's until it returns.
            unsafe { c.all_gather(part, buf, per, core.cfg.timeout(), &stopped) }.map_err(|e| {
                e.context(Self::what(
                    me,
                    op,
                    "the collnet all_gather among the nodes' first ranks",
                ))
            })?;
        }
        if self.ppn > 1 {
            let n = core.nranks * op.count;
            self.local_step(op, OpKind::Broadcast { root: 0 }, buf, buf, n)
                .map_err(|e| {
                    e.context(Self::what(
                        me,
                        op,
                        "the broadcast from the node's first rank",
                    ))
                })?;
        }
        if staging.is_some() {
            for (r, p) in self.pos.iter().enumerate() {
                // SAFETY: block `p` of the staging and block `r` of the
                // output, `block` bytes each, distinct allocations.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        buf.add(p * block),
                        op.output.add(r * block),
                        block,
                    )
                };
            }
        }
        self.used.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// One reduce-scatter: a reduce of all blocks to the node's first rank,
    /// the collnet's reduce-scatter among the first ranks into the node's
    /// blocks, a broadcast of those in the node.
    #[allow(
        unsafe_code,
        reason = "the collnet call and the staging copies, each with its SAFETY"
    )]
    fn reduce_scatter(&self, core: &Core, op: &Op) -> Result<()> {
        let me = core.rank;
        let e = op.dtype.size();
        let block = op.count * e;
        let per = self.ppn * block;
        let total = core.nranks * block;
        let leader = self.coll.is_some();
        let mut reduced = leader.then(|| Staging::new(total));
        let into = reduced.as_mut().map_or(op.output, Staging::ptr);
        self.local_step(
            op,
            OpKind::Reduce { root: 0 },
            op.input,
            into,
            core.nranks * op.count,
        )
        .map_err(|e| e.context(Self::what(me, op, "the reduce to the node's first rank")))?;
        let mut mine = (self.ppn > 1).then(|| Staging::new(per));
        let node_blocks = mine.as_mut().map_or(op.output, Staging::ptr);
        if let Some(c) = &self.coll {
            let c = c
                .lock()
                .map_err(|_| Error::Internal("collnet comm poisoned by an earlier panic".into()))?;
            let code = op_code(op.redop).expect("checked by takes");
            // The blocks in node order.
            let mut ordered = (!self.contiguous).then(|| Staging::new(total));
            let send = match ordered.as_mut() {
                Some(o) => {
                    let o = o.ptr();
                    for (r, p) in self.pos.iter().enumerate() {
                        // SAFETY: block `r` of the reduced input and block
                        // `p` of the staging, distinct allocations.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                into.add(r * block),
                                o.add(p * block),
                                block,
                            )
                        };
                    }
                    o
                }
                None => into,
            };
            let stopped = || core.stop.error("reduce_scatter through CollNet");
            // SAFETY: `send` holds every node's `per` bytes and
            // `node_blocks` this node's; host memory this call's.
            unsafe {
                c.reduce_scatter(
                    send,
                    node_blocks,
                    per,
                    e,
                    op.dtype as i32,
                    code,
                    core.cfg.timeout(),
                    &stopped,
                )
            }
            .map_err(|e| {
                e.context(Self::what(
                    me,
                    op,
                    "the collnet reduce_scatter among the nodes' first ranks",
                ))
            })?;
        }
        if self.ppn > 1 {
            let n = self.ppn * op.count;
            self.local_step(
                op,
                OpKind::Broadcast { root: 0 },
                node_blocks,
                node_blocks,
                n,
            )
            .map_err(|e| {
                e.context(Self::what(
                    me,
                    op,
                    "the broadcast from the node's first rank",
                ))
            })?;
            let at = self.pos[me] % self.ppn;
            // SAFETY: this rank's block of the node's, into the output
            // (`block` bytes), distinct allocations.
            unsafe { std::ptr::copy_nonoverlapping(node_blocks.add(at * block), op.output, block) };
        }
        self.used.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Comm {
    fn collnet(&self) -> Option<Arc<CollPath>> {
        self.shared
            .collnet
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Runs a group through the CollNet where it takes it (see
    /// [`CollPath::takes`]); `None` where the group runs as before.
    pub(super) fn through_collnet(
        &self,
        core: &Core,
        ops: &[(Op, OpBuffers)],
    ) -> Option<Result<()>> {
        let c = self.collnet()?;
        if core.device.is_some() || !c.takes(core, ops) {
            return None;
        }
        Some(ops.iter().try_for_each(|(op, _)| match op.kind {
            OpKind::AllGather => c.all_gather(core, op),
            OpKind::ReduceScatter => c.reduce_scatter(core, op),
            _ => c.all_reduce(core, op),
        }))
    }

    /// All-reduces this communicator ran through the CollNet (0 without
    /// one).
    pub fn collnet_uses(&self) -> u64 {
        self.collnet().map_or(0, |c| c.used.load(Ordering::Relaxed))
    }

    /// Ends the work of the node's communicator (a revoke of this one; a
    /// leader waiting on the collnet sees this one's stop flag).
    pub(super) fn revoke_collnet(&self) {
        if let Some(c) = self.collnet() {
            let _ = c.local.revoke();
        }
    }

    /// Lets the CollNet path go (destroy, abort).
    pub(super) fn let_collnet_go(&self, abort: bool) {
        let old = self
            .shared
            .collnet
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(c) = old {
            if abort {
                c.local.abort();
            } else {
                let _ = c.local.destroy();
            }
        }
    }
}
