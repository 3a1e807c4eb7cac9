//! Loopback pairs for tests, of this network and of what drives it (the
//! core's proxy): connect and accept polled from one thread, bounded in
//! time, so that a hang fails the test instead of stalling the suite.

use std::time::{Duration, Instant};

use oxccl_plugin::{ListenComm, Net, NetHandle, RecvComm, SendComm};

const LIMIT: Duration = Duration::from_secs(30);

/// A connected pair on device 0 of `net` (this network, or any other, such
/// as one reached through the C ABI). Neither call may block, or this would
/// never finish.
pub fn pair(net: &dyn Net) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let (h, mut l) = net.listen(0).unwrap();
    connect_accept(net, h, l.as_mut())
}

/// Polls connect and accept on one listener until both ends exist.
pub fn connect_accept(
    net: &dyn Net,
    mut h: NetHandle,
    l: &mut dyn ListenComm,
) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let original = h;
    let (mut s, mut r) = (None, None);
    let start = Instant::now();
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = net.connect(0, &mut h).unwrap();
        }
        if r.is_none() {
            r = l.accept().unwrap();
        }
        assert!(start.elapsed() < LIMIT, "connect/accept never completed");
    }
    assert_eq!(h, original, "connect leaves the handle as it found it");
    (s.unwrap(), r.unwrap())
}

/// What a receiving connection made of the bytes on its control socket
/// ([`digest_control_stream`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Framing {
    /// The receives that completed, in order: each message's bytes.
    pub messages: Vec<Vec<u8>>,
    /// Why the connection failed, if it did.
    pub failed: Option<String>,
}

/// Posts receives of `rooms` bytes each (tag 0, in order) on the
/// receiving end of a connection whose control socket carries `bytes`
/// and then closes, and polls them until each completed or the
/// connection failed. Checks what came out against [`expected_framing`]
/// (the same framing read by a second, plain reader) and panics where they
/// differ, where a receive is told of more bytes than it posted, or where
/// the connection neither finishes nor fails within 10 s.
///
/// The entry point of the fuzz target (`fuzz/`, `cargo fuzz run
/// socket_framing`) and of its bounded stand-in among the tests.
pub fn digest_control_stream(bytes: &[u8], rooms: &[usize]) -> Framing {
    use std::io::Write as _;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    let (a, mut b) = UnixStream::pair().expect("a socket pair");
    a.set_nonblocking(true).expect("non-blocking");
    let sock = socket2::Socket::from(a);
    let data = bytes.to_vec();
    let writer = std::thread::spawn(move || {
        // The receiver may fail and close first: a broken pipe is fine.
        let _ = b.write_all(&data);
    });
    let mut q = crate::request::Queue::new(
        false,
        Arc::from("fuzz peer"),
        crate::stream::Stream { sock, sess: None },
        crate::request::DataPath::new(Vec::new(), 0),
    );
    let mut bufs: Vec<Vec<u8>> = rooms.iter().map(|&n| vec![0u8; n]).collect();
    let mut ids = Vec::new();
    for buf in &mut bufs {
        let id = q
            .post(buf.as_mut_ptr() as usize, buf.len(), 0, None)
            .expect("a fresh connection takes receives")
            .expect("room for them");
        ids.push(id);
    }
    let mut out = Framing::default();
    let start = Instant::now();
    'all: for (i, id) in ids.into_iter().enumerate() {
        loop {
            match q.poll(id) {
                Ok(Some(n)) => {
                    assert!(n <= rooms[i], "a receive of {} told of {n} bytes", rooms[i]);
                    out.messages.push(bufs[i][..n].to_vec());
                    break;
                }
                Ok(None) => {
                    assert!(
                        start.elapsed() < Duration::from_secs(10),
                        "receive {i} neither completed nor failed within 10 s"
                    );
                    std::thread::yield_now();
                }
                Err(e) => {
                    out.failed = Some(e.to_string());
                    break 'all;
                }
            }
        }
    }
    q.close();
    writer.join().expect("the writer thread");
    let want = expected_framing(bytes, rooms);
    assert_eq!(out.messages, want.messages, "the messages differ");
    assert_eq!(
        out.failed.is_some(),
        want.failed.is_some(),
        "one reader failed, the other did not: {:?} / {:?}",
        out.failed,
        want.failed
    );
    out
}

/// The messages `bytes` hold for receives of `rooms` bytes (tag 0), read
/// plainly: a 16-byte header (size u64, tag i32, check word u32, little
/// endian) and the payload, in order; the first that does not fit fails
/// the rest.
pub fn expected_framing(bytes: &[u8], rooms: &[usize]) -> Framing {
    let mut out = Framing::default();
    let mut at = 0;
    for &room in rooms {
        let Some(h) = bytes.get(at..at + 16) else {
            out.failed = Some("closed before a header".into());
            return out;
        };
        let size = u64::from_le_bytes(h[0..8].try_into().expect("8 bytes"));
        let tag = i32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
        let check = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
        if check != 0x4f58_4d31 || tag != 0 || size > room as u64 {
            out.failed = Some("a header refused".into());
            return out;
        }
        let size = size as usize;
        let Some(p) = bytes.get(at + 16..at + 16 + size) else {
            out.failed = Some("closed inside a payload".into());
            return out;
        };
        out.messages.push(p.to_vec());
        at += 16 + size;
    }
    out
}

/// `payloads` as a sender frames them (tag 0).
pub fn frame_messages(payloads: &[&[u8]]) -> Vec<u8> {
    let mut b = Vec::new();
    for p in payloads {
        b.extend_from_slice(&(p.len() as u64).to_le_bytes());
        b.extend_from_slice(&0i32.to_le_bytes());
        b.extend_from_slice(&0x4f58_4d31u32.to_le_bytes());
        b.extend_from_slice(p);
    }
    b
}
