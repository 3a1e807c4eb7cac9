//! The 32-byte descriptor each rank sends its peers at the start of an
//! operation, so that ranks that called different collectives, counts or
//! types fail with a message saying so instead of exchanging garbage.

use crate::algo::Algo;
use crate::error::{Error, Result};

pub const HEADER_BYTES: usize = 32;
const MAGIC: u32 = 0x4f58_4f50; // "OXOP"

/// What an operation is, as its peers must agree on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpHeader {
    /// Sequence number of the collective, or of the message between a pair for send/recv.
    pub seq: u64,
    pub kind: u8,
    pub dtype: u8,
    pub redop: u8,
    pub root: u32,
    pub count: u64,
    /// The algorithm and channels a collective on the rings runs with;
    /// ranks that chose differently (tuner plugins that disagree; NCCL_ALGO
    /// is rank 0's on every rank) would cut the data differently, so it
    /// travels with the rest. None for send/recv and the direct path.
    pub plan: Option<(Algo, u32)>,
}

pub const KIND_NAMES: [&str; 7] = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "send",
    "recv",
];

impl OpHeader {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind;
        b[5] = self.dtype;
        b[6] = self.redop;
        if let Some((algo, channels)) = self.plan {
            b[7] = algo.code();
            b[28..32].copy_from_slice(&channels.to_le_bytes());
        }
        b[8..12].copy_from_slice(&self.root.to_le_bytes());
        b[12..20].copy_from_slice(&self.seq.to_le_bytes());
        b[20..28].copy_from_slice(&self.count.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<OpHeader> {
        if b.len() != HEADER_BYTES || u32::from_le_bytes(b[0..4].try_into().ok()?) != MAGIC {
            return None;
        }
        Some(OpHeader {
            kind: b[4],
            dtype: b[5],
            redop: b[6],
            root: u32::from_le_bytes(b[8..12].try_into().ok()?),
            seq: u64::from_le_bytes(b[12..20].try_into().ok()?),
            count: u64::from_le_bytes(b[20..28].try_into().ok()?),
            plan: match b[7] {
                0 => None,
                k => Some((
                    Algo::from_code(k)?,
                    u32::from_le_bytes(b[28..32].try_into().ok()?),
                )),
            },
        })
    }

    pub fn describe(&self) -> String {
        let kind = KIND_NAMES.get(self.kind as usize).copied().unwrap_or("?");
        let dtype = crate::DataType::from_raw(self.dtype as i32)
            .map(|d| d.name())
            .unwrap_or("?");
        let plan = match self.plan {
            Some((algo, ch)) => format!(" by {} on {ch} channel(s)", algo.name()),
            None => String::new(),
        };
        format!(
            "{kind} #{} (count {}, {dtype}, op {}, root {}){plan}",
            self.seq, self.count, self.redop, self.root
        )
    }

    /// Checks what `peer` sent against what this rank expects of it.
    pub fn check(&self, got: &[u8], peer: usize, rank: usize) -> Result<()> {
        let Some(theirs) = OpHeader::decode(got) else {
            return Err(Error::Remote(format!(
                "rank {peer} sent {} bytes that are not an operation header while this rank ({rank}) started {}: the ranks are out of step",
                got.len(),
                self.describe()
            )));
        };
        let same_call = OpHeader {
            plan: theirs.plan,
            ..*self
        } == theirs;
        if same_call && theirs.plan != self.plan {
            return Err(Error::InvalidUsage(format!(
                "mismatched algorithms: rank {peer} runs {} while rank {rank} runs {}; a tuner plugin must choose alike on every rank (NCCL_ALGO is rank 0's on every rank)",
                theirs.describe(),
                self.describe()
            )));
        }
        if theirs != *self {
            return Err(Error::InvalidUsage(differ((rank, self), (peer, &theirs))));
        }
        Ok(())
    }
}

/// What two ranks' calls of one collective differ in, the lower rank
/// first (so that every rank words it alike): where only the count or the
/// type differs, `mismatched counts: rank 0 called all_reduce #3 of 1024 x
/// float, rank 1 of 2048 x float`; else both calls whole.
fn differ(a: (usize, &OpHeader), b: (usize, &OpHeader)) -> String {
    let ((r0, h0), (r1, h1)) = if a.0 <= b.0 { (a, b) } else { (b, a) };
    let dtype = |h: &OpHeader| {
        crate::DataType::from_raw(h.dtype as i32)
            .map(|d| d.name())
            .unwrap_or("?")
    };
    let kind = KIND_NAMES.get(h0.kind as usize).copied().unwrap_or("?");
    let what = match (h0.count != h1.count, h0.dtype != h1.dtype) {
        (true, false) => "counts",
        (false, true) => "types",
        _ => "counts and types",
    };
    let same_call = OpHeader {
        count: h1.count,
        dtype: h1.dtype,
        plan: h1.plan,
        ..*h0
    } == *h1;
    let said = if same_call {
        format!(
            "mismatched {what}: rank {r0} called {kind} #{} of {} x {}, rank {r1} of {} x {}",
            h0.seq,
            h0.count,
            dtype(h0),
            h1.count,
            dtype(h1)
        )
    } else {
        format!(
            "mismatched operations: rank {r0} called {} while rank {r1} called {}",
            h0.describe(),
            h1.describe()
        )
    };
    format!("{said}; every rank must call the same collectives in the same order with the same count, type and op")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_mismatch_message() {
        let h = OpHeader {
            seq: 7,
            kind: 0,
            dtype: 7,
            redop: 0,
            root: 0,
            count: 100,
            plan: None,
        };
        assert_eq!(OpHeader::decode(&h.encode()), Some(h));
        let other = OpHeader { count: 200, ..h };
        let e = h.check(&other.encode(), 3, 1).unwrap_err().to_string();
        assert!(
            e.contains(
                "mismatched counts: rank 1 called all_reduce #7 of 100 x float, rank 3 of 200 x float; "
            ),
            "{e}"
        );
        // The other rank words it alike.
        assert_eq!(other.check(&h.encode(), 1, 3).unwrap_err().to_string(), e);
        let half = OpHeader { dtype: 6, ..h };
        let e = h.check(&half.encode(), 0, 1).unwrap_err().to_string();
        assert!(e.contains("mismatched types: rank 0 called all_reduce #7 of 100 x half, rank 1 of 100 x float"), "{e}");
        let both = OpHeader { dtype: 6, ..other };
        let e = h.check(&both.encode(), 0, 1).unwrap_err().to_string();
        assert!(e.contains("mismatched counts and types: "), "{e}");
        let bcast = OpHeader { kind: 1, ..h };
        let e = h.check(&bcast.encode(), 0, 1).unwrap_err().to_string();
        assert!(
            e.contains("mismatched operations: rank 0 called broadcast #7 (count 100")
                && e.contains("while rank 1 called all_reduce #7 (count 100"),
            "{e}"
        );
        assert!(h.check(&[0; 8], 3, 1).is_err());
    }

    #[test]
    fn a_different_algorithm_is_named_as_such() {
        let h = OpHeader {
            seq: 0,
            kind: 0,
            dtype: 7,
            redop: 0,
            root: 0,
            count: 2,
            plan: Some((Algo::Ring, 1)),
        };
        let tree = OpHeader {
            plan: Some((Algo::Tree, 2)),
            ..h
        };
        for x in [h, tree] {
            assert_eq!(OpHeader::decode(&x.encode()), Some(x));
        }
        let e = h.check(&tree.encode(), 1, 0).unwrap_err().to_string();
        assert!(
            e.contains("mismatched algorithms")
                && e.contains("by Tree on 2 channel(s)")
                && e.contains("by Ring on 1 channel(s)")
                && e.contains("NCCL_ALGO"),
            "{e}"
        );
        // A different count is still named as that, whatever the plan.
        let more = OpHeader { count: 3, ..tree };
        let e = h.check(&more.encode(), 1, 0).unwrap_err().to_string();
        assert!(e.contains("mismatched counts"), "{e}");
    }
}
