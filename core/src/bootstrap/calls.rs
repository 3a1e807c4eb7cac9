//! The collectives a rank called last, by number, for peers to ask about.
//!
//! Each rank takes a path (inline, threads, rings or trees, how many
//! channels, which peers) from its own count. Ranks whose counts differ
//! may then wait on peers that never come, and never exchange the
//! operation header that would have named the mismatch; a rank with a
//! count of 0 sends nothing at all. So every rank writes down what it
//! called, before it takes a path, and a rank that waits long asks the
//! peers it waits on what they called under its number (the bootstrap's
//! progress query, with the number in its payload): a different call is
//! named at once, on the asking rank, which tells the others.

use std::sync::Mutex;

/// Bytes of a call as it is kept: the operation header's encoding.
pub const CALL_BYTES: usize = 32;
/// Calls kept: a peer asks about the one it waits in, which a rank ahead
/// of it (count-0 calls need no peer) has left at most this many behind.
const KEPT: usize = 64;

/// The last [`KEPT`] calls, each at its number modulo [`KEPT`].
pub struct CallBook {
    /// (number + 1, call); 0: never written.
    slots: Mutex<Vec<(u64, [u8; CALL_BYTES])>>,
}

impl Default for CallBook {
    fn default() -> Self {
        CallBook {
            slots: Mutex::new(vec![(0, [0; CALL_BYTES]); KEPT]),
        }
    }
}

impl CallBook {
    /// Writes down call `seq` (an uncontended lock and 40 bytes).
    pub fn record(&self, seq: u64, call: [u8; CALL_BYTES]) {
        let mut s = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s[(seq % KEPT as u64) as usize] = (seq.wrapping_add(1), call);
    }

    /// Call `seq`, if it is one of the last [`KEPT`] written.
    pub fn get(&self, seq: u64) -> Option<[u8; CALL_BYTES]> {
        let s = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (at, call) = s[(seq % KEPT as u64) as usize];
        (at == seq.wrapping_add(1)).then_some(call)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_calls_are_kept_by_number() {
        let b = CallBook::default();
        assert_eq!(b.get(0), None);
        for seq in 0..200u64 {
            b.record(seq, [seq as u8; CALL_BYTES]);
        }
        assert_eq!(b.get(199), Some([199; CALL_BYTES]));
        assert_eq!(b.get(199 - KEPT as u64 + 1), Some([136; CALL_BYTES]));
        assert_eq!(b.get(199 - KEPT as u64), None, "overwritten");
        assert_eq!(b.get(200), None, "not called yet");
    }
}
