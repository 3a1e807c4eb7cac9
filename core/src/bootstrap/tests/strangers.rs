//! What a stranger without the key may do to a rank's listener: no memory
//! pinned, excess connections closed, forged failure notices ignored.

use super::*;

/// WARN lines logged by any thread of this test binary (a global
/// subscriber, installed once: the service's readers log on their threads).
fn warnings() -> &'static std::sync::Mutex<Vec<String>> {
    use std::sync::{Mutex, OnceLock};
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    static LINES: OnceLock<&'static Mutex<Vec<String>>> = OnceLock::new();
    LINES.get_or_init(|| {
        let lines: &'static Mutex<Vec<String>> = Box::leak(Box::default());
        #[derive(Clone, Copy)]
        struct Sink(&'static Mutex<Vec<String>>);
        impl std::io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let mut l = self.0.lock().unwrap_or_else(|p| p.into_inner());
                l.extend(String::from_utf8_lossy(b).lines().map(str::to_string));
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink(lines);
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || sink)
            .with_filter(tracing_subscriber::filter::LevelFilter::WARN);
        use tracing_subscriber::Layer as _;
        tracing_subscriber::registry()
            .with(layer)
            .try_init()
            .expect("no other global subscriber in this test binary");
        lines
    })
}

/// Waits (up to 5 s) for a logged warning containing all of `parts`.
fn warned(parts: &[&str]) -> String {
    let start = Instant::now();
    loop {
        if let Some(l) = warnings()
            .lock()
            .unwrap()
            .iter()
            .find(|l| parts.iter().all(|p| l.contains(p)))
        {
            return l.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no warning with {parts:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A plain client connecting from `local` (any address of 127/8 is this
/// host's loopback: another address than the ranks').
fn connect_from(local: &str, to: std::net::SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(
        &format!("{local}:0")
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    s.connect(&to.into()).unwrap();
    s.into()
}

/// Whether the peer closed `s` within `wait` (a reset counts).
fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn a_stranger_with_the_magic_cannot_pin_memory_and_excess_connections_close() {
    warnings();
    let bs = ranks(2, "5");
    let magic = bs[1].shared.magic;
    let target = bs[1].listen_addr();
    // As the probe did: 12 connections, each 3 pieces of 16 MiB of one
    // message that never ends, claiming rank 0 from rank 0's own address
    // (what a process on its host can do without the key).
    let piece = Frame {
        magic,
        kind: proto::DATA | proto::MORE,
        from: 0,
        tag: 77,
        payload: vec![0xab; proto::MAX_CHUNK],
    }
    .encode();
    let socks = Arc::new(std::sync::Mutex::new(Vec::new()));
    let attackers: Vec<_> = (0..12)
        .map(|_| {
            let piece = piece.clone();
            let socks = socks.clone();
            std::thread::spawn(move || {
                let Ok(mut s) = TcpStream::connect(target) else {
                    return;
                };
                socks.lock().unwrap().push(s.try_clone().unwrap());
                for _ in 0..3 {
                    if s.write_all(&piece).is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    // What rank 1 holds for peers, sampled for 3 s: before the caps, 576 MiB
    // and more (the probe saw 1.19 GB of the process, 14 s later).
    let mut most = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        most = most.max(bs[1].shared.held_bytes());
        std::thread::sleep(Duration::from_millis(5));
    }
    let bound = 3 * proto::MAX_CHUNK + (2 << 20);
    assert!(
        most <= bound,
        "rank 1 held {most} bytes for a stranger (at most {bound} expected)"
    );
    assert!(
        most >= proto::MAX_CHUNK,
        "the attack did not get going: {most}"
    );
    // The stranger goes (its blocked writes fail).
    for s in socks.lock().unwrap().iter() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    for a in attackers {
        a.join().unwrap();
    }
    // The one holding the slot stalls, and is dropped within the first wait
    // (5 s here), the others as they stall in turn; then nothing is held.
    let start = Instant::now();
    while bs[1].shared.held_bytes() > 0 || bs[1].shared.open_from([127, 0, 0, 1].into()) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "still held: {} bytes, {} connections",
            bs[1].shared.held_bytes(),
            bs[1].shared.open_from([127, 0, 0, 1].into())
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // From another address, where no rank listens: 4 connections at most;
    // the ones past them are closed at once, not at the first wait.
    let mut held: Vec<TcpStream> = (0..limits::SPARE_CONNS)
        .map(|_| connect_from("127.0.0.2", target))
        .collect();
    let t = Instant::now();
    for _ in 0..6 {
        let mut extra = connect_from("127.0.0.2", target);
        assert!(
            closed_within(&mut extra, Duration::from_secs(2)),
            "a connection past the cap was kept"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    warned(&["closed a connection from 127.0.0.2:", "at most 4"]);
    for s in &mut held {
        assert!(
            !closed_within(s, Duration::from_millis(1)),
            "kept ones stay"
        );
    }
    drop(held);
    // The ranks talk on.
    bs[0].send(1, 5, b"still here").unwrap();
    assert_eq!(bs[1].recv(0, 5).unwrap(), b"still here");
}

#[test]
fn a_forged_failure_notice_is_ignored_and_its_address_named() {
    warnings();
    let bs = ranks(2, "10");
    let magic = bs[1].shared.magic;
    // Rank 0 listens on 127.0.0.1; the stranger writes from 127.0.0.2.
    let mut s = connect_from("127.0.0.2", bs[1].listen_addr());
    let forged = Frame {
        magic,
        kind: proto::ABORT,
        from: 0,
        tag: 0,
        payload: b"forged by a stranger".to_vec(),
    };
    s.write_all(&forged.encode()).unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)));
    let line = warned(&["ignored a failure notice from 127.0.0.2:", "rank 0"]);
    assert!(line.contains("which is at 127.0.0.1"), "{line}");
    eprintln!("{line}");
    assert_eq!(bs[1].remote_failure(), None, "the forged notice was taken");
    // A message forged the same way is refused too, and rank 0's own
    // notice still ends rank 1's wait.
    let mut s = connect_from("127.0.0.2", bs[1].listen_addr());
    s.write_all(
        &Frame {
            kind: proto::DATA,
            tag: 5,
            payload: b"forged".to_vec(),
            ..forged
        }
        .encode(),
    )
    .unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)));
    warned(&["refused a message from 127.0.0.2:", "rank 0"]);
    bs[0].send(1, 5, b"real").unwrap();
    assert_eq!(bs[1].recv(0, 5).unwrap(), b"real");
    bs[0].broadcast_failure("real failure");
    let e = bs[1].recv(0, 99).unwrap_err();
    assert_eq!(e.message(), "rank 0 failed: real failure");
}
