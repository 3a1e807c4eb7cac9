use std::io::Write;
use std::time::{Duration, Instant};

use super::*;

fn cfg(timeout: &str) -> Config {
    Config::load_with(&[("SOCKET_IFNAME", "lo"), ("TIMEOUT", timeout)]).unwrap()
}

fn ranks(n: usize, timeout: &str) -> Vec<Bootstrap> {
    let c = cfg(timeout);
    let id = get_unique_id(&c).unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let c = c.clone();
            std::thread::spawn(move || Bootstrap::init(&id, r, n, &c).unwrap())
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn allgather_tagged_messages_and_barrier() {
    let bs = ranks(5, "10");
    std::thread::scope(|s| {
        for b in &bs {
            s.spawn(move || {
                let me = b.rank();
                let all = b.allgather(&[me as u8; 3]).unwrap();
                assert_eq!(all, (0..5).map(|r| vec![r as u8; 3]).collect::<Vec<_>>());
                // Tags sent in one order, received in another.
                let next = (me + 1) % 5;
                for tag in [7u64, 3, 9] {
                    b.send(next, tag, &tag.to_le_bytes()).unwrap();
                }
                let prev = (me + 4) % 5;
                for tag in [9u64, 7, 3] {
                    assert_eq!(b.recv(prev, tag).unwrap(), tag.to_le_bytes());
                }
                b.barrier().unwrap();
            });
        }
    });
}

#[test]
fn wrong_magic_is_refused_and_init_still_succeeds() {
    let c = cfg("10");
    let id = get_unique_id(&c).unwrap();
    let root = IdContents::decode(&id.0).unwrap().root;
    let mut stray = TcpStream::connect(root).unwrap();
    let f = Frame {
        magic: 1,
        kind: proto::HELLO,
        from: 0,
        tag: 0,
        payload: Hello {
            rank: 0,
            nranks: 2,
            listen: root,
        }
        .encode(),
    };
    stray.write_all(&f.encode()).unwrap();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let c = c.clone();
            std::thread::spawn(move || Bootstrap::init(&id, r, 2, &c))
        })
        .collect();
    for h in hs {
        assert!(h.join().unwrap().is_ok());
    }
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
        let e = h.join().unwrap().err().expect("init must fail").to_string();
        assert!(e.contains("[1]") && e.contains("of 3"), "{e}");
    }
    assert!(start.elapsed() < Duration::from_secs(8));
}

#[test]
fn failure_notice_wakes_a_waiting_peer_and_progress_is_queryable() {
    let bs = ranks(3, "20");
    bs[1].progress().store(4, Ordering::SeqCst);
    assert_eq!(
        bs[0].query_progress(),
        vec![
            PeerProgress::Started(0),
            PeerProgress::Started(4),
            PeerProgress::Started(0)
        ]
    );
    let start = Instant::now();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| bs[0].recv(2, 99));
        std::thread::sleep(Duration::from_millis(100));
        bs[2].broadcast_failure("disk on fire");
        let e = waiter.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("rank 2") && e.contains("disk on fire"), "{e}");
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    bs[1].close();
    assert_eq!(bs[0].query_progress()[1], PeerProgress::Unreachable);
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
    let ids: Vec<UniqueId> = (0..2).map(|_| get_unique_id(&c).unwrap()).collect();
    assert_eq!(ids[0], ids[1], "every rank computes the same id");
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let c = c.clone();
            let id = ids[r];
            std::thread::spawn(move || Bootstrap::init(&id, r, 2, &c).unwrap())
        })
        .collect();
    let bs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    std::thread::scope(|s| {
        for b in &bs {
            s.spawn(move || assert_eq!(b.allgather(&[1]).unwrap().len(), 2));
        }
    });
    let bad = Config::load_with(&[("COMM_ID", "nohost")]).unwrap();
    assert!(get_unique_id(&bad)
        .unwrap_err()
        .to_string()
        .contains("NCCL_COMM_ID"));
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
    assert!(IdContents::decode(&id.0).unwrap().root.is_ipv6());
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let c = c.clone();
            std::thread::spawn(move || Bootstrap::init(&id, r, 2, &c).unwrap())
        })
        .collect();
    let bs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    std::thread::scope(|s| {
        for b in &bs {
            s.spawn(move || b.barrier().unwrap());
        }
    });
}
