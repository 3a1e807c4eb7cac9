//! The socket network's framing on a receiving connection's control
//! socket, over any bytes: message headers (size, tag, check word) and
//! payloads read into receives posted in order
//! (`oxccl_net_socket::testing::digest_control_stream`). The first byte
//! sets how many receives are posted (1 to 8), the next two bytes per
//! receive its room (up to 64 KiB, where messages ride inline); the rest
//! is the stream, which then closes. The digest panics where the
//! connection's reading differs from a plain reader's, where a receive is
//! told of more bytes than it posted, or where it hangs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxccl_net_socket::testing::digest_control_stream;

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 8) + 1;
    if rest.len() < 2 * n {
        return;
    }
    let (sizes, stream) = rest.split_at(2 * n);
    let rooms: Vec<usize> = sizes
        .chunks(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    digest_control_stream(stream, &rooms);
});
