//! Communicator life cycle and groups: init_all, non-blocking init, split,
//! finalize/destroy/abort, groups across communicators, and sends and
//! receives posted in any order.

use std::time::{Duration, Instant};

use oxccl::{Comm, CommConfig, DataType, Group, InitState, RedOp};
use oxccl_tests::check::{fill, value};
use oxccl_tests::run;
use rand::seq::SliceRandom;
use rand::SeedableRng;

fn cfg() -> CommConfig {
    CommConfig::default()
        .with("SOCKET_IFNAME", "lo")
        .with("TIMEOUT", "20")
}

fn f32s(v: &[u8]) -> Vec<f32> {
    v.chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn init_all_and_one_group_across_communicators() {
    let comms = Comm::init_all(3, &cfg()).unwrap();
    assert_eq!(
        comms.iter().map(|c| c.user_rank()).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let mut bufs: Vec<Vec<u8>> = (0..3)
        .map(|r| {
            (0..10)
                .flat_map(|i| ((r * 10 + i) as f32).to_ne_bytes())
                .collect()
        })
        .collect();
    let mut g = Group::new();
    for (c, b) in comms.iter().zip(bufs.iter_mut()) {
        g.all_reduce(c, None, b, DataType::Float32, RedOp::Sum)
            .unwrap();
    }
    g.run().unwrap();
    for b in &bufs {
        let want: Vec<f32> = (0..10).map(|i| (i * 3 + 30) as f32).collect();
        assert_eq!(f32s(b), want);
    }
    for c in &comms {
        c.destroy().unwrap();
    }
    // Use after destroy is refused, naming the reason, and touches nothing.
    let mut b = vec![7u8; 8];
    let e = comms[0]
        .all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
        .unwrap_err();
    assert!(e.to_string().contains("destroyed"), "{e}");
    assert_eq!(b, vec![7u8; 8]);
}

#[test]
fn thread_group_start_end_nests() {
    let comms = Comm::init_all(2, &cfg()).unwrap();
    let mut bufs: Vec<Vec<u8>> = vec![2f64.to_ne_bytes().to_vec(), 5f64.to_ne_bytes().to_vec()];
    oxccl::group_start();
    oxccl::group_start();
    for (c, b) in comms.iter().zip(bufs.iter_mut()) {
        let op = oxccl::Op {
            kind: oxccl::OpKind::AllReduce,
            input: b.as_ptr(),
            output: b.as_mut_ptr(),
            count: 1,
            dtype: DataType::Float64,
            redop: RedOp::Prod,
            stream: 0,
            user_tag: 0,
            call: Default::default(),
        };
        // SAFETY: the buffers outlive the group, which ends below.
        unsafe { c.enqueue(op) }.unwrap();
    }
    oxccl::group_end().unwrap();
    assert_eq!(
        bufs[0],
        2f64.to_ne_bytes(),
        "nothing runs before the outermost group_end"
    );
    oxccl::group_end().unwrap();
    for b in &bufs {
        assert_eq!(f64::from_ne_bytes(b[..8].try_into().unwrap()), 10.0);
    }
    assert!(
        oxccl::group_end().is_err(),
        "an unmatched group_end is an error"
    );
}

#[test]
fn nonblocking_init_reports_progress_then_ready() {
    let id = Comm::unique_id().unwrap();
    let nb = CommConfig {
        blocking: false,
        ..cfg()
    };
    let comms: Vec<Comm> = (0..2)
        .map(|r| Comm::init_rank(2, id, r, &nb).unwrap())
        .collect();
    let start = Instant::now();
    while comms
        .iter()
        .any(|c| c.async_error().unwrap() == InitState::InProgress)
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "init never completed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut a = 1f32.to_ne_bytes().to_vec();
    let mut b = 2f32.to_ne_bytes().to_vec();
    let mut g = Group::new();
    g.all_reduce(&comms[0], None, &mut a, DataType::Float32, RedOp::Max)
        .unwrap();
    g.all_reduce(&comms[1], None, &mut b, DataType::Float32, RedOp::Max)
        .unwrap();
    g.run().unwrap();
    assert_eq!(f32s(&a), vec![2.0]);
    assert_eq!(f32s(&b), vec![2.0]);
}

#[test]
fn split_by_color_and_key() {
    run("split_by_color_and_key", 5, |r| {
        let comm = r.comm(&[]);
        // Rank 4 stays out; the others split by parity, ordered by descending rank.
        let color = if r.rank == 4 {
            oxccl::SPLIT_NOCOLOR
        } else {
            (r.rank % 2) as i32
        };
        let sub = comm
            .split(color, -(r.rank as i32), &CommConfig::default())
            .unwrap();
        if r.rank == 4 {
            assert!(sub.is_none());
        } else {
            let sub = sub.unwrap();
            assert_eq!(sub.count(), 2);
            let expect_rank = if r.rank >= 2 { 0 } else { 1 };
            assert_eq!(sub.user_rank(), expect_rank, "rank {}", r.rank);
            let mut v = (r.rank as f64).to_ne_bytes().to_vec();
            sub.all_reduce(None, &mut v, DataType::Float64, RedOp::Sum)
                .unwrap();
            let want = if r.rank % 2 == 0 { 2.0 } else { 4.0 };
            assert_eq!(f64::from_ne_bytes(v[..8].try_into().unwrap()), want);
            sub.destroy().unwrap();
        }
        comm.finalize().unwrap();
        comm.destroy().unwrap();
    });
}

#[test]
fn sends_and_receives_in_any_order_complete() {
    run("sends_and_receives_in_any_order_complete", 4, |r| {
        let comm = r.comm(&[("CHUNK_SIZE", "4K")]);
        let n = r.nranks;
        let count = 3001;
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|peer| {
                let mut b = vec![0u8; count * 4];
                fill(
                    &mut b,
                    peer as u64,
                    r.rank,
                    0,
                    DataType::Float32,
                    RedOp::Sum,
                );
                b
            })
            .collect();
        let mut outputs: Vec<Vec<u8>> = (0..n).map(|_| vec![0xffu8; count * 4]).collect();
        // Each rank posts its sends and receives in its own random order.
        let mut order: Vec<(usize, bool)> = (0..n).flat_map(|p| [(p, true), (p, false)]).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(r.rank as u64));
        let mut outs: Vec<Option<&mut Vec<u8>>> = outputs.iter_mut().map(Some).collect();
        let mut g = Group::new();
        for (peer, is_send) in order {
            if is_send {
                g.send(&comm, &inputs[peer], DataType::Float32, peer)
                    .unwrap();
            } else {
                g.recv(&comm, outs[peer].take().unwrap(), DataType::Float32, peer)
                    .unwrap();
            }
        }
        g.run().unwrap();
        for (peer, out) in outputs.iter().enumerate() {
            for i in 0..count {
                let got = f32::from_ne_bytes(out[i * 4..i * 4 + 4].try_into().unwrap()) as f64;
                assert_eq!(
                    got,
                    value(r.rank as u64, peer, i, DataType::Float32, RedOp::Sum),
                    "from {peer} at {i}"
                );
            }
        }
    });
}

