//! One operation as the caller asked for it, and the checks made before
//! anything is touched.

use crate::algo::{Algo, Coll};
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::mem::OpBuffers;

/// What an operation does, with its root or peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    AllReduce,
    Broadcast { root: usize },
    Reduce { root: usize },
    AllGather,
    ReduceScatter,
    Send { peer: usize },
    Recv { peer: usize },
}

impl OpKind {
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Send { .. } => "send",
            OpKind::Recv { .. } => "recv",
            other => other.coll().map(|c| c.name()).unwrap_or("?"),
        }
    }

    pub fn coll(&self) -> Option<Coll> {
        Some(match *self {
            OpKind::AllReduce => Coll::AllReduce,
            OpKind::Broadcast { root } => Coll::Broadcast { root },
            OpKind::Reduce { root } => Coll::Reduce { root },
            OpKind::AllGather => Coll::AllGather,
            OpKind::ReduceScatter => Coll::ReduceScatter,
            OpKind::Send { .. } | OpKind::Recv { .. } => return None,
        })
    }

    /// Code carried in the operation header.
    pub(crate) fn code(&self) -> u8 {
        match self {
            OpKind::AllReduce => 0,
            OpKind::Broadcast { .. } => 1,
            OpKind::Reduce { .. } => 2,
            OpKind::AllGather => 3,
            OpKind::ReduceScatter => 4,
            OpKind::Send { .. } | OpKind::Recv { .. } => 5,
        }
    }

    pub(crate) fn root(&self) -> usize {
        match *self {
            OpKind::Broadcast { root } | OpKind::Reduce { root } => root,
            _ => 0,
        }
    }
}

/// Where the addresses a process may use end: 2^56 on x86-64 (5-level
/// paging; 2^47 with 4 levels), 2^52 on AArch64, nowhere known elsewhere.
/// CUDA's unified addresses share the same space.
const ADDRESS_END: u64 = if cfg!(target_arch = "x86_64") {
    1 << 56
} else if cfg!(target_arch = "aarch64") {
    1 << 52
} else {
    u64::MAX
};

/// An operation on buffers given by address (NCCL's arguments).
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub kind: OpKind,
    pub input: *const u8,
    pub output: *mut u8,
    /// NCCL's count: elements per rank (all-gather's send count,
    /// reduce-scatter's receive count).
    pub count: usize,
    pub dtype: DataType,
    pub redop: RedOp,
    /// The caller's CUDA stream (`cudaStream_t`; 0 is the legacy default
    /// stream) for operations on device memory; host memory ignores it.
    pub stream: u64,
    /// The caller's profiler tag for this call (NCCL 2.31's
    /// `ncclCollConfig_t.userProfilerTag`; 0: untagged). oxccl never reads
    /// it: it is delivered verbatim to a v7 profiler plugin on the call's
    /// events (collective or p2p API event, collective or p2p event).
    pub user_tag: u64,
    /// This call's own settings (NCCL 2.31's `nccl*Config` calls); the
    /// default leaves everything to the communicator.
    pub call: CallOptions,
}

/// Settings of one collective call, as NCCL 2.31's `ncclCollConfig_t`
/// gives them: they narrow the communicator's for that call only. Every
/// rank must pass the same ones (NCCL's contract), since every rank plans
/// the call on its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// Fewest CTAs (channels) the call runs on (`minCTAs`).
    pub min_ctas: Option<usize>,
    /// Most CTAs the call runs on (`maxCTAs`); never more than the
    /// communicator's maximum.
    pub max_ctas: Option<usize>,
    /// The algorithm row the call is held to (`algSelection`), as
    /// NCCL_ALGO holds a communicator: `Tree` admits both tree-shaped
    /// all-reduces, `Ring` the ring.
    pub algo: Option<Algo>,
    /// The protocol the call is held to (`algSelection`'s `_LL` or
    /// `_SIMPLE` entries), where the device path has it: LL only where
    /// the window has LL FIFOs (peers through host memory), for sizes
    /// within their bound; else Simple. Host memory has one protocol.
    pub proto: Option<crate::transport::layout::Proto>,
    /// CTAs per thread-block cluster of the call's kernels
    /// (`cgaClusterSize`, 0..=8) on the device path; `None`: the
    /// communicator's. Host memory launches no kernel.
    pub cluster: Option<u32>,
}

impl CallOptions {
    /// Whether the call leaves everything to the communicator.
    pub fn is_default(&self) -> bool {
        *self == CallOptions::default()
    }

    /// `n`, a channel count the communicator chose within `lo..=hi` (its
    /// bounds), kept within this call's bounds, which are taken inside the
    /// communicator's: the maximum is at most `hi`, the minimum at least
    /// `lo`, and a minimum above the maximum yields to it (NCCL's rule for
    /// minCTAs and maxCTAs).
    pub fn narrow(&self, n: usize, lo: usize, hi: usize) -> usize {
        if self.min_ctas.is_none() && self.max_ctas.is_none() {
            return n;
        }
        let hi = self.max_ctas.map_or(hi, |m| m.min(hi)).max(1);
        let lo = self.min_ctas.map_or(lo, |m| m.max(lo)).min(hi).max(1);
        n.clamp(lo, hi)
    }
}

