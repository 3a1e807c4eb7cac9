//! Ranks as threads of this process, on loopback; every test is bounded in
//! time by NCCL_TIMEOUT.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use super::proto::Hello;
use super::*;

fn cfg(timeout: &str) -> Config {
    Config::load_with(&[("SOCKET_IFNAME", "lo"), ("TIMEOUT", timeout)]).unwrap()
}

fn init_all(id: UniqueId, n: usize, c: &Config) -> Vec<Bootstrap> {
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let c = c.clone();
            std::thread::spawn(move || Bootstrap::init(&id, r, n, &c).unwrap())
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// `n` ranks joined through `k` roots (each its own id), one thread each.
fn init_roots(n: usize, k: usize, c: &Config) -> Vec<Bootstrap> {
    let ids: Vec<UniqueId> = (0..k).map(|_| get_unique_id(c).unwrap()).collect();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (c, ids) = (c.clone(), ids.clone());
            std::thread::spawn(move || Bootstrap::init_scalable(&ids, r, n, &c).unwrap())
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn ranks(n: usize, timeout: &str) -> Vec<Bootstrap> {
    let c = cfg(timeout);
    init_all(get_unique_id(&c).unwrap(), n, &c)
}

/// Reads until the peer closes; panics if it does not within 5 s.
fn expect_closed(s: &mut TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the connection was not closed: {e}"),
        }
    }
}

#[test]
fn bootstrap_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Bootstrap>();
    check::<UniqueId>();
}

#[test]
fn five_ranks_allgather_tagged_messages_and_barrier() {
    let bs = ranks(5, "10");
    std::thread::scope(|s| {
        for b in &bs {
            s.spawn(move || {
                let me = b.rank();
                // Random data of a different length on each rank, empty on one.
                let data = |r: usize| -> Vec<u8> {
                    let mut g = rand::rngs::StdRng::seed_from_u64(r as u64 + 1000);
                    let len = if r == 3 { 0 } else { g.random_range(1..5000) };
                    (0..len).map(|_| g.random()).collect()
                };
                for round in 0..3 {
                    let all = b.allgather(&data(me + round * 5)).unwrap();
                    let expect: Vec<_> = (0..5).map(|r| data(r + round * 5)).collect();
                    assert_eq!(all, expect);
                }
                // To every peer, tags sent in one order and received in
                // another, two messages under one tag kept in order.
                let mut tags = [7u64, 3, 9, 1 << 40, (1 << 62) - 1];
                for p in 0..5 {
                    for &t in &tags {
                        b.send(p, t, &[me as u8, t as u8, 1]).unwrap();
                    }
                    b.send(p, 7, &[me as u8, 7, 2]).unwrap();
                }
                tags.reverse();
                let mut order: Vec<usize> = (0..5).collect();
                order.rotate_left(me);
                for p in order {
                    for &t in &tags {
                        assert_eq!(b.recv(p, t).unwrap(), [p as u8, t as u8, 1]);
                    }
                    assert_eq!(b.recv(p, 7).unwrap(), [p as u8, 7, 2]);
                }
                for _ in 0..3 {
                    b.barrier().unwrap();
                }
            });
        }
    });
}

#[test]
fn messages_longer_than_a_frame() {
    let bs = ranks(2, "20");
    let big: Vec<u8> = (0..proto::MAX_CHUNK + 1234)
        .map(|i| (i % 251) as u8)
        .collect();
    std::thread::scope(|s| {
        s.spawn(|| bs[0].send(1, 5, &big).unwrap());
        assert_eq!(bs[1].recv(0, 5).unwrap(), big);
    });
}

#[test]
fn arguments_are_checked() {
    let c = cfg("5");
    let id = get_unique_id(&c).unwrap();
    let e = Bootstrap::init(&id, 3, 3, &c).err().unwrap();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.message().contains("rank 3"),
        "{e}"
    );
    let e = Bootstrap::init(&UniqueId([0; 128]), 0, 1, &c)
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let bs = init_all(id, 1, &c);
    let b = &bs[0];
    assert!(matches!(b.send(1, 0, &[]), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        b.send(0, TAG_RESERVED, &[]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        b.recv(0, u64::MAX),
        Err(Error::InvalidArgument(_))
    ));
    // One rank: collectives are trivial, messages to oneself work.
    assert_eq!(b.allgather(&[4]).unwrap(), vec![vec![4]]);
    b.barrier().unwrap();
    b.send(0, 1, &[9]).unwrap();
    assert_eq!(b.recv(0, 1).unwrap(), [9]);
    assert_eq!(b.query_progress(), vec![PeerProgress::Started(0)]);
}