#[test]
fn gather_scatter_all_to_all() {
    run("gather_scatter_all_to_all", 3, |r| {
        let comm = r.comm(&[]);
        let n = r.nranks;
        let mine: Vec<u8> = (0..4)
            .flat_map(|i| ((r.rank * 4 + i) as i32).to_ne_bytes())
            .collect();
        let mut all = vec![0u8; 16 * n];
        oxccl::gather(
            &comm,
            &mine,
            (r.rank == 1).then_some(&mut all[..]),
            DataType::Int32,
            1,
        )
        .unwrap();
        let seq: Vec<u8> = (0..4 * n).flat_map(|i| (i as i32).to_ne_bytes()).collect();
        if r.rank == 1 {
            assert_eq!(all, seq);
        }
        let mut part = vec![0u8; 16];
        oxccl::scatter(
            &comm,
            (r.rank == 2).then_some(&seq[..]),
            &mut part,
            DataType::Int32,
            2,
        )
        .unwrap();
        assert_eq!(part, seq[r.rank * 16..(r.rank + 1) * 16]);
        let a2a_in: Vec<u8> = (0..n)
            .flat_map(|p| ((r.rank * 10 + p) as i32).to_ne_bytes())
            .collect();
        let mut a2a_out = vec![0u8; 4 * n];
        oxccl::all_to_all(&comm, &a2a_in, &mut a2a_out, DataType::Int32).unwrap();
        let want: Vec<u8> = (0..n)
            .flat_map(|p| ((p * 10 + r.rank) as i32).to_ne_bytes())
            .collect();
        assert_eq!(a2a_out, want);
    });
}

#[test]
fn abort_returns_and_fails_a_blocked_operation() {
    let comms = Comm::init_all(2, &cfg().with("TIMEOUT", "60")).unwrap();
    let c0 = comms[0].clone();
    let t = std::thread::spawn(move || {
        let mut b = vec![0u8; 4];
        // Rank 1 never joins: this waits until the abort.
        c0.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
    });
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    comms[0].abort();
    let r = t.join().unwrap();
    assert!(r.is_err(), "the blocked operation must fail");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "abort took {:?}",
        start.elapsed()
    );
    comms[1].abort();
}

#[test]
fn concurrent_splits_under_comm_id_get_roots_of_their_own() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let comms = Comm::init_all(4, &cfg().with("COMM_ID", &format!("127.0.0.1:{port}"))).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let sub = c
                    .split((c.user_rank() % 2) as i32, 0, &CommConfig::default())
                    .unwrap()
                    .unwrap();
                let mut v = (c.user_rank() as f64).to_ne_bytes().to_vec();
                sub.all_reduce(None, &mut v, DataType::Float64, RedOp::Sum)
                    .unwrap();
                let want = if c.user_rank() % 2 == 0 { 2.0 } else { 4.0 };
                assert_eq!(f64::from_ne_bytes(v[..8].try_into().unwrap()), want);
            });
        }
    });
}
