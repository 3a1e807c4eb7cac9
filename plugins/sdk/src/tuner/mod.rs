//! The tuner interface for plugin authors: NCCL asks, per collective, which
//! algorithm, protocol and channel count to use, by handing the tuner its
//! cost table to edit. Implement [`Tuner`] and export it with
//! [`crate::export_tuner_plugin!`]; the glue in [`export`] adapts
//! every ABI version (v2 to v6) to this one trait.

use std::ffi::CStr;
use std::fmt;

pub mod abi;
pub mod export;
pub mod load;
pub mod stable;
pub mod versions;

use crate::ffi::types::*;
use crate::logger::NcclLogger;
use crate::plugin_error::PluginResult;
use abi::{NCCL_ALGO_PROTO_IGNORE, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS};

/// `ncclFunc_t` as a Rust enum; values this SDK does not know are kept in
/// `Other` so a newer NCCL does not make the tuner fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollType {
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllReduce,
    SendRecv,
    Send,
    Recv,
    AllToAll,
    Scatter,
    Gather,
    AllGatherV,
    Other(i32),
}

impl CollType {
    /// From NCCL's `ncclFunc_t`.
    pub fn from_raw(f: Func) -> Self {
        match f {
            NCCL_FUNC_BROADCAST => Self::Broadcast,
            NCCL_FUNC_REDUCE => Self::Reduce,
            NCCL_FUNC_ALL_GATHER => Self::AllGather,
            NCCL_FUNC_REDUCE_SCATTER => Self::ReduceScatter,
            NCCL_FUNC_ALL_REDUCE => Self::AllReduce,
            NCCL_FUNC_SEND_RECV => Self::SendRecv,
            NCCL_FUNC_SEND => Self::Send,
            NCCL_FUNC_RECV => Self::Recv,
            NCCL_FUNC_ALL_TO_ALL => Self::AllToAll,
            NCCL_FUNC_SCATTER => Self::Scatter,
            NCCL_FUNC_GATHER => Self::Gather,
            NCCL_FUNC_ALL_GATHER_V => Self::AllGatherV,
            other => Self::Other(other),
        }
    }

    /// Back to `ncclFunc_t`.
    pub fn to_raw(self) -> Func {
        match self {
            Self::Broadcast => NCCL_FUNC_BROADCAST,
            Self::Reduce => NCCL_FUNC_REDUCE,
            Self::AllGather => NCCL_FUNC_ALL_GATHER,
            Self::ReduceScatter => NCCL_FUNC_REDUCE_SCATTER,
            Self::AllReduce => NCCL_FUNC_ALL_REDUCE,
            Self::SendRecv => NCCL_FUNC_SEND_RECV,
            Self::Send => NCCL_FUNC_SEND,
            Self::Recv => NCCL_FUNC_RECV,
            Self::AllToAll => NCCL_FUNC_ALL_TO_ALL,
            Self::Scatter => NCCL_FUNC_SCATTER,
            Self::Gather => NCCL_FUNC_GATHER,
            Self::AllGatherV => NCCL_FUNC_ALL_GATHER_V,
            Self::Other(f) => f,
        }
    }

    /// The snake_case name used in logs and rule files ("all_reduce").
    pub fn name(self) -> &'static str {
        match self {
            Self::Broadcast => "broadcast",
            Self::Reduce => "reduce",
            Self::AllGather => "all_gather",
            Self::ReduceScatter => "reduce_scatter",
            Self::AllReduce => "all_reduce",
            Self::SendRecv => "send_recv",
            Self::Send => "send",
            Self::Recv => "recv",
            Self::AllToAll => "all_to_all",
            Self::Scatter => "scatter",
            Self::Gather => "gather",
            Self::AllGatherV => "all_gather_v",
            Self::Other(_) => "unknown",
        }
    }
}

impl fmt::Display for CollType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other(n) => write!(f, "func{n}"),
            c => f.write_str(c.name()),
        }
    }
}

/// `NCCL_ALGO_*`: a row of the cost table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Tree = 0,
    Ring = 1,
    CollNetDirect = 2,
    CollNetChain = 3,
    Nvls = 4,
    NvlsTree = 5,
    Pat = 6,
}

