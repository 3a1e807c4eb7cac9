//! One TCP stream between two ranks, in clear or through a session: the
//! raw figure the encrypted socket network is compared with
//! (tools/secure_perf.sh runs it in two network namespaces).
//!
//! `RANK=0 MASTER_ADDR=A MASTER_PORT=P stream [MiB] [--key FILE]` receives,
//! `RANK=1 ...` connects and sends; rank 0 prints the rate. With `--key`
//! both sides run the handshake and move AES-128-GCM records, read
//! straight into the receive buffer, as the socket network does.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use oxccl_secure::{Key, Role, Session};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(4096);
    let key = args
        .iter()
        .position(|a| a == "--key")
        .and_then(|i| args.get(i + 1))
        .map(|f| {
            Key::parse_hex(&std::fs::read_to_string(f).expect("the key file"))
                .expect("64 hex digits")
        });
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let addr = format!("{}:{}", env("MASTER_ADDR"), env("MASTER_PORT"));
    let rank: usize = env("RANK").parse().expect("RANK");
    let block = 1 << 20;
    let total = mib << 20;
    if rank == 0 {
        let l = TcpListener::bind(&addr).expect("bind");
        let (mut s, _) = l.accept().expect("accept");
        s.set_nodelay(true).ok();
        let mut sess = key.as_ref().map(|k| {
            let mut x = Session::new(Role::Responder, k, b"stream").expect("session");
            x.handshake(&mut s).expect("handshake");
            x
        });
        let mut buf = vec![0u8; block];
        let (mut got, mut start) = (0, None);
        while got < total {
            let n = match sess.as_mut() {
                Some(x) => x
                    .read_from(&mut s, &mut buf)
                    .expect("read")
                    .expect("blocking"),
                None => s.read(&mut buf).expect("read"),
            };
            assert!(n > 0, "the sender stopped at {got} bytes");
            start.get_or_insert_with(Instant::now);
            got += n;
        }
        let t = start.expect("bytes came").elapsed().as_secs_f64();
        println!(
            "one TCP stream, {mib} MiB in 1 MiB reads, {}: {:.2} GB/s",
            if key.is_some() {
                "encrypted (AES-128-GCM records, oxccl-secure)"
            } else {
                "clear"
            },
            total as f64 / t / 1e9
        );
    } else {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut s = loop {
            match TcpStream::connect(&addr) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("connect to {addr}: {e}"),
            }
        };
        s.set_nodelay(true).ok();
        let data: Vec<u8> = (0..block).map(|i| (i * 7) as u8).collect();
        match key.as_ref() {
            Some(k) => {
                let mut x = Session::new(Role::Initiator, k, b"stream").expect("session");
                x.handshake(&mut s).expect("handshake");
                for _ in 0..mib {
                    x.send_all(&mut s, &[&data]).expect("send");
                }
            }
            None => {
                for _ in 0..mib {
                    s.write_all(&data).expect("send");
                }
            }
        }
        s.shutdown(std::net::Shutdown::Write).ok();
        // Wait for the receiver to close, so the last bytes are counted.
        let _ = s.read(&mut [0u8; 1]);
    }
}
