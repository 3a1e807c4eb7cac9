//! Loopback tests. Every wait is bounded: a hang fails the test instead of
//! stalling the suite.

use std::time::{Duration, Instant};

use oxccl_plugin::{ListenComm, Net, NetHandle, NetResult, RecvComm, Request, SendComm};
use oxccl_secure::session::{DIRECT_FROM, MAX_PLAIN};

use super::*;
use crate::testing::{connect_accept, pair};

const LIMIT: Duration = Duration::from_secs(30);

fn lo(nthreads: usize, socks_per_thread: usize) -> SocketNet {
    SocketNet::new(Some("lo"), Family::V4, nthreads, socks_per_thread).unwrap()
}

/// [`pair`] through a listener and handle given (another network's, or one
/// pointing elsewhere).
fn pair_via(
    net: &SocketNet,
    h: NetHandle,
    mut l: Box<dyn ListenComm>,
) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    connect_accept(net, h, l.as_mut())
}

fn wait(r: &mut Box<dyn Request>) -> NetResult<usize> {
    let start = Instant::now();
    loop {
        if let Some(s) = r.test()? {
            return Ok(s[0]);
        }
        assert!(start.elapsed() < LIMIT, "request never completed");
        std::thread::yield_now();
    }
}

/// Deterministic pseudo-random bytes (xorshift), different per seed.
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn isend(s: &mut Box<dyn SendComm>, m: &[u8], tag: i32) -> Box<dyn Request> {
    // SAFETY: every caller keeps `m` alive and unchanged until the request
    // completes (or the test fails).
    unsafe { s.isend(m.as_ptr(), m.len(), tag, None) }
        .unwrap()
        .unwrap()
}

fn irecv(r: &mut Box<dyn RecvComm>, o: &mut [u8], tag: i32) -> Box<dyn Request> {
    // SAFETY: every caller keeps `o` alive and untouched until the request
    // completes (or the test fails).
    unsafe { r.irecv(o.as_mut_ptr(), o.len(), tag, None) }
        .unwrap()
        .unwrap()
}

/// Posts every message before testing any, then checks sizes and bytes:
/// several in flight at once, matched in posting order.
fn exchange(net: &SocketNet, sizes: &[usize]) {
    let (mut s, mut r) = pair(net);
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| random_bytes(n, k as u64 + 1))
        .collect();
    // Room beyond each message: a smaller message completes with its size.
    let mut outs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n + 5]).collect();
    let mut reqs = Vec::new();
    for (m, o) in msgs.iter().zip(outs.iter_mut()) {
        let rr = irecv(&mut r, o, 3);
        let sr = isend(&mut s, m, 3);
        reqs.push((sr, rr));
    }
    for ((mut sr, mut rr), (m, o)) in reqs.into_iter().zip(msgs.iter().zip(&outs)) {
        assert_eq!(wait(&mut sr).unwrap(), m.len());
        assert_eq!(wait(&mut rr).unwrap(), m.len());
        assert!(
            o[..m.len()] == m[..],
            "bytes differ in a {}-byte message",
            m.len()
        );
        assert!(
            o[m.len()..].iter().all(|&b| b == 0),
            "wrote past the message"
        );
    }
}

#[test]
fn messages_of_every_size_arrive_in_order() {
    exchange(
        &lo(2, 2),
        &[
            0,
            1,
            1000,
            (1 << 20) + 3,
            16 << 20,
            7,
            64 << 10,
            (64 << 10) - 1,
        ],
    );
}

#[test]
fn many_medium_messages_rotate_over_the_sockets() {
    let sizes: Vec<usize> = (0..40).map(|k| (64 << 10) + k * 4099).collect();
    exchange(&lo(3, 2), &sizes);
}

#[test]
fn without_helper_threads_the_caller_moves_large_messages() {
    exchange(&lo(0, 1), &[5, (8 << 20) + 1, 0]);
}

