//! The cipher's speed on one core, the limit for one encrypted connection
//! (docs/performance.md, "Encrypted traffic"): ring's AES-256-GCM sealing
//! and opening in place, and a session's records end to end (the copy into
//! the send buffer included; received records open where they land, as a
//! socket read would leave them). `cargo run --release -p oxccl-secure --example seal_speed [MiB]`.

use std::io::Read;
use std::time::Instant;

use oxccl_secure::session::MAX_PLAIN;
use oxccl_secure::{Key, Role, Session};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM};

/// The sealed bytes, read back as a socket would hand them out.
struct Wire<'a>(&'a [u8]);

impl Read for Wire<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
    fn read_vectored(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
        self.0.read_vectored(bufs)
    }
}

fn flush(s: &mut Session, wire: &mut Vec<u8>) {
    s.flush_with(|b| {
        wire.extend_from_slice(b);
        Ok(b.len())
    })
    .expect("flush");
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2048);
    let gb = (mib << 20) as f64 / 1e9;
    let rec = MAX_PLAIN;

    // The cipher alone, in place: both key sizes.
    for (alg, name, klen) in [
        (&AES_256_GCM, "AES-256-GCM", 32),
        (&AES_128_GCM, "AES-128-GCM", 16),
    ] {
        cipher_alone(alg, name, &[7u8; 32][..klen], mib, rec);
    }

    // A session's records: seal (copy + cipher), then read_from into the
    // destination (opened in place).
    let key = Key::generate().expect("urandom");
    let mut i = Session::new(Role::Initiator, &key, b"speed").expect("session");
    let mut r = Session::new(Role::Responder, &key, b"speed").expect("session");
    let mut wire = Vec::new();
    // The handshake: initiator, responder, initiator (the confirmation).
    for turn in 0..3 {
        let (from, to) = if turn % 2 == 0 {
            (&mut i, &mut r)
        } else {
            (&mut r, &mut i)
        };
        wire.clear();
        flush(from, &mut wire);
        let mut w = Wire(&wire);
        while to.read_with(|b| w.read(b)).expect("read") > 0 {}
        to.advance().expect("handshake");
    }
    assert!(i.is_ready() && r.is_ready());
    let chunk = vec![7u8; 1 << 20];
    let mut out = vec![0u8; 1 << 20];
    let (mut seal, mut open) = (0f64, 0f64);
    for _ in 0..mib {
        wire.clear();
        let t = Instant::now();
        let mut at = 0;
        while at < chunk.len() {
            at += i.seal(&[&chunk[at..]], MAX_PLAIN).expect("seal");
            flush(&mut i, &mut wire);
        }
        let t1 = Instant::now();
        let mut w = Wire(&wire);
        let mut got = 0;
        while got < out.len() {
            got += r
                .read_from(&mut w, &mut out[got..])
                .expect("open")
                .expect("in memory");
        }
        seal += (t1 - t).as_secs_f64();
        open += t1.elapsed().as_secs_f64();
    }
    println!(
        "session ({}), {mib} MiB: seal {:.2} GB/s (copy into the send buffer included), open {:.2} GB/s (one copy from the wire, as a socket read)",
        oxccl_secure::describe(),
        gb / seal,
        gb / open
    );
}

/// `alg` sealing and opening `mib` MiB in place, in records of `rec` bytes.
fn cipher_alone(
    alg: &'static ring::aead::Algorithm,
    name: &str,
    key: &[u8],
    mib: usize,
    rec: usize,
) {
    let gb = (mib << 20) as f64 / 1e9;
    let key = LessSafeKey::new(UnboundKey::new(alg, key).expect("key"));
    let nonce = |i: usize| {
        let mut b = [0u8; 12];
        b[4..].copy_from_slice(&(i as u64).to_be_bytes());
        Nonce::assume_unique_for_key(b)
    };
    let mut buf = vec![3u8; rec];
    let n = (mib << 20) / rec;
    let t = Instant::now();
    for i in 0..n {
        let tag = key
            .seal_in_place_separate_tag(nonce(i), Aad::empty(), &mut buf)
            .expect("seal");
        let _ = std::hint::black_box(tag);
    }
    let seal = t.elapsed().as_secs_f64();
    let sealed = buf.clone();
    let tag = key
        .seal_in_place_separate_tag(nonce(n), Aad::empty(), &mut buf.clone())
        .expect("seal");
    let t = Instant::now();
    for _ in 0..n {
        buf.copy_from_slice(&sealed);
        // Fails authentication (buf is not what was sealed under that
        // nonce) after doing all the work of an open.
        let _ = key.open_in_place_separate_tag(nonce(n), Aad::empty(), tag, &mut buf, 0..);
    }
    let open = t.elapsed().as_secs_f64();
    println!(
        "ring {name} in place, {} KiB records, {mib} MiB: seal {:.2} GB/s, open {:.2} GB/s (copy included) on one core",
        rec >> 10,
        gb / seal,
        gb / open
    );
}
