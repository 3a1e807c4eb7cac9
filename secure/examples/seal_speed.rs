//! Seal-then-open speed of one session in memory, the limit for one
//! encrypted connection on one core (docs/PERF.md):
//! `cargo run --release -p oxccl-secure --example seal_speed [MiB]`.

use std::time::Instant;

use oxccl_secure::{Key, Role, Session};

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1024);
    let key = Key::generate().expect("urandom");
    let mut i = Session::new(Role::Initiator, &key, b"speed").expect("session");
    let mut r = Session::new(Role::Responder, &key, b"speed").expect("session");
    let mut wire = Vec::new();
    let pump = |from: &mut Session, to: &mut Session, wire: &mut Vec<u8>| {
        wire.clear();
        from.flush_with(|b| {
            wire.extend_from_slice(b);
            Ok(b.len())
        })
        .expect("flush");
        let mut at = 0;
        while at < wire.len() {
            at += to
                .read_with(|b| {
                    let n = b.len().min(wire.len() - at);
                    b[..n].copy_from_slice(&wire[at..at + n]);
                    Ok(n)
                })
                .expect("read");
            to.advance().expect("handshake");
        }
    };
    pump(&mut i, &mut r, &mut wire);
    pump(&mut r, &mut i, &mut wire);
    pump(&mut i, &mut r, &mut wire);
    let chunk = vec![7u8; 1 << 20];
    let mut out = vec![0u8; 1 << 20];
    let (mut seal, mut open) = (0f64, 0f64);
    for _ in 0..mib {
        let t = Instant::now();
        i.seal(&[&chunk], usize::MAX).expect("seal");
        let t1 = Instant::now();
        pump(&mut i, &mut r, &mut wire);
        let t2 = Instant::now();
        let mut got = 0;
        while got < chunk.len() {
            got += r.open(&mut out[got..]).expect("open");
        }
        seal += (t1 - t).as_secs_f64();
        open += t2.elapsed().as_secs_f64();
    }
    let gb = (mib << 20) as f64 / 1e9;
    println!(
        "{} over {mib} MiB in 64 KiB records: seal {:.2} GB/s, open {:.2} GB/s (one core each)",
        oxccl_secure::describe(),
        gb / seal,
        gb / open
    );
}
