//! The transport over real segments in /dev/shm, both ends in this process.
//! They call the unsafe isend/irecv as the executor does.
#![allow(unsafe_code)]

use super::*;
use rand::{Rng, SeedableRng};

const LIMIT: Duration = Duration::from_secs(10);

/// A connected pair: (sender, receiver, the segment's name).
fn pair(net: &ShmNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>, String) {
    let (mut handle, mut listen) = net.listen(0).unwrap();
    let name = decode(&handle).unwrap();
    assert!(exists(&name), "listen creates {name}");
    assert!(listen.accept().unwrap().is_none(), "no sender yet");
    let send = net
        .connect(0, &mut handle)
        .unwrap()
        .expect("connects at once");
    let recv = listen.accept().unwrap().expect("sender mapped");
    (send, recv, name)
}

fn exists(name: &str) -> bool {
    std::path::Path::new(&format!("/dev/shm{name}")).exists()
}

fn wait(q: &mut dyn Request) -> NetResult<usize> {
    let start = Instant::now();
    loop {
        if let Some(s) = q.test()? {
            return Ok(s[0]);
        }
        assert!(start.elapsed() < LIMIT, "request never completed");
        std::thread::yield_now();
    }
}

#[test]
fn names_are_removed_once_both_ends_hold_the_segment() {
    let net = ShmNet::new(1 << 16);
    let (_s, _r, name) = pair(&net);
    assert!(!exists(&name), "{name} left after connect");

    // A listener whose sender never comes removes its name when dropped.
    let (handle, listen) = net.listen(0).unwrap();
    let name = decode(&handle).unwrap();
    assert!(exists(&name));
    drop(listen);
    assert!(!exists(&name), "{name} left by a dropped listener");
}

/// Messages of sizes around the slot and far past the ring, random bytes,
/// several in flight, sent and received on two threads.
#[test]
fn random_messages_cross_between_threads() {
    let net = ShmNet::new(8 * 1024);
    let slot = net.slot_bytes();
    let (mut send, mut recv, _) = pair(&net);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let sizes = [
        0,
        1,
        8,
        slot - 1,
        slot,
        slot + 1,
        3 * STEPS * slot + 5,
        100_000,
    ];
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .map(|n| (0..*n).map(|_| rng.random()).collect())
        .collect();
    let sender = {
        let msgs = msgs.clone();
        std::thread::spawn(move || {
            let mut reqs: Vec<Box<dyn Request>> = msgs
                .iter()
                .map(|m| {
                    // SAFETY: `msgs` outlives the requests, waited for below.
                    unsafe { send.isend(m.as_ptr(), m.len(), 9, None) }
                        .unwrap()
                        .unwrap()
                })
                .collect();
            for (q, m) in reqs.iter_mut().zip(&msgs) {
                assert_eq!(wait(q.as_mut()).unwrap(), m.len());
            }
        })
    };
    let mut bufs: Vec<Vec<u8>> = msgs.iter().map(|m| vec![0xaa; m.len() + 3]).collect();
    let mut reqs: Vec<Box<dyn Request>> = bufs
        .iter_mut()
        .map(|b| {
            // SAFETY: `bufs` is not touched until every request completes.
            unsafe { recv.irecv(b.as_mut_ptr(), b.len(), 9, None) }
                .unwrap()
                .unwrap()
        })
        .collect();
    // The last first: it moves those before it.
    let sizes: Vec<usize> = reqs
        .iter_mut()
        .rev()
        .map(|q| wait(q.as_mut()).unwrap())
        .collect();
    sender.join().unwrap();
    for (k, m) in msgs.iter().enumerate() {
        assert_eq!(sizes[msgs.len() - 1 - k], m.len());
        assert_eq!(&bufs[k][..m.len()], &m[..], "message {k}");
        assert_eq!(
            &bufs[k][m.len()..],
            &[0xaa; 3],
            "message {k} wrote past its end"
        );
    }
}

