//! oxccl: collective communication (NCCL's role) with NCCL-ABI plugins.
#![deny(unsafe_code)]

pub mod bootstrap;
pub mod config;
pub mod cuda;
pub mod error;

pub use error::{Error, Failure, Result};
pub mod dtype;
pub mod reduce;

pub use dtype::{DataType, RedOp};
pub mod algo;
pub mod comm;
pub mod exec;
pub mod group;
pub mod log;
pub mod mem;
pub mod op;
pub mod plugin;
pub mod ras;
pub mod topo;
pub mod transport;
pub mod win;

pub use bootstrap::UniqueId;
pub use comm::{net_summary, Comm, CommConfig, InitState, ShrinkMode, SPLIT_NOCOLOR};
pub use group::{all_to_all, gather, group_end, group_simulate_end, group_start, scatter, Group};
pub use op::{CallOptions, Op, OpKind};
pub use transport::Transport;