#[test]
fn recv_timeout_names_peer_tag_and_time() {
    let bs = ranks(2, "0.5");
    let start = Instant::now();
    let e = bs[0].recv(1, 42).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(500));
    assert!(start.elapsed() < Duration::from_secs(3));
    let m = e.to_string();
    assert!(matches!(e, Error::Remote(_)), "{m}");
    assert!(
        m.contains("rank 1") && m.contains("tag 42") && m.contains(" s "),
        "{m}"
    );
}

#[test]
fn strangers_are_refused_and_init_still_succeeds() {
    let c = cfg("10");
    let id = get_unique_id(&c).unwrap();
    let root = id.root_addr().unwrap();
    // A hello with the wrong magic, and bytes that are no frame at all.
    let mut wrong = TcpStream::connect(root).unwrap();
    let f = Frame {
        magic: 1,
        kind: proto::HELLO,
        from: 0,
        tag: 0,
        payload: Hello {
            rank: 0,
            nranks: 2,
            listen: root,
            neighbours: false,
        }
        .encode(),
    };
    wrong.write_all(&f.encode()).unwrap();
    let mut garbage = TcpStream::connect(root).unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    expect_closed(&mut wrong);
    expect_closed(&mut garbage);
    let bs = init_all(id, 2, &c);

    // The same at a rank's service; the ranks still talk.
    let mut wrong = TcpStream::connect(bs[1].listen_addr()).unwrap();
    let f = Frame {
        magic: 1,
        kind: proto::DATA,
        from: 0,
        tag: 5,
        payload: vec![1],
    };
    wrong.write_all(&f.encode()).unwrap();
    expect_closed(&mut wrong);
    // Right magic, but a sender that is no rank.
    let magic = IdContents::decode(&id.0).unwrap().magic;
    let mut liar = TcpStream::connect(bs[1].listen_addr()).unwrap();
    liar.write_all(
        &Frame {
            magic,
            from: 7,
            ..f
        }
        .encode(),
    )
    .unwrap();
    expect_closed(&mut liar);
    bs[0].send(1, 5, &[2]).unwrap();
    assert_eq!(bs[1].recv(0, 5).unwrap(), [2]);
}

#[test]
fn missing_rank_is_named_at_the_timeout() {
    let c = cfg("2");
    let id = get_unique_id(&c).unwrap();
    let start = Instant::now();
    let hs: Vec<_> = [0usize, 2]
        .into_iter()
        .map(|r| {
            let c = c.clone();
            std::thread::spawn(move || Bootstrap::init(&id, r, 3, &c))
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap().err().expect("init must fail");
        let m = e.to_string();
        assert!(matches!(e, Error::Remote(_)), "{m}");
        assert!(m.contains("ranks [1] of 3 never connected"), "{m}");
        assert!(m.contains("within 2 s"), "{m}");
    }
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // The root is gone.
    std::thread::sleep(Duration::from_millis(100));
    assert!(TcpStream::connect(id.root_addr().unwrap()).is_err());
}

#[test]
fn duplicate_rank_is_refused() {
    let c = cfg("10");
    let id = get_unique_id(&c).unwrap();
    // Both rank 0s are in before rank 1 completes the communicator.
    let hs: Vec<_> = [0usize, 0, 1]
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let c = c.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300 * i as u64 / 2));
                Bootstrap::init(&id, r, 2, &c)
            })
        })
        .collect();
    let rs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let errs: Vec<_> = rs.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        matches!(errs[0], Error::InvalidUsage(m) if m.contains("rank 0 joined twice")),
        "{errs:?}"
    );
}

