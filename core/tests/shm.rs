//! The transport each peer gets, end to end: two ranks of one process (so
//! of one host) talk through shared memory; NCCL_SHM_DISABLE on either rank
//! or different NCCL_HOSTIDs send them through the network. Each case runs
//! all_reduce, all_gather, broadcast and send/recv on random data checked
//! against a reference, and reads the choice both from the communicator and
//! from NCCL's INFO lines. No segment of this process is left in /dev/shm.
//!
//! The tests of this binary run one at a time: they share the log capture
//! and look at this process's files in /dev/shm.

use std::io::Write;
use std::sync::{Mutex, MutexGuard, Once};

use oxccl::{Comm, CommConfig, DataType, RedOp, Transport};
use rand::{Rng, SeedableRng};

static SERIAL: Mutex<()> = Mutex::new(());
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Serializes the tests and starts each with an empty log.
fn setup() -> MutexGuard<'static, ()> {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        tracing_subscriber::fmt()
            .with_env_filter("oxccl::init=info")
            .with_ansi(false)
            .with_writer(|| Capture)
            .init();
    });
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    LOG.lock().unwrap().clear();
    guard
}

fn log() -> String {
    String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned()
}

fn cfg() -> CommConfig {
    CommConfig::default()
        .with("SOCKET_IFNAME", "lo")
        .with("TIMEOUT", "30")
}

/// Two ranks, each with its own settings, made on two threads.
fn pair(extra: [&[(&str, &str)]; 2]) -> Vec<Comm> {
    let id = Comm::unique_id().unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let mut c = cfg();
                for (k, v) in extra[r] {
                    c = c.with(k, v);
                }
                s.spawn(move || Comm::init_rank(2, id, r, &c).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// This process's segments in /dev/shm.
fn segments() -> Vec<String> {
    let mine = format!("oxccl-{}-", std::process::id());
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&mine))
                .collect()
        })
        .unwrap_or_default()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

fn poisoned(n: usize) -> Vec<u8> {
    bytes(&vec![f32::NAN; n])
}

