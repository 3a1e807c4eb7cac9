//! Sessions against each other in memory, every byte accounted for.

use proptest::prelude::*;

use crate::session::{Role, SecureError, Session, MAX_PLAIN};
use crate::Key;

fn key(b: u8) -> Key {
    let mut k = [0u8; 32];
    for (i, x) in k.iter_mut().enumerate() {
        *x = b.wrapping_mul(31).wrapping_add(i as u8);
    }
    Key::from_bytes(k)
}

/// Moves what `from` has queued into `to`, returning the bytes moved.
fn pump(from: &mut Session, to: &mut Session) -> Result<Vec<u8>, SecureError> {
    let mut wire = Vec::new();
    from.flush_with(|b| {
        wire.extend_from_slice(b);
        Ok(b.len())
    })?;
    feed(to, &wire)?;
    Ok(wire)
}

fn feed(to: &mut Session, mut bytes: &[u8]) -> Result<(), SecureError> {
    while !bytes.is_empty() {
        let n = to.read_with(|b| {
            let n = b.len().min(bytes.len());
            b[..n].copy_from_slice(&bytes[..n]);
            Ok(n)
        })?;
        bytes = &bytes[n..];
        to.advance()?;
    }
    Ok(())
}

fn drain(s: &mut Session) -> Result<Vec<u8>, SecureError> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 100_000];
    loop {
        let n = s.open(&mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

fn connected(ki: &Key, kr: &Key) -> Result<(Session, Session, Vec<u8>), SecureError> {
    let mut i = Session::new(Role::Initiator, ki, b"test")?;
    let mut r = Session::new(Role::Responder, kr, b"test")?;
    let mut wire = pump(&mut i, &mut r)?;
    pump(&mut r, &mut i)?;
    assert!(i.is_ready());
    wire.extend(pump(&mut i, &mut r)?);
    assert!(r.is_ready());
    Ok((i, r, wire))
}

#[test]
fn handshake_then_data_both_ways_in_records() {
    let (mut i, mut r, _) = connected(&key(1), &key(1)).unwrap();
    let big: Vec<u8> = (0..3 * MAX_PLAIN + 5).map(|x| (x * 7) as u8).collect();
    assert_eq!(
        i.seal(&[b"head", &big, b"", b"tail"], usize::MAX).unwrap(),
        big.len() + 8
    );
    pump(&mut i, &mut r).unwrap();
    let got = drain(&mut r).unwrap();
    assert_eq!(&got[..4], b"head");
    assert_eq!(&got[4..4 + big.len()], &big[..]);
    assert_eq!(&got[4 + big.len()..], b"tail");
    r.seal(&[b"answer"], usize::MAX).unwrap();
    pump(&mut r, &mut i).unwrap();
    assert_eq!(drain(&mut i).unwrap(), b"answer");
    // Small reads take a record in pieces.
    i.seal(&[&big[..1000]], usize::MAX).unwrap();
    pump(&mut i, &mut r).unwrap();
    let mut b = [0u8; 7];
    let mut got = Vec::new();
    while got.len() < 1000 {
        let n = r.open(&mut b).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&b[..n]);
    }
    assert_eq!(got, &big[..1000]);
}

#[test]
fn wrong_key_is_refused_at_the_first_message() {
    let e = connected(&key(1), &key(2)).err().unwrap();
    assert!(matches!(e, SecureError::WrongKey), "{e}");
    assert!(e.to_string().contains("NCCL_SOCKET_KEY_FILE"));
    // Another prologue (another protocol or connection) is refused the same way.
    let mut i = Session::new(Role::Initiator, &key(1), b"bootstrap").unwrap();
    let mut r = Session::new(Role::Responder, &key(1), b"net").unwrap();
    assert!(matches!(pump(&mut i, &mut r), Err(SecureError::WrongKey)));
}

#[test]
fn a_peer_in_clear_is_refused_after_two_bytes() {
    let mut r = Session::new(Role::Responder, &key(1), b"test").unwrap();
    match feed(&mut r, &[0x12, 0x34]) {
        Err(e @ SecureError::NotEncrypted { len: 0x1234 }) => {
            assert!(e.to_string().contains("no key"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_replayed_connection_gets_no_byte_through() {
    let (mut i, mut r, mut wire) = connected(&key(1), &key(1)).unwrap();
    i.seal(&[b"rank 3 says hello"], usize::MAX).unwrap();
    wire.extend(pump(&mut i, &mut r).unwrap());
    assert_eq!(drain(&mut r).unwrap(), b"rank 3 says hello");
    // The same bytes again, to a fresh responder with the right key.
    let mut r2 = Session::new(Role::Responder, &key(1), b"test").unwrap();
    let e = feed(&mut r2, &wire).err().unwrap();
    assert!(matches!(e, SecureError::NotConfirmed), "{e}");
    assert!(drain(&mut r2).is_err());
}

#[test]
fn a_flipped_bit_or_a_replayed_record_ends_the_stream() {
    for what in ["flip", "replay", "drop"] {
        let (mut i, mut r, _) = connected(&key(1), &key(1)).unwrap();
        let mut recs = Vec::new();
        for m in [&b"one"[..], b"two"] {
            i.seal(&[m], usize::MAX).unwrap();
            let mut w = Vec::new();
            i.flush_with(|b| {
                w.extend_from_slice(b);
                Ok(b.len())
            })
            .unwrap();
            recs.push(w);
        }
        let wire = match what {
            "flip" => {
                let mut w = recs.concat();
                w[4] ^= 1;
                w
            }
            "replay" => [recs[0].clone(), recs[0].clone()].concat(),
            _ => recs[1].clone(),
        };
        feed(&mut r, &wire).unwrap();
        let mut buf = [0u8; 64];
        let mut got = Vec::new();
        let e = loop {
            match r.open(&mut buf) {
                Ok(0) => panic!("{what}: no error"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break e,
            }
        };
        assert!(matches!(e, SecureError::Tampered { .. }), "{what}: {e}");
        // Nothing but the untouched first record came out.
        assert!(got.is_empty() || got == b"one", "{what}: {got:?}");
    }
}

#[test]
fn blocking_streams_over_loopback() {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut s = crate::SecureStream::handshake(s, Role::Responder, &key(4), b"x").unwrap();
        let mut v = Vec::new();
        s.read_to_end(&mut v).unwrap();
        v
    });
    let s = std::net::TcpStream::connect(addr).unwrap();
    let mut s = crate::SecureStream::handshake(s, Role::Initiator, &key(4), b"x").unwrap();
    let data: Vec<u8> = (0..5_000_000u32).map(|x| x as u8).collect();
    s.write_all(&data).unwrap();
    s.get_ref().shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(t.join().unwrap(), data);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever bytes a stranger sends, a responder neither panics nor lets
    /// a byte of plaintext out.
    #[test]
    fn garbage_never_yields_plaintext(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut r = Session::new(Role::Responder, &key(1), b"test").unwrap();
        let fed = feed(&mut r, &bytes);
        prop_assert!(!r.is_ready());
        if fed.is_ok() {
            let mut b = [0u8; 64];
            prop_assert_eq!(r.open(&mut b).unwrap_or(0), 0);
        }
    }

    /// A true stream cut anywhere arrives whole.
    #[test]
    fn any_cut_of_a_stream_arrives_whole(
        msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 1..6),
        cut in 1usize..5000,
    ) {
        let mut i = Session::new(Role::Initiator, &key(9), b"p").unwrap();
        let mut r = Session::new(Role::Responder, &key(9), b"p").unwrap();
        let mut wire = Vec::new();
        let take = |s: &mut Session| {
            let mut w = Vec::new();
            s.flush_with(|b| { w.extend_from_slice(b); Ok(b.len()) }).unwrap();
            w
        };
        wire.extend(take(&mut i));
        feed(&mut r, &wire).unwrap();
        let back = take(&mut r);
        feed(&mut i, &back).unwrap();
        let mut rest = take(&mut i);
        for m in &msgs {
            i.seal(&[m], usize::MAX).unwrap();
        }
        rest.extend(take(&mut i));
        let mut got = Vec::new();
        for piece in rest.chunks(cut) {
            feed(&mut r, piece).unwrap();
            got.extend(drain(&mut r).unwrap());
        }
        prop_assert_eq!(got, msgs.concat());
    }
}

/// A socket that hands out the wire in pieces of the given sizes, saying
/// "would block" between them, as a non-blocking socket does.
struct Chunky {
    wire: Vec<u8>,
    at: usize,
    sizes: Vec<usize>,
    turn: usize,
    dry: bool,
}

impl Chunky {
    fn new(wire: Vec<u8>, sizes: Vec<usize>) -> Chunky {
        Chunky {
            wire,
            at: 0,
            sizes,
            turn: 0,
            dry: false,
        }
    }
}

impl std::io::Read for Chunky {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.read_vectored(&mut [std::io::IoSliceMut::new(buf)])
    }
    fn read_vectored(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
        self.dry = !self.dry;
        if self.dry && self.at < self.wire.len() {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let mut left = self.sizes[self.turn % self.sizes.len()].min(self.wire.len() - self.at);
        self.turn += 1;
        let mut n = 0;
        for b in bufs.iter_mut() {
            let k = left.min(b.len());
            b[..k].copy_from_slice(&self.wire[self.at..self.at + k]);
            (self.at, left, n) = (self.at + k, left - k, n + k);
        }
        Ok(n)
    }
}

/// Receives `len` bytes into `dst` with `read_from`, as the socket network
/// does: again and again on the rest of the buffer while the socket is dry.
fn receive(r: &mut Session, s: &mut Chunky, dst: &mut [u8]) -> Result<(), SecureError> {
    let mut off = 0;
    while off < dst.len() {
        match r.read_from(s, &mut dst[off..])? {
            Some(0) => panic!("end of stream at {off} of {}", dst.len()),
            Some(n) => off += n,
            None => {}
        }
    }
    Ok(())
}

#[test]
fn large_records_open_in_the_callers_buffer_and_it_must_stay() {
    let (mut i, mut r, _) = connected(&key(3), &key(3)).unwrap();
    let big: Vec<u8> = (0..2 * MAX_PLAIN + 77)
        .map(|x| (x * 13 + 5) as u8)
        .collect();
    i.seal(&[&big], usize::MAX).unwrap();
    let mut wire = Vec::new();
    i.flush_with(|b| {
        wire.extend_from_slice(b);
        Ok(b.len())
    })
    .unwrap();
    // The first record arrives in part, then the caller moves its buffer.
    let mut s = Chunky::new(wire, vec![70_000]);
    let mut a = vec![0u8; big.len()];
    let mut got = None;
    while got.is_none() {
        got = r.read_from(&mut s, &mut a).unwrap();
        if s.at > 40_000 {
            break;
        }
    }
    assert!(got.is_none(), "a record of {MAX_PLAIN} bytes came whole");
    let mut b = vec![0u8; big.len()];
    let e = r.read_from(&mut s, &mut b).unwrap_err();
    assert!(e.to_string().contains("receive buffer changed"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Messages of every size, sealed as the socket network seals them and
    /// received through a socket that runs dry at random points, arrive
    /// whole, whether their records open in the caller's buffer or aside.
    #[test]
    fn read_from_delivers_every_byte_whatever_the_pieces(
        sizes in proptest::collection::vec(
            prop_oneof![0usize..100, 15_000usize..20_000, 200_000usize..700_000], 1..5),
        pieces in proptest::collection::vec(1usize..300_000, 1..8),
        seed in any::<u8>(),
    ) {
        let (mut i, mut r, _) = connected(&key(5), &key(5)).unwrap();
        let msgs: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| (0..n).map(|x| (x * 31 + k * 7 + seed as usize) as u8).collect())
            .collect();
        let mut wire = Vec::new();
        for m in &msgs {
            // A small header record, then the payload in batches.
            i.seal(&[&(m.len() as u32).to_le_bytes()], usize::MAX).unwrap();
            let mut at = 0;
            loop {
                i.flush_with(|b| { wire.extend_from_slice(b); Ok(b.len()) }).unwrap();
                if at == m.len() {
                    break;
                }
                at += i.seal(&[&m[at..]], crate::session::SEAL_BATCH).unwrap();
            }
        }
        let mut s = Chunky::new(wire, pieces);
        for m in &msgs {
            let mut h = [0u8; 4];
            receive(&mut r, &mut s, &mut h).unwrap();
            prop_assert_eq!(u32::from_le_bytes(h) as usize, m.len());
            let mut dst = vec![0xeeu8; m.len()];
            receive(&mut r, &mut s, &mut dst).unwrap();
            prop_assert!(dst == *m);
        }
        prop_assert_eq!(r.pending_in(), 0);
    }
}
