//! The bootstrap's reader and decoders over any bytes: frames, DATA
//! reassembly, hellos (and the root's state machine), tables, errors,
//! progress answers, and the unique id (`oxccl::bootstrap::proto::digest`).
//! The first byte sets the size of the reads the stream arrives in.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxccl::bootstrap::proto::digest;

/// The communicator's magic: libFuzzer's comparison tracing finds it.
const MAGIC: u64 = 0x0123_4567_89ab_cdef;

fuzz_target!(|data: &[u8]| {
    let Some((&read, bytes)) = data.split_first() else {
        return;
    };
    let d = digest(MAGIC, bytes, usize::from(read) + 1);
    // Never more bytes out than came in.
    let out: usize = d.messages.iter().map(|(_, m)| m.len()).sum();
    assert!(out <= bytes.len());
});