impl Algorithm {
    /// All algorithms, in row order.
    pub const ALL: [Algorithm; NCCL_NUM_ALGORITHMS] = [
        Self::Tree,
        Self::Ring,
        Self::CollNetDirect,
        Self::CollNetChain,
        Self::Nvls,
        Self::NvlsTree,
        Self::Pat,
    ];

    /// The row index (`NCCL_ALGO_*`).
    pub fn index(self) -> usize {
        self as usize
    }

    /// From a row index.
    pub fn from_index(i: usize) -> Option<Self> {
        Self::ALL.get(i).copied()
    }

    /// The snake_case name used in logs and rule files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tree => "tree",
            Self::Ring => "ring",
            Self::CollNetDirect => "collnet_direct",
            Self::CollNetChain => "collnet_chain",
            Self::Nvls => "nvls",
            Self::NvlsTree => "nvls_tree",
            Self::Pat => "pat",
        }
    }
}

/// `NCCL_PROTO_*`: a column of the cost table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Ll = 0,
    Ll128 = 1,
    Simple = 2,
}

impl Protocol {
    /// All protocols, in column order.
    pub const ALL: [Protocol; NCCL_NUM_PROTOCOLS] = [Self::Ll, Self::Ll128, Self::Simple];

    /// The column index (`NCCL_PROTO_*`).
    pub fn index(self) -> usize {
        self as usize
    }

    /// From a column index.
    pub fn from_index(i: usize) -> Option<Self> {
        Self::ALL.get(i).copied()
    }

    /// The snake_case name used in logs and rule files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ll => "ll",
            Self::Ll128 => "ll128",
            Self::Simple => "simple",
        }
    }
}

/// NCCL's cost table for one collective: `num_algo` rows of `num_proto`
/// estimated times (µs). NCCL takes the cheapest available cell, so a tuner
/// selects a cell by setting it to 0.0. Cells NCCL will not use hold
/// [`NCCL_ALGO_PROTO_IGNORE`] (-1.0) and must stay so.
pub struct CostTable<'a> {
    cells: &'a mut [f32],
    num_algo: usize,
    num_proto: usize,
}

impl<'a> CostTable<'a> {
    /// A view over a row-major `num_algo` x `num_proto` table.
    ///
    /// Panics if `cells.len() != num_algo * num_proto`.
    pub fn new(cells: &'a mut [f32], num_algo: usize, num_proto: usize) -> Self {
        assert_eq!(cells.len(), num_algo * num_proto, "cost table size");
        Self {
            cells,
            num_algo,
            num_proto,
        }
    }

    /// Rows (algorithms) NCCL passed; older NCCLs pass 6 (no PAT).
    pub fn num_algo(&self) -> usize {
        self.num_algo
    }

    /// Columns (protocols) NCCL passed.
    pub fn num_proto(&self) -> usize {
        self.num_proto
    }

    /// The cost of a cell, or `None` when NCCL marked it unavailable or the
    /// table has no such cell.
    pub fn get(&self, algo: Algorithm, proto: Protocol) -> Option<f32> {
        let v = self.raw(algo.index(), proto.index())?;
        (v != NCCL_ALGO_PROTO_IGNORE).then_some(v)
    }

    /// The raw value of a cell (including -1.0 for unavailable).
    pub fn raw(&self, algo: usize, proto: usize) -> Option<f32> {
        (algo < self.num_algo && proto < self.num_proto)
            .then(|| self.cells[algo * self.num_proto + proto])
    }

    /// Whether NCCL may use this combination for this call.
    pub fn is_available(&self, algo: Algorithm, proto: Protocol) -> bool {
        self.get(algo, proto).is_some()
    }

    /// Sets the cost of an available cell; returns false (and changes
    /// nothing) when the cell is unavailable, because NCCL would run a
    /// combination it cannot support.
    pub fn set(&mut self, algo: Algorithm, proto: Protocol, cost: f32) -> bool {
        if !self.is_available(algo, proto) {
            return false;
        }
        self.cells[algo.index() * self.num_proto + proto.index()] = cost;
        true
    }

    /// The cheapest available cell, as NCCL would pick it.
    pub fn cheapest(&self) -> Option<(Algorithm, Protocol, f32)> {
        let mut best: Option<(Algorithm, Protocol, f32)> = None;
        for a in Algorithm::ALL.into_iter().take(self.num_algo) {
            for p in Protocol::ALL.into_iter().take(self.num_proto) {
                if let Some(c) = self.get(a, p) {
                    if best.is_none_or(|(_, _, b)| c < b) {
                        best = Some((a, p, c));
                    }
                }
            }
        }
        best
    }
}

