//! Ranks with a pre-shared key (NCCL_SOCKET_KEY_FILE): encrypted traffic,
//! refused strangers and other keys, bounded key exchanges and messages.

use super::*;

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