#[test]
fn failure_notice_wakes_a_waiting_peer_and_progress_is_queryable() {
    let bs = ranks(3, "20");
    bs[1].progress().store(4, Ordering::SeqCst);
    bs[2].progress().store(9, Ordering::SeqCst);
    assert_eq!(
        bs[0].query_progress(),
        vec![
            PeerProgress::Started(0),
            PeerProgress::Started(4),
            PeerProgress::Started(9)
        ]
    );
    let start = Instant::now();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| bs[0].recv(1, 99));
        std::thread::sleep(Duration::from_millis(100));
        bs[2].broadcast_failure("disk on fire");
        let e = waiter.join().unwrap().unwrap_err();
        assert!(matches!(e, Error::Remote(_)), "{e}");
        assert_eq!(e.message(), "rank 2 failed: disk on fire");
    });
    assert!(start.elapsed() < Duration::from_secs(3));
    // Delivered asynchronously: wait for it.
    let start = Instant::now();
    while bs[1].remote_failure().is_none() && start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(bs[1].remote_failure(), Some((2, "disk on fire".into())));
    assert_eq!(bs[2].remote_failure(), None);
    bs[1].close();
    let start = Instant::now();
    assert_eq!(
        bs[0].query_progress(),
        vec![
            PeerProgress::Started(0),
            PeerProgress::Unreachable,
            PeerProgress::Started(9)
        ]
    );
    assert!(start.elapsed() < Duration::from_secs(3));
    // Telling a closed rank is quick too.
    let start = Instant::now();
    bs[0].broadcast_failure("again");
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn close_wakes_recv_and_is_idempotent() {
    let bs = ranks(2, "20");
    bs[0].send(1, 1, &[1]).unwrap();
    assert_eq!(bs[1].recv(0, 1).unwrap(), [1]);
    let start = Instant::now();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| bs[1].recv(0, 2));
        std::thread::sleep(Duration::from_millis(100));
        bs[1].close();
        let e = waiter.join().unwrap().unwrap_err();
        assert!(e.message().contains("closed"), "{e}");
    });
    assert!(start.elapsed() < Duration::from_secs(3));
    bs[1].close();
    assert!(bs[1].send(0, 1, &[]).is_err());
    // The peer's service is gone: sends to it fail (at once, or once the
    // cached connection is seen broken), never hang.
    let start = Instant::now();
    let r: Vec<_> = (0..3).map(|_| bs[0].send(1, 3, &[0; 1 << 16])).collect();
    assert!(r.iter().any(Result::is_err), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
    drop(bs);
}

#[test]
fn comm_id_root_hosted_by_rank_0() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = Config::load_with(&[
        ("SOCKET_IFNAME", "lo"),
        ("TIMEOUT", "10"),
        ("COMM_ID", &format!("127.0.0.1:{port}")),
    ])
    .unwrap();
    let ids: Vec<UniqueId> = (0..3).map(|_| get_unique_id(&c).unwrap()).collect();
    assert!(
        ids.iter().all(|i| *i == ids[0]),
        "every rank computes the same id"
    );
    // No root yet: rank 0 starts it.
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    let hs: Vec<_> = (0..3)
        .rev()
        .map(|r| {
            let c = c.clone();
            let id = ids[r];
            // Ranks 1 and 2 start first and retry until rank 0 is up.
            std::thread::spawn(move || {
                if r == 0 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                Bootstrap::init(&id, r, 3, &c).unwrap()
            })
        })
        .collect();
    let mut bs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    bs.sort_by_key(Bootstrap::rank);
    std::thread::scope(|s| {
        for b in &bs {
            s.spawn(move || {
                let all = b.allgather(&[b.rank() as u8]).unwrap();
                assert_eq!(all, vec![vec![0], vec![1], vec![2]]);
            });
        }
    });
    // A fresh root, not at the NCCL_COMM_ID address (as splits need).
    let fresh = start_root(&c).unwrap();
    assert_ne!(fresh.root_addr().unwrap().port(), port);
    assert!(!format!("{fresh:?}").contains("NCCL_COMM_ID"), "{fresh:?}");
    assert_eq!(init_all(fresh, 2, &c).len(), 2);
    for bad in ["nohost", "127.0.0.1:notaport", "no.such.host.invalid:5"] {
        let c = Config::load_with(&[("COMM_ID", bad)]).unwrap();
        let e = get_unique_id(&c).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("NCCL_COMM_ID"), "{e}");
    }
}

#[test]
fn ipv6_loopback() {
    if TcpListener::bind("[::1]:0").is_err() {
        println!("skipped: ::1 is not available here");
        return;
    }
    let c = Config::load_with(&[
        ("SOCKET_IFNAME", "lo"),
        ("SOCKET_FAMILY", "AF_INET6"),
        ("TIMEOUT", "10"),
    ])
    .unwrap();
    let id = get_unique_id(&c).unwrap();
    assert!(id.root_addr().unwrap().is_ipv6(), "{id:?}");
    let bs = init_all(id, 3, &c);
    assert!(bs.iter().all(|b| b.listen_addr().is_ipv6()));
    std::thread::scope(|s| {
        for b in &bs {
            s.spawn(move || {
                assert_eq!(b.allgather(&[b.rank() as u8]).unwrap().len(), 3);
                b.barrier().unwrap();
            });
        }
    });
}