impl fmt::Debug for CostTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows: Vec<&[f32]> = self.cells.chunks(self.num_proto.max(1)).collect();
        f.debug_struct("CostTable").field("rows", &rows).finish()
    }
}

/// NVLink domain shape (tuner v5 and later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvlDomainInfo {
    pub n_nvl_domains: i32,
    pub min_ranks_per_nvl_domain: i32,
    pub max_ranks_per_nvl_domain: i32,
}

/// What `init` receives, whatever the ABI version.
#[derive(Debug, Clone, Copy)]
pub struct TunerInit {
    /// Ranks of the communicator.
    pub n_ranks: usize,
    /// Nodes of the communicator.
    pub n_nodes: usize,
    /// The communicator's id (v5 and later; `None` before).
    pub comm_id: Option<u64>,
    /// NVLink domains (v5 and later).
    pub nvl_domain: Option<NvlDomainInfo>,
    /// NCCL's logger (subsystem `NCCL_TUNING`).
    pub logger: NcclLogger,
}

/// One question NCCL asks: which algorithm and protocol for this call.
#[derive(Debug, Clone, Copy)]
pub struct CollInfoRequest {
    pub coll: CollType,
    pub n_bytes: usize,
    /// Operations fused in the same launch (NCCL aggregates small ones).
    pub num_pipe_ops: i32,
    /// Whether the user buffers are registered (v4 and later; `None` before).
    pub reg_buff: Option<bool>,
}

/// A tuner plugin. One instance per communicator (`init` .. `destroy`);
/// NCCL may call instances of different communicators from different
/// threads, hence `Send + Sync`.
pub trait Tuner: Send + Sync + Sized + 'static {
    /// The name NCCL prints when it loads the plugin.
    const NAME: &'static CStr;

    /// Creates the instance for one communicator. An error fails NCCL's
    /// tuner loading (NCCL then runs without a tuner) with the message logged.
    fn init(args: &TunerInit) -> PluginResult<Self>;

    /// Edits `table` (set a cell to 0.0 to select it) and may set
    /// `n_channels` (left as is, NCCL keeps its own count). An error is
    /// reported to NCCL, which then keeps its own choice.
    fn get_coll_info(
        &self,
        req: &CollInfoRequest,
        table: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> PluginResult<()>;

    /// Whether [`Tuner::get_chunk_size`] is implemented: the v6 vtable's
    /// `getChunkSize` is NULL otherwise, which tells NCCL to keep its own
    /// chunk size without a call.
    const CHUNK_SIZE: bool = false;

    /// The chunk size for a call whose algorithm, protocol and channels are
    /// decided (tuner v6, NCCL 2.30); `None` keeps NCCL's.
    fn get_chunk_size(
        &self,
        _coll: CollType,
        _n_bytes: usize,
        _algo: Algorithm,
        _proto: Protocol,
        _n_channels: i32,
    ) -> PluginResult<Option<usize>> {
        Ok(None)
    }

    /// Ends the instance (NCCL's `destroy`/`finalize`).
    fn destroy(self) -> PluginResult<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_table_view() {
        let mut cells = [3.0f32; 6 * 3];
        cells[0] = NCCL_ALGO_PROTO_IGNORE; // tree/ll
        let mut t = CostTable::new(&mut cells, 6, 3);
        assert_eq!(t.get(Algorithm::Tree, Protocol::Ll), None);
        assert!(!t.set(Algorithm::Tree, Protocol::Ll, 0.0));
        // A 6-row table (NCCL before PAT) has no PAT row.
        assert!(!t.is_available(Algorithm::Pat, Protocol::Simple));
        assert!(t.set(Algorithm::Ring, Protocol::Ll128, 0.5));
        assert_eq!(t.cheapest(), Some((Algorithm::Ring, Protocol::Ll128, 0.5)));
        assert_eq!(cells[3 + 1], 0.5);
    }

    #[test]
    fn coll_type_round_trip() {
        for f in 0..15 {
            assert_eq!(CollType::from_raw(f).to_raw(), f);
        }
        assert_eq!(
            CollType::from_raw(NCCL_FUNC_ALL_REDUCE).to_string(),
            "all_reduce"
        );
    }
}