#[test]
fn sender_and_receiver_on_their_own_threads() {
    let net = lo(2, 2);
    let (mut s, mut r) = pair(&net);
    let sizes = [8usize, 32 << 20, 100_000, 3];
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| random_bytes(n, 100 + k as u64))
        .collect();
    let expect = msgs.clone();
    let sender = std::thread::spawn(move || {
        for m in &msgs {
            let mut q = isend(&mut s, m, 9);
            assert_eq!(wait(&mut q).unwrap(), m.len());
        }
    });
    for m in &expect {
        let mut o = vec![0u8; m.len()];
        let mut q = irecv(&mut r, &mut o, 9);
        assert_eq!(wait(&mut q).unwrap(), m.len());
        assert!(o == *m);
    }
    sender.join().unwrap();
}

#[test]
fn truncation_is_an_error_naming_both_sizes() {
    for size in [100usize, 1 << 20] {
        let net = lo(2, 2);
        let (mut s, mut r) = pair(&net);
        let big = vec![1u8; size];
        let mut small = vec![0u8; 10];
        let mut sr = isend(&mut s, &big, 0);
        let mut rr = irecv(&mut r, &mut small, 0);
        let e = wait(&mut rr).unwrap_err();
        assert!(matches!(e, NetError::InvalidArgument(_)), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("message truncated")
                && text.contains(&format!("sent {size} bytes"))
                && text.contains("posted for 10"),
            "{text}"
        );
        // The sender of the truncated message is not left hanging: it
        // completes (inline) or learns the connection is gone.
        let _ = wait(&mut sr);
    }
}

#[test]
fn tag_mismatch_is_an_error_naming_both_tags() {
    let net = lo(1, 1);
    let (mut s, mut r) = pair(&net);
    let m = [7u8; 4];
    let mut o = [0u8; 4];
    let _sr = isend(&mut s, &m, 11);
    let mut rr = irecv(&mut r, &mut o, 12);
    let e = wait(&mut rr).unwrap_err();
    assert!(matches!(e, NetError::Internal(_)), "{e}");
    assert!(
        e.to_string().contains("11") && e.to_string().contains("12"),
        "{e}"
    );
}

/// Sends 4 MiB messages until one fails (bounded by LIMIT): the error.
fn send_until_error(s: &mut Box<dyn SendComm>) -> NetError {
    let m = vec![1u8; 4 << 20];
    let start = Instant::now();
    loop {
        // SAFETY: `m` outlives the requests, which are waited for at once.
        match unsafe { s.isend(m.as_ptr(), m.len(), 0, None) } {
            Err(e) => return e,
            Ok(Some(mut q)) => {
                if let Err(e) = wait(&mut q) {
                    return e;
                }
            }
            Ok(None) => {}
        }
        assert!(
            start.elapsed() < LIMIT,
            "sends to a gone peer kept succeeding"
        );
    }
}

#[test]
fn peer_loss_is_a_remote_error() {
    let net = lo(2, 2);
    // The sender goes away: a posted receive fails, small or large.
    for size in [8usize, 4 << 20] {
        let (s, mut r) = pair(&net);
        let mut buf = vec![0u8; size];
        let mut rr = irecv(&mut r, &mut buf, 0);
        drop(s);
        let e = wait(&mut rr).unwrap_err();
        assert!(matches!(e, NetError::Remote(_)), "{e}");
        assert!(e.to_string().contains("closed by peer"), "{e}");
    }
    // The receiver goes away: the next send fails.
    let (mut s, r) = pair(&net);
    drop(r);
    let e = send_until_error(&mut s);
    assert!(matches!(e, NetError::Remote(_)), "{e}");
}

#[test]
fn dropping_an_end_with_requests_in_flight_returns_and_fails_them() {
    let net = lo(2, 2);
    let (mut s, r) = pair(&net);
    // Far more than socket buffers hold, so helper threads are blocked when
    // the comm is dropped.
    let m = vec![3u8; 64 << 20];
    let mut sr = isend(&mut s, &m, 0);
    let start = Instant::now();
    drop(s);
    assert!(start.elapsed() < LIMIT);
    assert!(wait(&mut sr).is_err());
    drop(r);
}

#[test]
fn unmatched_interface_names_the_setting() {
    let e = SocketNet::new(Some("nosuchif7"), Family::Any, 1, 1)
        .err()
        .unwrap();
    assert!(matches!(e, NetError::InvalidArgument(_)), "{e}");
    assert!(
        e.to_string().contains("NCCL_SOCKET_IFNAME") && e.to_string().contains("nosuchif7"),
        "{e}"
    );
}

