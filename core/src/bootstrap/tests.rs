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

// ---- With a pre-shared key (NCCL_SOCKET_KEY_FILE) -----------------------

fn key(seed: u8) -> Option<Arc<Key>> {
    let mut b = [0u8; 32];
    rand::rngs::StdRng::seed_from_u64(seed.into()).fill(&mut b[..]);
    Some(Arc::new(Key::from_bytes(b)))
}

/// Ranks of one communicator, each with its own key (or none), the root
/// with `root_key`; each rank's init result.
fn init_keyed(
    c: &Config,
    root_key: Option<Arc<Key>>,
    keys: Vec<Option<Arc<Key>>>,
) -> Vec<Result<Bootstrap>> {
    let id = start_root_keyed(c, root_key).unwrap();
    let n = keys.len();
    let hs: Vec<_> = keys
        .into_iter()
        .enumerate()
        .map(|(r, k)| {
            let c = c.clone();
            std::thread::spawn(move || Bootstrap::init_keyed(&id, r, n, &c, k))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn encrypted_ranks_exchange_data_and_refuse_strangers_in_clear() {
    let c = cfg("10");
    let k = key(1);
    let bs: Vec<Bootstrap> = init_keyed(&c, k.clone(), vec![k.clone(); 3])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    std::thread::scope(|s| {
        for b in &bs {
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(b.rank() as u64);
                let mine: Vec<u8> = (0..1000 + 70_000 * b.rank())
                    .map(|_| rng.random())
                    .collect();
                let all = b.allgather(&mine).unwrap();
                for (r, got) in all.iter().enumerate() {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(r as u64);
                    let want: Vec<u8> = (0..1000 + 70_000 * r).map(|_| rng.random()).collect();
                    assert_eq!(got, &want, "rank {r}'s block");
                }
                b.barrier().unwrap();
            });
        }
    });
    // A frame in clear, with the right magic, is refused before it is read.
    let mut plain = TcpStream::connect(bs[1].listen_addr()).unwrap();
    let f = Frame {
        magic: bs[1].shared.magic,
        kind: proto::DATA,
        from: 0,
        tag: 5,
        payload: vec![9],
    };
    plain.write_all(&f.encode()).unwrap();
    expect_closed(&mut plain);
    bs[0].send(1, 5, &[2]).unwrap();
    assert_eq!(bs[1].recv(0, 5).unwrap(), [2]);
    assert!(bs[1]
        .shared
        .wait(
            0,
            5,
            Duration::from_millis(200),
            Notices::Heed,
            &String::new
        )
        .is_err());
}

#[test]
fn ranks_with_another_key_or_none_are_refused_and_named() {
    let c = cfg("2");
    let k = key(1);
    let rs = init_keyed(&c, k.clone(), vec![k.clone(), k, key(2), None]);
    let msgs: Vec<String> = rs
        .into_iter()
        .map(|r| r.err().expect("init must fail").to_string())
        .collect();
    for m in &msgs[..2] {
        assert!(m.contains("ranks [2, 3] of 4 never connected"), "{m}");
    }
    assert!(
        msgs[2].contains("refused by the root") && msgs[2].contains("another key"),
        "{}",
        msgs[2]
    );
    assert!(
        msgs[3].contains("NCCL_SOCKET_KEY_FILE set there and not here"),
        "{}",
        msgs[3]
    );
    // A keyed rank at a root without a key.
    let rs = init_keyed(&c, None, vec![None, key(1)]);
    let m = rs[1].as_ref().err().expect("init must fail").to_string();
    assert!(
        m.contains("refused by the root") && m.contains("NCCL_SOCKET_KEY_FILE"),
        "{m}"
    );
}

/// Two ranks that do not hold the same key (another key, or none on one
/// side) both fail within seconds, each naming the key, where the rank
/// the root let in used to wait the whole NCCL_TIMEOUT (issue 40, item 8).
#[test]
fn ranks_with_different_keys_both_fail_within_seconds() {
    let c = cfg("60");
    // Rank 0 hosts the root with its key (as with NCCL_COMM_ID).
    for (keys, root_side, other_side) in [
        (
            [key(1), key(2)],
            "the peer holds another key",
            "it holds another key or none",
        ),
        (
            [key(1), None],
            "NCCL_SOCKET_KEY_FILE is not set there",
            "NCCL_SOCKET_KEY_FILE set there and not here",
        ),
        (
            [None, key(2)],
            "NCCL_SOCKET_KEY_FILE is set there and not here",
            "refused by the root",
        ),
    ] {
        let start = Instant::now();
        let rs = init_keyed(&c, keys[0].clone(), keys.to_vec());
        let took = start.elapsed();
        let msgs: Vec<String> = rs
            .into_iter()
            .map(|r| r.err().expect("init must fail").to_string())
            .collect();
        assert!(took < Duration::from_secs(10), "took {took:?}: {msgs:?}");
        assert!(
            msgs[0].contains("ranks [1] of 2 never connected")
                && msgs[0].contains(root_side)
                && msgs[0].contains("NCCL_SOCKET_KEY_FILE must name the same key"),
            "{}",
            msgs[0]
        );
        assert!(msgs[1].contains(other_side), "{}", msgs[1]);
        eprintln!("{took:?}\n  rank 0: {}\n  rank 1: {}", msgs[0], msgs[1]);
    }
}

#[test]
fn a_replayed_message_is_refused_and_a_tampered_one_fails_the_receiver() {
    let c = cfg("10");
    let k = key(3);
    let bs: Vec<Bootstrap> = init_keyed(&c, k.clone(), vec![k.clone(); 2])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let magic = bs[1].shared.magic;
    // Rank 0's messages to rank 1 through a proxy that records them.
    let proxy = oxccl_secure::testing::TamperProxy::start(bs[1].listen_addr(), 40).unwrap();
    let out = Outgoing::new(0, magic, k.clone(), vec![bs[0].listen_addr(), proxy.addr]);
    let t = Duration::from_secs(5);
    out.send(1, 7, b"pay rank 1 once", t).unwrap();
    assert_eq!(bs[1].recv(0, 7).unwrap(), b"pay rank 1 once");
    // The same bytes again, straight to rank 1: refused, nothing delivered.
    let wire = proxy.sent().remove(0);
    let mut replay = TcpStream::connect(bs[1].listen_addr()).unwrap();
    replay.write_all(&wire).unwrap();
    expect_closed(&mut replay);
    let again = bs[1].shared.wait(
        0,
        7,
        Duration::from_millis(300),
        Notices::Heed,
        &String::new,
    );
    assert!(again.is_err(), "a replayed message was delivered");
    // One byte of the next message altered on the way: rank 1 fails with
    // a clear error rather than taking the message.
    proxy.arm();
    out.send(1, 8, &[5u8; 100], t).unwrap();
    let e = bs[1].recv(0, 8).unwrap_err().to_string();
    assert!(
        e.contains("rank 0") && e.contains("failed authentication"),
        "{e}"
    );
    assert!(bs[1].shared.failure().is_some());
}

#[test]
fn a_trickled_key_exchange_ends_at_its_deadline() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    // A stranger that sends a plausible first message one byte every 100 ms
    // (5 s in all): each read returns before the socket's timeout.
    let trickle = std::thread::spawn(move || {
        let mut c = TcpStream::connect(addr).unwrap();
        for i in 0..50u8 {
            if c.write_all(&[if i == 1 { 48 } else { 0 }]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let (s, peer) = l.accept().unwrap();
    let start = Instant::now();
    let e = tcp::Link::open(
        s,
        key(1).as_deref(),
        oxccl_secure::Role::Responder,
        7,
        Duration::from_millis(300),
    )
    .err()
    .expect("a trickled key exchange must not pass");
    let took = start.elapsed();
    assert!(
        e.to_string()
            .contains("did not finish the key exchange within"),
        "{peer}: {e}"
    );
    assert!(took < Duration::from_secs(3), "held for {took:?}");
    trickle.join().unwrap();
}

/// Waits (up to 5 s) until `b` runs `n` reader threads, or fewer
/// (`fewer`) or more (not).
fn readers(b: &Bootstrap, n: usize, fewer: bool) {
    let start = Instant::now();
    while if fewer {
        b.shared.live_readers() > n
    } else {
        b.shared.live_readers() < n
    } {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{} reader threads run, {n} expected",
            b.shared.live_readers()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Connections that say nothing, or stop inside their first frame or
/// handshake, are closed at the deadline (NCCL_TIMEOUT here: 1 s) and their
/// reader threads end; the ranks talk on.
fn silent_connections_are_dropped(bs: &[Bootstrap], half: &[u8]) {
    let (a, b) = (&bs[0], &bs[1]);
    // Rank 0's connection to rank 1 is made and left open first: an idle
    // rank's connection must survive the deadline.
    a.send(1, 1, b"before").unwrap();
    assert_eq!(b.recv(0, 1).unwrap(), b"before");
    readers(b, 1, true);
    let start = Instant::now();
    let mut silent = TcpStream::connect(b.listen_addr()).unwrap();
    let mut stalled = TcpStream::connect(b.listen_addr()).unwrap();
    stalled.write_all(half).unwrap();
    readers(b, 3, false);
    expect_closed(&mut silent);
    expect_closed(&mut stalled);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
    readers(b, 1, true);
    std::thread::sleep(Duration::from_millis(1200));
    a.send(1, 2, b"after").unwrap();
    assert_eq!(b.recv(0, 2).unwrap(), b"after");
    assert_eq!(
        b.shared.live_readers(),
        1,
        "rank 0's connection was dropped"
    );
}

#[test]
fn silent_or_stalled_plain_connections_free_their_threads() {
    let bs = ranks(2, "1");
    // The first 15 bytes of a frame with the right magic.
    let f = Frame {
        magic: bs[1].shared.magic,
        kind: proto::DATA,
        from: 0,
        tag: 5,
        payload: vec![9; 100],
    };
    silent_connections_are_dropped(&bs, &f.encode()[..15]);
}

#[test]
fn silent_or_stalled_key_exchanges_free_their_threads() {
    let c = cfg("1");
    let k = key(4);
    let bs: Vec<Bootstrap> = init_keyed(&c, k.clone(), vec![k.clone(); 2])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // Half of a key-exchange message: its length, then 10 of its 48 bytes.
    let mut half = 48u16.to_be_bytes().to_vec();
    half.extend_from_slice(&[3; 10]);
    silent_connections_are_dropped(&bs, &half);
}

#[test]
fn messages_past_the_limit_are_refused_at_both_ends() {
    let c = cfg("10");
    let k = key(5);
    let bs: Vec<Bootstrap> = init_keyed(&c, k.clone(), vec![k.clone(); 2])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let big = vec![1u8; proto::MAX_MESSAGE + 1];
    let e = bs[0].send(1, 3, &big).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.message().contains("at most 67108864"),
        "{e}"
    );
    // A sender that does not check (another build, a bug): rank 1 drops
    // the connection at the limit and fails the wait with a reason.
    let out = Outgoing::new(
        0,
        bs[1].shared.magic,
        k,
        vec![bs[0].listen_addr(), bs[1].listen_addr()],
    );
    let _ = out.send(1, 3, &big, Duration::from_secs(5));
    let e = bs[1].recv(0, 3).unwrap_err().to_string();
    assert!(
        e.contains("rank 0") && e.contains("at most 67108864"),
        "{e}"
    );
}

// ---- What a stranger without the key may do (issue 40, item 3) ----------

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

/// Several roots (NCCL's ncclCommInitRankScalable): 2 ids for 4 ranks, 3
/// for 5, one root per rank, and one id; every rank ends with the same
/// table, by rank, and the ranks talk as through one root.
#[test]
fn several_roots_make_the_bootstrap_one_root_makes() {
    let c = cfg("20");
    for (n, k) in [(4, 2), (5, 3), (3, 3), (4, 1)] {
        let bs = init_roots(n, k, &c);
        // Through one root, a rank holds its neighbours' addresses and
        // looks the others up.
        let until = Instant::now() + Duration::from_secs(10);
        let tables: Vec<Vec<std::net::SocketAddr>> = bs
            .iter()
            .map(|b| {
                (0..n)
                    .map(|p| b.shared.resolve(p, until).unwrap())
                    .collect()
            })
            .collect();
        for (r, t) in tables.iter().enumerate() {
            assert_eq!(t, &tables[0], "{n} ranks, {k} roots: rank {r}'s table");
            assert_eq!(t[r], bs[r].listen_addr());
        }
        let hs: Vec<_> = bs
            .into_iter()
            .map(|b| {
                std::thread::spawn(move || {
                    let all = b.allgather(&[b.rank() as u8]).unwrap();
                    assert_eq!(
                        all,
                        (0..b.nranks()).map(|x| vec![x as u8]).collect::<Vec<_>>()
                    );
                    b.barrier().unwrap();
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
    }
}

#[test]
fn several_roots_refuse_bad_ids() {
    let c = cfg("5");
    let id = get_unique_id(&c).unwrap();
    let e = Bootstrap::init_scalable(&[], 0, 2, &c).err().unwrap();
    assert!(e.to_string().contains("nId is 0"), "{e}");
    let e = Bootstrap::init_scalable(&[id, id], 0, 2, &c).err().unwrap();
    assert!(e.to_string().contains("are the same"), "{e}");
    let other = get_unique_id(&c).unwrap();
    let e = Bootstrap::init_scalable(&[id, other, id], 0, 2, &c)
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("more unique ids than the 2 ranks"),
        "{e}"
    );
}

/// Every rank sends one message to the rank 3n/4 + 1 on (looking it up
/// where it must) and receives the one meant for it: the messages sent
/// over all ranks since `before`.
fn far_messages(bs: &[Bootstrap], before: &[Traffic]) -> u64 {
    let n = bs.len();
    let far = |me: usize| (me + 3 * n / 4 + 1) % n;
    std::thread::scope(|s| {
        for b in bs {
            s.spawn(move || {
                let me = b.rank();
                b.send(far(me), 5, &[me as u8]).unwrap();
                let from = (0..n).find(|&p| far(p) == me).unwrap();
                assert_eq!(b.recv(from, 5).unwrap(), vec![from as u8]);
            });
        }
    });
    bs.iter()
        .zip(before)
        .map(|(b, t0)| b.traffic().sent - t0.sent)
        .sum()
}

/// What each rank sends and receives at init, in one allgather after, and
/// to reach a rank it does not know, for several counts: at init one
/// message each way (the hello, the root's answer of at most
/// `2 ceil(log2 n)` addresses), `ceil(log2 n)` each way per allgather, and
/// at most `ceil(log2 n)` lookups to learn an address.
#[test]
fn messages_and_bytes_per_rank_at_init_grow_with_log_n() {
    let c = cfg("30");
    let entry = (4 + proto::ADDR_BYTES) as u64;
    for n in [2usize, 5, 16, 64] {
        let log = proto::bruck_steps(n) as u64;
        assert_eq!(log, (n as f64).log2().ceil() as u64);
        let bs = init_all(get_unique_id(&c).unwrap(), n, &c);
        let at_init: Vec<Traffic> = bs.iter().map(Bootstrap::traffic).collect();
        for (r, t) in at_init.iter().enumerate() {
            assert_eq!((t.sent, t.received), (1, 1), "rank {r} of {n}: {t:?}");
            assert_eq!(t.sent_bytes, 4 + proto::ADDR_BYTES as u64 + 1);
            assert!(
                t.received_bytes <= 2 * log * entry,
                "rank {r} of {n}: {t:?}"
            );
        }
        // One allgather of 64 bytes: ceil(log2 n) messages each way, to
        // and from neighbours (no lookup).
        std::thread::scope(|s| {
            for b in &bs {
                s.spawn(move || b.allgather(&[b.rank() as u8; 64]).unwrap());
            }
        });
        let after: Vec<Traffic> = bs.iter().map(Bootstrap::traffic).collect();
        for (t, t0) in after.iter().zip(&at_init) {
            assert_eq!((t.sent - t0.sent, t.received - t0.received), (log, log));
            assert_eq!(
                t.received_bytes - t0.received_bytes,
                4 * log + (n as u64 - 1) * 68
            );
        }
        // A message to the rank 3n/4 + 1 on: at most log2 n lookups (a
        // question and an answer each) besides it, over all ranks.
        let sent = far_messages(&bs, &after);
        let n64 = n as u64;
        assert!(
            sent <= n64 * (1 + 2 * log),
            "{n} ranks: {sent} messages sent"
        );
        let mean = |f: fn(&Traffic) -> u64| at_init.iter().map(f).sum::<u64>() as f64 / n as f64;
        eprintln!(
            "n {n:>3}: per rank at init {} msg sent, {} received, {:.0} B sent, {:.0} B received; one far message: {:.1} msgs sent per rank with its lookups",
            at_init[0].sent,
            at_init[0].received,
            mean(|t| t.sent_bytes),
            mean(|t| t.received_bytes),
            sent as f64 / n as f64
        );
    }
}

/// Through several roots, what each rank handles at init grows with the
/// log of its block and with the number of roots, not with the job: the
/// hello and the root's answer (two of each for a block's first rank, which
/// joins the root before too), at most 3 lists of the `k` first ranks
/// received and `2 + ceil(log2(n / k))` sent; then an allgather and a
/// message to a far rank (with its lookups) as through one root.
#[test]
fn several_roots_cost_per_rank_grows_with_the_log_of_the_block() {
    let c = cfg("30");
    let entry = (4 + proto::ADDR_BYTES) as u64;
    for (n, k) in [(64usize, 4usize), (37, 2), (16, 16)] {
        let bs = init_roots(n, k, &c);
        let block = n.div_ceil(k);
        let log = (block as f64).log2().ceil() as u64;
        let at_init: Vec<Traffic> = bs.iter().map(Bootstrap::traffic).collect();
        for (r, t) in at_init.iter().enumerate() {
            assert!(
                t.sent <= 2 + 2 + log && t.received <= 2 + 3,
                "{n} ranks, {k} roots: rank {r}: {t:?}"
            );
            let answers = 2 * 2 * (log + 1) * entry;
            assert!(
                t.received_bytes <= answers + 3 * k as u64 * entry,
                "{n} ranks, {k} roots: rank {r}: {t:?}"
            );
        }
        std::thread::scope(|s| {
            for b in &bs {
                s.spawn(move || {
                    let all = b.allgather(&[b.rank() as u8]).unwrap();
                    assert_eq!(all, (0..n).map(|x| vec![x as u8]).collect::<Vec<_>>());
                });
            }
        });
        let before: Vec<Traffic> = bs.iter().map(Bootstrap::traffic).collect();
        let sent = far_messages(&bs, &before);
        let mean = |f: fn(&Traffic) -> u64| at_init.iter().map(f).sum::<u64>() as f64 / n as f64;
        eprintln!(
            "n {n:>3}, {k:>2} roots: per rank at init {:.1} msgs sent, {:.1} received, {:.0} B sent, {:.0} B received (max {}); one far message: {:.1} msgs sent per rank with its lookups",
            mean(|t| t.sent),
            mean(|t| t.received),
            mean(|t| t.sent_bytes),
            mean(|t| t.received_bytes),
            at_init.iter().map(|t| t.received_bytes).max().unwrap_or(0),
            sent as f64 / n as f64
        );
        assert!(
            sent <= n as u64 * (1 + 2 * (log + 1)),
            "{n} ranks, {k} roots: {sent} messages sent"
        );
    }
}

/// A rank on the way of a lookup that does not answer (stopped, or not a
/// rank at all) costs the first pass's short wait, not the long one: the
/// walk passes it over and reaches the target through another rank.
#[test]
fn a_lookup_passes_a_silent_rank_over_quickly() {
    let n = 16;
    let bs = ranks(n, "30");
    // Rank 0 knows its neighbours 0 +- 2^k; rank 11 it learns through 8
    // (then 10). Rank 8's address here is a listener that never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unknown = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
    let mut t = vec![unknown; n];
    t[0] = bs[0].listen_addr();
    for p in proto::neighbours(0, n) {
        t[p] = bs[p].listen_addr();
    }
    t[8] = silent.local_addr().unwrap();
    bs[0].shared.set_table(&t);
    let start = Instant::now();
    let got = bs[0].shared.resolve(11, start + Duration::from_secs(20));
    let took = start.elapsed();
    assert_eq!(got, Some(bs[11].listen_addr()));
    assert!(took < Duration::from_secs(1), "took {took:?}");
    eprintln!("rank 11 found past a silent rank 8 in {took:?}");
    drop(silent);
}