/// Runs `f(rank, comm)` on every rank at once; returns the results by rank.
fn each<T: Send>(comms: &[Comm], f: impl Fn(usize, &Comm) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || f(r, c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The four kinds of operation on random data, at sizes from one slot's
/// fraction to past the ring (4 MiB: NCCL_BUFFSIZE's default).
fn check_operations(comms: &[Comm]) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for count in [2usize, 1001, (1 << 20) + 3] {
        let inputs: Vec<Vec<f32>> = (0..2)
            .map(|_| (0..count).map(|_| rng.random_range(-1.0..1.0)).collect())
            .collect();

        let out = each(comms, |r, c| {
            let mut o = poisoned(count);
            c.all_reduce(
                Some(&bytes(&inputs[r])),
                &mut o,
                DataType::Float32,
                RedOp::Sum,
            )
            .unwrap();
            floats(&o)
        });
        for (r, o) in out.iter().enumerate() {
            for i in 0..count {
                let want = f64::from(inputs[0][i]) + f64::from(inputs[1][i]);
                assert!(
                    (f64::from(o[i]) - want).abs() < 1e-5,
                    "all_reduce of {count}: rank {r}[{i}] = {} want {want}",
                    o[i]
                );
            }
        }

        let out = each(comms, |r, c| {
            let mut o = poisoned(2 * count);
            c.all_gather(Some(&bytes(&inputs[r])), &mut o, DataType::Float32)
                .unwrap();
            o
        });
        let want = bytes(&[inputs[0].clone(), inputs[1].clone()].concat());
        assert!(out.iter().all(|o| *o == want), "all_gather of {count}");

        let out = each(comms, |r, c| {
            let mut o = poisoned(count);
            c.broadcast(Some(&bytes(&inputs[r])), &mut o, DataType::Float32, 1)
                .unwrap();
            o
        });
        assert!(
            out.iter().all(|o| *o == bytes(&inputs[1])),
            "broadcast of {count}"
        );

        // Both directions: rank 0 sends first, rank 1 receives first.
        let out = each(comms, |r, c| {
            let mut o = poisoned(count);
            let peer = 1 - r;
            if r == 0 {
                c.send(&bytes(&inputs[r]), DataType::Float32, peer).unwrap();
                c.recv(&mut o, DataType::Float32, peer).unwrap();
            } else {
                c.recv(&mut o, DataType::Float32, peer).unwrap();
                c.send(&bytes(&inputs[r]), DataType::Float32, peer).unwrap();
            }
            o
        });
        assert_eq!(out[0], bytes(&inputs[1]), "send/recv of {count}");
        assert_eq!(out[1], bytes(&inputs[0]), "send/recv of {count}");
    }
}

fn transports(comms: &[Comm]) -> Vec<Transport> {
    comms
        .iter()
        .enumerate()
        .map(|(r, c)| c.transport(1 - r).unwrap())
        .collect()
}

fn destroy(comms: Vec<Comm>) {
    for c in comms {
        c.destroy().unwrap();
    }
}

#[test]
fn ranks_of_one_host_talk_through_shared_memory() {
    let _g = setup();
    let comms = Comm::init_all(2, &cfg()).unwrap();
    assert_eq!(transports(&comms), [Transport::Shm, Transport::Shm]);
    check_operations(&comms);
    let log = log();
    // NCCL's line, on the sending side of each connection.
    for line in [
        "Channel 00 : 0[-1] -> 1[-1] via SHM/direct/direct",
        "Channel 00 : 1[-1] -> 0[-1] via SHM/direct/direct",
    ] {
        assert!(log.contains(line), "no {line:?} in:\n{log}");
    }
    assert!(!log.contains("via NET"), "{log}");
    destroy(comms);
}

#[test]
fn shm_disable_sends_the_ranks_through_the_network() {
    let _g = setup();
    let comms = Comm::init_all(2, &cfg().with("SHM_DISABLE", "1")).unwrap();
    assert_eq!(transports(&comms), [Transport::Net, Transport::Net]);
    check_operations(&comms);
    let log = log();
    let net = comms[0].net_name().unwrap();
    for line in [
        format!("Channel 00/0 : 0[-1] -> 1[-1] [send] via NET/{net}/0"),
        format!("Channel 00/0 : 0[-1] -> 1[-1] [receive] via NET/{net}/0"),
        format!("Channel 00/1 : 1[-1] -> 0[-1] [send] via NET/{net}/"),
    ] {
        assert!(log.contains(&line), "no {line:?} in:\n{log}");
    }
    assert!(!log.contains("via SHM"), "{log}");
    destroy(comms);
}

/// Both ends must choose alike: one rank's NCCL_SHM_DISABLE is the pair's.
#[test]
fn shm_disable_on_one_rank_holds_for_both() {
    let _g = setup();
    let comms = pair([&[], &[("SHM_DISABLE", "1")]]);
    assert_eq!(transports(&comms), [Transport::Net, Transport::Net]);
    let out = each(&comms, |r, c| {
        let mut o = bytes(&[r as f32 + 1.0; 16]);
        c.all_reduce(None, &mut o, DataType::Float32, RedOp::Sum)
            .unwrap();
        floats(&o)
    });
    assert!(out.iter().all(|o| o.iter().all(|x| *x == 3.0)), "{out:?}");
    destroy(comms);
}

#[test]
fn different_hostids_send_the_ranks_through_the_network() {
    let _g = setup();
    let comms = pair([&[("HOSTID", "node-a")], &[("HOSTID", "node-b")]]);
    assert_eq!(transports(&comms), [Transport::Net, Transport::Net]);
    check_operations(&comms);
    assert!(!log().contains("via SHM"), "{}", log());
    destroy(comms);
}

/// Segments exist only while a connection is being made: none before the
/// first operation (connections are made on first use), none after it
/// (both ends hold the memory, its name is gone), none after destroy.
#[test]
fn no_segment_outlives_connection_setup() {
    let _g = setup();
    assert_eq!(segments(), Vec::<String>::new(), "left by an earlier test");
    let comms = Comm::init_all(2, &cfg()).unwrap();
    assert_eq!(segments(), Vec::<String>::new());
    each(&comms, |_, c| {
        let mut o = bytes(&[1.0; 4096]);
        c.all_reduce(None, &mut o, DataType::Float32, RedOp::Sum)
            .unwrap();
        let mut p = bytes(&[2.0; 10]);
        if c.user_rank() == 0 {
            c.send(&p, DataType::Float32, 1).unwrap();
        } else {
            c.recv(&mut p, DataType::Float32, 0).unwrap();
        }
    });
    assert!(log().contains("via SHM/direct/direct"));
    assert_eq!(segments(), Vec::<String>::new(), "after connection setup");
    destroy(comms);
    assert_eq!(segments(), Vec::<String>::new(), "after destroy");
}