#[test]
fn peers_say_what_they_called_under_a_number() {
    let bs = ranks(3, "20");
    bs[1].progress().store(6, Ordering::SeqCst);
    bs[1].record_call(5, [7; CALL_BYTES]);
    bs[2].progress().store(3, Ordering::SeqCst);
    let got = bs[0].query_call(&[1, 2, 0, 2], 5, Duration::from_secs(2));
    assert_eq!(
        got,
        vec![
            (1, PeerCall::Called([7; CALL_BYTES])),
            (2, PeerCall::Started(3))
        ]
    );
    assert_eq!(bs[1].own_call(5), Some([7; CALL_BYTES]));
    assert_eq!(bs[1].own_call(4), None);
    // A peer that left does not answer, and costs no more than the wait.
    bs[2].close();
    let start = Instant::now();
    let got = bs[0].query_call(&[2], 5, Duration::from_millis(500));
    assert!(got.is_empty(), "{got:?}");
    assert!(start.elapsed() < Duration::from_secs(1));
}

/// NCCL_SET_THREAD_NAME=1: the root thread takes NCCL's name.
#[test]
fn the_root_thread_takes_nccls_name_under_nccl_set_thread_name() {
    let names = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|n| n.trim().to_string())
            .collect()
    };
    let c = Config::load_with(&[
        ("SOCKET_IFNAME", "lo"),
        ("TIMEOUT", "1"),
        ("SET_THREAD_NAME", "1"),
    ])
    .unwrap();
    let _id = start_root(&c).unwrap();
    // The new thread names itself as it starts.
    let start = Instant::now();
    while !names().iter().any(|n| n == "NCCL BootstrapR") {
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", names());
        std::thread::sleep(Duration::from_millis(5));
    }
    let e = Config::load_with(&[("SET_THREAD_NAME", "yes please")]).unwrap_err();
    assert!(e.to_string().contains("NCCL_SET_THREAD_NAME"), "{e}");
}

/// NCCL_SOCKET_RETRY_CNT and _SLEEP_MSEC bound the connect to a root that
/// is not there: 2 retries waiting 30 ms x n give up after 90 ms, long
/// before the deadline; unset, oxccl retries until the deadline.
#[test]
fn nccls_retries_bound_the_connect_to_the_root() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let c =
        Config::load_with(&[("SOCKET_RETRY_CNT", "2"), ("SOCKET_RETRY_SLEEP_MSEC", "30")]).unwrap();
    let retry = c.socket_retry();
    assert_eq!(
        retry,
        Some(oxccl_netif::Retry {
            count: 2,
            sleep: Duration::from_millis(30)
        })
    );
    let start = Instant::now();
    let e = super::tcp::connect_retry(addr, start + Duration::from_secs(30), retry).unwrap_err();
    let took = start.elapsed();
    assert!(
        e.to_string()
            .contains("gave up after 2 retries (NCCL_SOCKET_RETRY_CNT)"),
        "{e}"
    );
    assert!(
        took >= Duration::from_millis(90) && took < Duration::from_secs(10),
        "{took:?}"
    );
    let start = Instant::now();
    super::tcp::connect_retry(addr, start + Duration::from_millis(300), None).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(150));
    let only_cnt = Config::load_with(&[("SOCKET_RETRY_CNT", "5")]).unwrap();
    assert_eq!(
        only_cnt.socket_retry().map(|r| r.sleep),
        Some(Duration::from_millis(100))
    );
    for (k, bad) in [
        ("SOCKET_RETRY_CNT", "0"),
        ("SOCKET_RETRY_CNT", "lots"),
        ("SOCKET_RETRY_SLEEP_MSEC", "0"),
        ("SOCKET_RETRY_SLEEP_MSEC", "1s"),
    ] {
        let e = Config::load_with(&[(k, bad)]).unwrap_err().to_string();
        assert!(e.contains(&format!("NCCL_{k}={bad:?}")), "{e}");
    }
}

mod keyed;
mod roots;
mod strangers;
