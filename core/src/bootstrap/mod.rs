//! Bootstrap: the unique id, the root, the ring exchange of listen
//! addresses, and the small out-of-band messages ranks send each other
//! (connection handles, split colors, failure notices, progress queries).
//!
//! STUB: the interface below is the contract; the implementation is being
//! written (sans-IO protocol in `proto.rs`, TCP in `tcp.rs`).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::config::Config;
use crate::error::{Error, Result};

/// NCCL's `ncclUniqueId`: 128 opaque bytes holding the root's address and a
/// random magic.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId(..)")
    }
}

/// Creates a unique id (and, unless `NCCL_COMM_ID` is set, starts the root
/// in this process).
pub fn get_unique_id(cfg: &Config) -> Result<UniqueId> {
    let _ = cfg;
    Err(Error::Internal("bootstrap not implemented yet".into()))
}

/// What one rank reports about its progress when a peer asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerProgress {
    /// The peer answered: number of operations it has started.
    Started(u64),
    /// The peer did not answer in time or refused the connection.
    Unreachable,
}

/// A rank's bootstrap endpoint within one communicator.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    progress: Arc<AtomicU64>,
}

impl Bootstrap {
    pub fn init(id: &UniqueId, rank: usize, nranks: usize, cfg: &Config) -> Result<Bootstrap> {
        let _ = (id, cfg);
        Ok(Bootstrap {
            rank,
            nranks,
            progress: Arc::default(),
        })
    }
    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        let _ = (peer, tag, data);
        Ok(())
    }
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        let _ = (peer, tag);
        Ok(Vec::new())
    }
    pub fn barrier(&self) -> Result<()> {
        Ok(())
    }
    pub fn progress(&self) -> &Arc<AtomicU64> {
        &self.progress
    }
    pub fn query_progress(&self) -> Vec<PeerProgress> {
        Vec::new()
    }
    pub fn broadcast_failure(&self, message: &str) {
        let _ = message;
    }
    pub fn remote_failure(&self) -> Option<(usize, String)> {
        None
    }
    pub fn close(&self) {}
}