// SAFETY: an `Op` is only a description; its addresses are dereferenced by
// the executor under the contract of `Comm::enqueue`.
#[allow(unsafe_code)]
unsafe impl Send for Op {}
// SAFETY: as for Send: shared references never dereference the addresses.
#[allow(unsafe_code)]
unsafe impl Sync for Op {}

impl Op {
    pub fn describe(&self) -> String {
        format!(
            "{}(count {}, {}, {})",
            self.kind.name(),
            self.count,
            self.dtype.name(),
            self.redop.name()
        )
    }

    /// Checks the arguments against a communicator of `nranks` and returns
    /// the buffers with their sizes. Nothing is touched on failure.
    pub fn validate(&self, rank: usize, nranks: usize) -> Result<OpBuffers> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("{}: {m}", self.kind.name())));
        match self.kind {
            OpKind::Broadcast { root } | OpKind::Reduce { root } if root >= nranks => {
                return bad(format!("root {root} is out of range: the communicator has {nranks} ranks (0..{nranks})"))
            }
            OpKind::Send { peer } | OpKind::Recv { peer } if peer >= nranks => {
                return bad(format!("peer {peer} is out of range: the communicator has {nranks} ranks (0..{nranks})"))
            }
            _ => {}
        }
        let bytes = self.count.checked_mul(self.dtype.size());
        let all = bytes
            .and_then(|b| b.checked_mul(nranks))
            .filter(|b| *b <= isize::MAX as usize);
        let (Some(bytes), Some(all)) = (bytes, all) else {
            return bad(format!(
                "count {} of {} overflows the address space ({} ranks)",
                self.count,
                self.dtype.name(),
                nranks
            ));
        };
        let (in_bytes, out_bytes) = match self.kind {
            OpKind::AllGather => (bytes, all),
            OpKind::ReduceScatter => (all, bytes),
            OpKind::Send { .. } => (bytes, 0),
            OpKind::Recv { .. } => (0, bytes),
            OpKind::Broadcast { root } if root != rank => (0, bytes),
            OpKind::Reduce { root } if root != rank => (bytes, 0),
            _ => (bytes, bytes),
        };
        if self.count > 0 {
            if in_bytes > 0 && self.input.is_null() {
                return bad("sendbuff is null with count > 0".into());
            }
            if out_bytes > 0 && self.output.is_null() {
                return bad("recvbuff is null with count > 0".into());
            }
        }
        for (what, ptr, len) in [
            ("sendbuff", self.input as u64, in_bytes),
            ("recvbuff", self.output as u64, out_bytes),
        ] {
            if len > 0
                && ptr
                    .checked_add(len as u64)
                    .is_none_or(|end| end > ADDRESS_END)
            {
                return bad(format!(
                    "count {} of {} needs {len} bytes of {what} from {ptr:#x} on, past the end of the address space ({ADDRESS_END:#x}): the count is larger than the buffer",
                    self.count,
                    self.dtype.name()
                ));
            }
        }
        Ok(OpBuffers {
            input: self.input,
            in_bytes,
            output: self.output,
            out_bytes,
            scratch: std::ptr::null_mut(),
            scratch_bytes: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::CallOptions;

    #[test]
    fn call_bounds_stay_inside_the_communicators() {
        let none = CallOptions::default();
        assert_eq!(none.narrow(24, 1, 24), 24);
        let max4 = CallOptions {
            max_ctas: Some(4),
            ..CallOptions::default()
        };
        assert_eq!(max4.narrow(24, 1, 24), 4);
        // Never more than the communicator's maximum.
        let max64 = CallOptions {
            max_ctas: Some(64),
            ..CallOptions::default()
        };
        assert_eq!(max64.narrow(24, 1, 24), 24);
        assert_eq!(max64.narrow(8, 1, 8), 8);
        // The minimum raises the count, up to the maximum.
        let min16 = CallOptions {
            min_ctas: Some(16),
            ..CallOptions::default()
        };
        assert_eq!(min16.narrow(2, 1, 24), 16);
        assert_eq!(min16.narrow(2, 1, 8), 8);
        // A minimum above the maximum yields to it.
        let both = CallOptions {
            min_ctas: Some(12),
            max_ctas: Some(3),
            ..CallOptions::default()
        };
        assert_eq!(both.narrow(24, 1, 24), 3);
        // The communicator's minimum holds under a call's maximum above it.
        let max6 = CallOptions {
            max_ctas: Some(6),
            ..CallOptions::default()
        };
        assert_eq!(max6.narrow(2, 4, 24), 4);
    }
}