#[test]
fn a_dropped_end_is_a_remote_error_for_the_other() {
    let net = ShmNet::new(1 << 16);
    let (send, mut recv, _) = pair(&net);
    let mut b = [0u8; 8];
    // SAFETY: `b` outlives the request.
    let mut q = unsafe { recv.irecv(b.as_mut_ptr(), 8, 0, None) }
        .unwrap()
        .unwrap();
    drop(send);
    let e = wait(q.as_mut()).unwrap_err();
    assert!(matches!(e, NetError::Remote(_)), "{e}");
    assert!(e.to_string().contains("closed by peer"), "{e}");
    drop(q);

    let (mut send, recv, _) = pair(&net);
    drop(recv);
    let m = [1u8; 8];
    // SAFETY: `m` outlives the request.
    let e = match unsafe { send.isend(m.as_ptr(), 8, 0, None) } {
        Err(e) => e,
        Ok(q) => wait(q.unwrap().as_mut()).unwrap_err(),
    };
    assert!(matches!(e, NetError::Remote(_)), "{e}");
}

#[test]
fn truncation_fails_the_receive_and_the_sender() {
    let net = ShmNet::new(1 << 16);
    let (mut send, mut recv, _) = pair(&net);
    let m = [3u8; 100];
    let mut b = vec![0u8; 10];
    // SAFETY: `m` and `b` outlive the requests.
    let mut sq = unsafe { send.isend(m.as_ptr(), m.len(), 0, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let mut rq = unsafe { recv.irecv(b.as_mut_ptr(), b.len(), 0, None) }
        .unwrap()
        .unwrap();
    let e = wait(rq.as_mut()).unwrap_err();
    assert!(matches!(e, NetError::InvalidArgument(_)), "{e}");
    assert!(
        e.to_string()
            .contains("sent 100 bytes, receive posted for 10"),
        "{e}"
    );
    // The message was in the ring already: its send is complete.
    assert_eq!(wait(sq.as_mut()).unwrap(), 100);
    // The next one finds the receiver gone.
    // SAFETY: as above.
    let e = match unsafe { send.isend(m.as_ptr(), m.len(), 0, None) } {
        Err(e) => e,
        Ok(q) => wait(q.unwrap().as_mut()).unwrap_err(),
    };
    assert!(matches!(e, NetError::Remote(_)), "{e}");
}

/// A peer whose process dies never sets the closed flag; its lock goes
/// with it, and the waiting end says so after a short while.
#[test]
fn a_peer_gone_without_closing_is_found_by_its_lock() {
    let name = unique_name();
    let seg = Segment::create(&name, 4096).unwrap();
    let other = Segment::open(&name).unwrap();
    assert!(seg.alive(End::Send) && other.alive(End::Recv));
    let mut conn: RecvConn = Conn::new(seg, End::Recv, RecvFifo::new(Receiver::new(4096)));
    let mut b = [0u8; 8];
    // SAFETY: `b` outlives the FIFO's use of it (failed below, which drops it).
    conn.fifo
        .post(unsafe { RecvBuf::new(b.as_mut_ptr(), 8) }, 0);
    assert_eq!(conn.progress(), Ok(false));
    drop(other); // the process of the sender "dies": the file closes, no flag
    let start = Instant::now();
    let e = loop {
        match conn.progress() {
            Ok(_) => assert!(start.elapsed() < LIMIT, "a dead sender went unnoticed"),
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(e, RingError::Gone(End::Send));
    assert!(net_error(e).to_string().contains("exited or was killed"));
    assert!(!exists(&name));
}

#[test]
fn a_foreign_handle_is_refused() {
    let net = ShmNet::new(1 << 16);
    let mut h = [0u8; NET_HANDLE_MAXSIZE];
    h[..9].copy_from_slice(b"/not-ours");
    assert!(matches!(
        net.connect(0, &mut h),
        Err(NetError::InvalidArgument(_))
    ));
    let mut h = [0u8; NET_HANDLE_MAXSIZE];
    let gone = format!("/{PREFIX}0-0-0");
    h[..gone.len()].copy_from_slice(gone.as_bytes());
    let e = net.connect(0, &mut h).err().expect("no such segment");
    assert!(e.to_string().contains("cannot open"), "{e}");
}
