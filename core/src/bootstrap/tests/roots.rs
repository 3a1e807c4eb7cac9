//! Several roots (NCCL's ncclCommInitRankScalable) and what a join costs
//! each rank as the job grows.

use super::*;

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
