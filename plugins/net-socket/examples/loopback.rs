//! One-off loopback measurement (not a test, not a benchmark suite):
//! throughput of 64 MiB messages and the round trip of 8-byte messages,
//! beside a plain single TCP stream on the same machine for reference.
//!
//! `cargo run --release -p oxccl-net-socket --example loopback`
//! (NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD apply as usual).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use oxccl_net_socket::SocketNet;
use oxccl_plugin::{Net, NetResult, RecvComm, Request, SendComm};

const SIZE: usize = 64 << 20;
const ROUNDS: usize = 10;
const PINGS: usize = 20_000;

fn pair(net: &SocketNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let (mut h, mut l) = net.listen(0).unwrap();
    let (mut s, mut r) = (None, None);
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = net.connect(0, &mut h).unwrap();
        }
        if r.is_none() {
            r = l.accept().unwrap();
        }
    }
    (s.unwrap(), r.unwrap())
}

/// Spins on `test` as a proxy thread does, yielding so that on a machine
/// with few cores the peer's thread still gets to run.
fn wait(r: &mut Box<dyn Request>) -> NetResult<usize> {
    loop {
        if let Some(s) = r.test()? {
            return Ok(s[0]);
        }
        std::thread::yield_now();
    }
}

fn gbps(d: Duration) -> f64 {
    SIZE as f64 / d.as_secs_f64() / 1e9
}

fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "best {:.2} GB/s, median {:.2} GB/s",
        gbps(v[0]),
        gbps(v[v.len() / 2])
    )
}

fn main() {
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    let net = SocketNet::from_env().unwrap();
    println!(
        "cores: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // Throughput: sender and receiver on their own threads, as two proxies.
    let (mut s, mut r) = pair(&net);
    let src: Vec<u8> = (0..SIZE).map(|i| (i * 7 + 3) as u8).collect();
    let sender = std::thread::spawn(move || {
        for _ in 0..=ROUNDS {
            // SAFETY: `src` outlives the request, waited for at once.
            let mut q = unsafe { s.isend(src.as_ptr(), SIZE, 0, None) }
                .unwrap()
                .unwrap();
            wait(&mut q).unwrap();
        }
        s
    });
    let mut dst = vec![0u8; SIZE];
    let mut times = Vec::new();
    for round in 0..=ROUNDS {
        let t = Instant::now();
        // SAFETY: `dst` outlives the request, waited for at once.
        let mut q = unsafe { r.irecv(dst.as_mut_ptr(), SIZE, 0, None) }
            .unwrap()
            .unwrap();
        assert_eq!(wait(&mut q).unwrap(), SIZE);
        if round > 0 {
            times.push(t.elapsed()); // round 0 warms up page tables and windows
        }
    }
    assert!(dst.iter().enumerate().all(|(i, &b)| b == (i * 7 + 3) as u8));
    drop(sender.join().unwrap());
    println!("oxccl socket net, 64 MiB isend/irecv: {}", summary(times));

    // Reference: one plain blocking TCP stream, same sizes, same machine.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let writer = std::thread::spawn(move || {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_nodelay(true).unwrap();
        let buf = vec![1u8; SIZE];
        for _ in 0..=ROUNDS {
            c.write_all(&buf).unwrap();
        }
    });
    let (mut c, _) = l.accept().unwrap();
    let mut times = Vec::new();
    for round in 0..=ROUNDS {
        let t = Instant::now();
        c.read_exact(&mut dst).unwrap();
        if round > 0 {
            times.push(t.elapsed());
        }
    }
    writer.join().unwrap();
    println!("plain TCP stream (1 socket, blocking):  {}", summary(times));

    // Latency: ping-pong of 8 bytes over two connections, both sides polling.
    let (mut s1, mut r1) = pair(&net);
    let (mut s2, mut r2) = pair(&net);
    let echo = std::thread::spawn(move || {
        let mut b = [0u8; 8];
        for _ in 0..PINGS {
            // SAFETY: `b` outlives each request, waited for at once.
            let mut q = unsafe { r1.irecv(b.as_mut_ptr(), 8, 1, None) }
                .unwrap()
                .unwrap();
            wait(&mut q).unwrap();
            // SAFETY: as above.
            let mut q = unsafe { s2.isend(b.as_ptr(), 8, 1, None) }
                .unwrap()
                .unwrap();
            wait(&mut q).unwrap();
        }
        (r1, s2)
    });
    let ping = 0x0123_4567_89ab_cdefu64.to_le_bytes();
    let mut pong = [0u8; 8];
    let t = Instant::now();
    for _ in 0..PINGS {
        // SAFETY: `pong` and `ping` outlive each request, waited for at once.
        let mut rq = unsafe { r2.irecv(pong.as_mut_ptr(), 8, 1, None) }
            .unwrap()
            .unwrap();
        // SAFETY: as above.
        let mut sq = unsafe { s1.isend(ping.as_ptr(), 8, 1, None) }
            .unwrap()
            .unwrap();
        wait(&mut sq).unwrap();
        wait(&mut rq).unwrap();
    }
    let rtt = t.elapsed() / PINGS as u32;
    assert_eq!(pong, ping);
    drop(echo.join().unwrap());
    println!(
        "8-byte round trip: {:.1} us (mean of {PINGS})",
        rtt.as_secs_f64() * 1e6
    );

    // Reference: the same ping-pong over one plain blocking TCP socket pair.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_nodelay(true).unwrap();
        let mut b = [0u8; 8];
        for _ in 0..PINGS {
            c.read_exact(&mut b).unwrap();
            c.write_all(&b).unwrap();
        }
    });
    let (mut c, _) = l.accept().unwrap();
    c.set_nodelay(true).unwrap();
    let t = Instant::now();
    for _ in 0..PINGS {
        c.write_all(&ping).unwrap();
        c.read_exact(&mut pong).unwrap();
    }
    let rtt = t.elapsed() / PINGS as u32;
    echo.join().unwrap();
    println!(
        "plain TCP 8-byte round trip (blocking): {:.1} us",
        rtt.as_secs_f64() * 1e6
    );
}