#[test]
fn a_handle_to_nowhere_fails_in_bounded_time() {
    let mut net = lo(1, 1);
    net.connect_retry = Duration::from_millis(200);
    let (mut h, l) = net.listen(0).unwrap();
    drop(l);
    let start = Instant::now();
    let e = loop {
        match net.connect(0, &mut h) {
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Ok(Some(_)) => panic!("connected to a closed listener"),
            Err(e) => break e,
        }
        assert!(start.elapsed() < LIMIT);
    };
    assert!(e.to_string().contains("connect to 127.0.0.1:"), "{e}");
    let mut junk = [0u8; 128];
    assert!(net.connect(0, &mut junk).is_err());
}

/// NCCL_SOCKET_RETRY_CNT and _SLEEP_MSEC replace oxccl's own retries (10
/// s, every 10 ms): 3 retries of 40 ms x n give up after 240 ms.
#[test]
fn nccls_retries_bound_a_refused_connect() {
    let mut net = lo(1, 1);
    net.retry = Some(oxccl_netif::Retry {
        count: 3,
        sleep: Duration::from_millis(40),
    });
    let (mut h, l) = net.listen(0).unwrap();
    drop(l);
    let start = Instant::now();
    let e = loop {
        match net.connect(0, &mut h) {
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Ok(Some(_)) => panic!("connected to a closed listener"),
            Err(e) => break e,
        }
        assert!(start.elapsed() < LIMIT);
    };
    let took = start.elapsed();
    assert!(
        e.to_string()
            .contains("after 3 retries: NCCL_SOCKET_RETRY_CNT"),
        "{e}"
    );
    assert!(
        took >= Duration::from_millis(240) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[test]
fn properties_describe_the_interface() {
    let net = lo(2, 2);
    assert_eq!(net.devices().unwrap(), 1);
    let p = net.properties(0).unwrap();
    assert_eq!(p.name, "lo");
    assert_eq!(p.ptr_support, oxccl_plugin::PtrType::Host as i32);
    assert_eq!((p.max_comms, p.max_recvs), (65536, 1));
    assert!(p.speed_mbps > 0);
    assert!(net.properties(5).is_err());
    assert!(net.listen(5).is_err());
}

#[test]
fn thread_and_socket_counts_follow_nccls_limits() {
    let net = lo(8, 32);
    assert_eq!((net.nthreads, net.socks_per_thread), (8, 8));
    let net = lo(100, 1);
    assert_eq!(net.nthreads, MAX_THREADS);
    let (h, _l) = net.listen(0).unwrap();
    let h = Handle::decode(&h).unwrap();
    assert_eq!((h.nthreads, h.socks_per_thread), (16, 1));
}

/// NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD out of NCCL's limits
/// (NCCL cuts them with a warning) or not numbers are errors naming them.
#[test]
fn thread_and_socket_settings_are_checked() {
    let n = |v: &str, range| super::num_in("NCCL_SOCKET_NTHREADS", Some(v.into()), 2, range);
    assert_eq!(n("", 0..=MAX_THREADS).unwrap(), 2, "blank: the default");
    assert_eq!(n(" 16 ", 0..=MAX_THREADS).unwrap(), 16);
    for bad in ["17", "-1", "two", "1.5"] {
        let e = n(bad, 0..=MAX_THREADS).unwrap_err().to_string();
        assert!(
            e.contains(&format!("NCCL_SOCKET_NTHREADS={bad:?}")) && e.contains("from 0 to 16"),
            "{bad}: {e}"
        );
    }
}

/// The exported C vtable, driven as NCCL drives it.
#[test]
#[allow(unsafe_code)]
fn c_abi_vtable_moves_data() {
    use std::os::raw::{c_int, c_void};
    use std::ptr::null_mut;
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    let v = &super::ncclNetPlugin_v8.0;
    // SAFETY: each call gets valid pointers, as NCCL passes them.
    unsafe {
        assert_eq!((v.init.unwrap())(None), 0);
        let mut n: c_int = 0;
        assert_eq!((v.devices.unwrap())(&mut n), 0);
        assert_eq!(n, 1);
        let mut props = std::mem::zeroed();
        assert_eq!((v.get_properties.unwrap())(0, &mut props), 0);
        assert_eq!(std::ffi::CStr::from_ptr(props.name).to_str().unwrap(), "lo");
        assert_eq!(
            (v.devices.unwrap())(null_mut()),
            oxccl_plugin::ffi::NCCL_INVALID_ARGUMENT
        );
        let mut handle = [0u8; 128];
        let mut listen: *mut c_void = null_mut();
        assert_eq!(
            (v.listen.unwrap())(0, handle.as_mut_ptr() as *mut c_void, &mut listen),
            0
        );
        let (mut send, mut recv): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let start = Instant::now();
        while send.is_null() || recv.is_null() {
            if send.is_null() {
                assert_eq!(
                    (v.connect.unwrap())(
                        0,
                        handle.as_mut_ptr() as *mut c_void,
                        &mut send,
                        null_mut()
                    ),
                    0
                );
            }
            if recv.is_null() {
                assert_eq!((v.accept.unwrap())(listen, &mut recv, null_mut()), 0);
            }
            assert!(start.elapsed() < Duration::from_secs(10));
        }
        let msg: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        let mut out = vec![0u8; msg.len()];
        let (mut sr, mut rr): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let mut data = out.as_mut_ptr() as *mut c_void;
        let mut size = out.len() as c_int;
        let mut tag: c_int = 5;
        assert_eq!(
            (v.irecv.unwrap())(recv, 1, &mut data, &mut size, &mut tag, null_mut(), &mut rr),
            0
        );
        assert_eq!(
            (v.isend.unwrap())(
                send,
                msg.as_ptr() as *mut c_void,
                msg.len() as c_int,
                5,
                null_mut(),
                &mut sr
            ),
            0
        );
        assert!(!sr.is_null() && !rr.is_null());
        let (mut sd, mut rd, mut got) = (0, 0, 0);
        while sd == 0 || rd == 0 {
            if sd == 0 {
                assert_eq!((v.test.unwrap())(sr, &mut sd, null_mut()), 0);
            }
            if rd == 0 {
                assert_eq!((v.test.unwrap())(rr, &mut rd, &mut got), 0);
            }
            assert!(start.elapsed() < Duration::from_secs(10));
        }
        assert_eq!(got as usize, msg.len());
        assert_eq!(out, msg);
        for c in [send, recv, listen] {
            assert_eq!((v.close_send.unwrap())(c), 0);
        }
    }
}

// ---- With a key (NCCL_SOCKET_KEY_FILE) ------------------------------------

fn keyed(nthreads: usize, socks_per_thread: usize, seed: u8) -> SocketNet {
    let mut k = random_bytes(32, seed.into());
    k[0] ^= 1;
    let key = Key::from_bytes(k.try_into().unwrap());
    lo(nthreads, socks_per_thread).with_key(Some(Arc::new(key)))
}

#[test]
fn encrypted_messages_of_every_size_arrive_in_order() {
    let sizes = [
        0,
        1,
        1000,
        (1 << 20) + 3,
        16 << 20,
        7,
        64 << 10,
        // Around the size from which records open in the receive buffer,
        // and one record, one byte less and one more.
        DIRECT_FROM - 17,
        DIRECT_FROM - 16,
        DIRECT_FROM,
        MAX_PLAIN - 1,
        MAX_PLAIN,
        MAX_PLAIN + 1,
        3 * MAX_PLAIN + 5,
    ];
    // The defaults: from 8 cores with a key, and below 8 cores.
    exchange(&keyed(4, 2, 1), &sizes);
    exchange(&keyed(2, 2, 1), &sizes);
    exchange(&keyed(0, 1, 1), &sizes);
}

/// Polls connect and accept for `secs`: the connect's outcome (if it
/// ended) and whether anything was accepted.
fn try_pair(
    listener: &SocketNet,
    connector: &SocketNet,
    secs: f64,
) -> (Option<NetResult<Box<dyn SendComm>>>, bool) {
    let (mut h, mut l) = listener.listen(0).unwrap();
    let start = Instant::now();
    let mut sent = None;
    while start.elapsed().as_secs_f64() < secs {
        if sent.is_none() {
            match connector.connect(0, &mut h) {
                Ok(None) => {}
                Ok(Some(s)) => sent = Some(Ok(s)),
                Err(e) => sent = Some(Err(e)),
            }
        }
        if l.accept().unwrap().is_some() {
            return (sent, true);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (sent, false)
}

#[test]
fn connections_without_the_key_or_with_another_are_refused() {
    for (listener, connector) in [(keyed(2, 2, 1), keyed(2, 2, 2)), (lo(2, 2), keyed(2, 2, 1))] {
        let (sent, accepted) = try_pair(&listener, &connector, 3.0);
        assert!(!accepted);
        let e = sent.expect("the connect ended").err().expect("refused");
        assert!(matches!(e, NetError::Remote(_)), "{e}");
        assert!(e.to_string().contains("key exchange"), "{e}");
    }
    // A connector in clear believes it is connected; nothing is accepted,
    // and its sends fail once the listener has dropped its sockets.
    let (sent, accepted) = try_pair(&keyed(0, 1, 1), &lo(0, 1), 1.0);
    assert!(!accepted);
    let mut s = sent.expect("a plain connect ends").unwrap();
    let e = send_until_error(&mut s);
    assert!(matches!(e, NetError::Remote(_)), "{e}");
}

#[test]
fn a_tampered_byte_fails_the_receive_and_a_replayed_socket_is_refused() {
    for (threads, socks) in [(0, 1), (2, 2)] {
        let net = keyed(threads, socks, 3);
        let (h, l) = net.listen(0).unwrap();
        let real = Handle::decode(&h).unwrap();
        let proxy = oxccl_secure::testing::TamperProxy::start(real.addr, 1000).unwrap();
        let via = Handle {
            addr: proxy.addr,
            ..real
        };
        let (mut s, mut r) = pair_via(&net, via.encode(), l);
        let a = random_bytes(1 << 20, 5);
        let mut out = vec![0u8; 4 << 20];
        let mut rr = irecv(&mut r, &mut out, 1);
        let mut sr = isend(&mut s, &a, 1);
        assert_eq!(wait(&mut sr).unwrap(), a.len());
        assert_eq!(wait(&mut rr).unwrap(), a.len());
        assert!(out[..a.len()] == a[..]);
        // One byte of the next message altered on the way.
        proxy.arm();
        let b = random_bytes(4 << 20, 6);
        let mut rr = irecv(&mut r, &mut out, 1);
        let _sr = isend(&mut s, &b, 1);
        let e = wait(&mut rr).expect_err("a tampered message must not arrive");
        assert!(matches!(e, NetError::Remote(_)), "{e}");
        assert!(
            e.to_string().contains("failed authentication"),
            "{threads} threads: {e}"
        );

        // A recorded socket replayed to a listener is refused.
        let (h2, mut l2) = net.listen(0).unwrap();
        let addr = Handle::decode(&h2).unwrap().addr;
        let mut replay = std::net::TcpStream::connect(addr).unwrap();
        // Its start (the handshake, the confirmation, the first records):
        // all of it could outgrow the socket buffers of a connection the
        // listener never reads past the handshake, and block this write.
        let recorded = &proxy.sent()[0];
        replay.set_write_timeout(Some(LIMIT)).unwrap();
        std::io::Write::write_all(&mut replay, &recorded[..recorded.len().min(64 << 10)]).unwrap();
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(500) {
            assert!(
                l2.accept().unwrap().is_none(),
                "a replayed socket was accepted"
            );
        }
        replay.set_read_timeout(Some(LIMIT)).unwrap();
        let mut buf = [0u8; 256];
        let mut got = 0;
        // The listener's answer to the handshake, then the close.
        while let Ok(n @ 1..) = std::io::Read::read(&mut replay, &mut buf) {
            got += n;
        }
        assert!(got <= 64, "{got} bytes came back to a replayed socket");
    }
}

#[test]
fn a_peer_that_stalls_before_its_introduction_is_dropped_and_blocks_no_one() {
    use std::io::{Read, Write};
    for net in [keyed(1, 1, 4), lo(1, 1)] {
        let mut net = net;
        net.handshake_wait = Duration::from_secs(2);
        let (h, mut l) = net.listen(0).unwrap();
        let addr = Handle::decode(&h).unwrap().addr;
        // One stranger says nothing; another sends a byte and stops.
        let mut silent = std::net::TcpStream::connect(addr).unwrap();
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        slow.write_all(&[0]).unwrap();
        let start = Instant::now();
        let (mut s, mut r) = connect_accept(&net, h, l.as_mut());
        // The true peer got through while the strangers were still held.
        let open = |t: &mut std::net::TcpStream| {
            t.set_nonblocking(true).unwrap();
            matches!(t.read(&mut [0u8; 64]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        };
        assert!(open(&mut silent) && open(&mut slow));
        let a = random_bytes(100_000, 8);
        let mut out = vec![0u8; a.len()];
        let mut rr = irecv(&mut r, &mut out, 2);
        let mut sr = isend(&mut s, &a, 2);
        assert_eq!(wait(&mut sr).unwrap(), a.len());
        assert_eq!(wait(&mut rr).unwrap(), a.len());
        assert!(out == a);
        // Then the listener drops them, as its accept is polled.
        while open(&mut silent) || open(&mut slow) {
            assert!(l.accept().unwrap().is_none());
            assert!(start.elapsed() < LIMIT, "a stalled peer was kept");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(start.elapsed() >= net.handshake_wait);
    }
}

#[test]
fn a_listener_that_never_answers_the_key_exchange_fails_the_connect() {
    // A socket the kernel accepts (backlog) but nobody reads.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut net = keyed(0, 1, 4);
    net.handshake_wait = Duration::from_millis(300);
    let mut h = Handle {
        addr: mute.local_addr().unwrap(),
        nthreads: 0,
        socks_per_thread: 1,
        conn_id: 7,
    }
    .encode();
    let start = Instant::now();
    let e = loop {
        match net.connect(0, &mut h) {
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Ok(Some(_)) => panic!("connected without a key exchange"),
            Err(e) => break e,
        }
        assert!(start.elapsed() < LIMIT, "the connect never ended");
    };
    assert!(matches!(e, NetError::Remote(_)), "{e}");
    assert!(
        e.to_string().contains("did not answer the key exchange"),
        "{e}"
    );
}

#[test]
fn a_key_doubles_the_default_helper_threads_from_8_cores() {
    assert_eq!(crate::default_threads(2, false), (0, 1));
    assert_eq!(crate::default_threads(2, true), (0, 1));
    assert_eq!(crate::default_threads(16, false), (2, 2));
    assert_eq!(crate::default_threads(16, true), (4, 2));
}

/// The bounded stand-in of the `socket_framing` fuzz target: true streams,
/// garbled ones and garbage, on a receiving connection's control socket,
/// read as a plain reader reads them, never a receive told of more than it
/// posted, never a hang.
#[test]
fn the_control_stream_framing_holds_against_garbled_streams() {
    use crate::testing::{digest_control_stream, frame_messages};
    let payloads: Vec<Vec<u8>> = (0..4)
        .map(|i| random_bytes(i * 700 + 3, i as u64))
        .collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    let stream = frame_messages(&refs);
    let rooms = [4096, 4096, 4096, 4096];
    let d = digest_control_stream(&stream, &rooms);
    assert_eq!(d.messages, payloads);
    assert_eq!(d.failed, None);
    // Too little room, another tag, a bad check word, a cut stream.
    assert!(digest_control_stream(&stream, &[2]).failed.is_some());
    let mut other_tag = stream.clone();
    other_tag[8] = 1;
    assert!(digest_control_stream(&other_tag, &rooms).failed.is_some());
    let d = digest_control_stream(&stream[..stream.len() - 1], &rooms);
    assert_eq!(d.messages.len(), 3);
    assert!(d.failed.unwrap().contains("closed by peer"));
    // Every byte altered in turn, and garbage.
    for i in (0..stream.len()).step_by(97) {
        let mut s = stream.clone();
        s[i] ^= 0x5a;
        digest_control_stream(&s, &rooms);
    }
    for seed in 0..20 {
        let g = random_bytes(seed as usize * 13, seed + 100);
        digest_control_stream(&g, &[0, 64, 1 << 16]);
    }
}
