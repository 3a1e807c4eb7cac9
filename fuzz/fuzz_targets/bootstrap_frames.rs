//! The bootstrap's reader and decoders over any bytes: frames, DATA
//! reassembly, hellos (and the root's state machine), tables, errors,
//! progress answers, and the unique id (`oxccl::bootstrap::proto::digest`).
//! The first byte sets the size of the reads the stream arrives in, the
//! second the limit on a message's size (as `proto::MAX_MESSAGE` bounds a
//! rank's), so that messages past it come up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxccl::bootstrap::proto::{digest_limited, MAX_CHUNK};

/// The communicator's magic: libFuzzer's comparison tracing finds it.
const MAGIC: u64 = 0x0123_4567_89ab_cdef;

fuzz_target!(|data: &[u8]| {
    let [read, limit, bytes @ ..] = data else {
        return;
    };
    let max_message = usize::from(*limit) * 16;
    let d = digest_limited(MAGIC, bytes, usize::from(*read) + 1, MAX_CHUNK, max_message);
    // Never more bytes out than came in, no message past the limit, and
    // memory held in proportion to the bytes that came, not to the
    // lengths they announce.
    let out: usize = d.messages.iter().map(|(_, m)| m.len()).sum();
    assert!(out <= bytes.len());
    assert!(d.messages.iter().all(|(_, m)| m.len() <= max_message));
    assert!(d.peak_held <= 3 * bytes.len() + 64);
});
