use std::time::{Duration, Instant};

use oxccl_plugin::{Net, RecvComm, Request, SendComm};

use super::*;

fn pair(net: &SocketNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let (mut h, mut l) = net.listen(0).unwrap();
    let s = net.connect(0, &mut h).unwrap().unwrap();
    let start = Instant::now();
    loop {
        if let Some(r) = l.accept().unwrap() {
            return (s, r);
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "accept never completed"
        );
    }
}

fn wait(r: &mut Box<dyn Request>) -> oxccl_plugin::NetResult<usize> {
    let start = Instant::now();
    loop {
        if let Some(s) = r.test()? {
            return Ok(s[0]);
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "request never completed"
        );
    }
}

fn lo() -> SocketNet {
    SocketNet::new(Some("lo"), Family::V4, 2, 2).unwrap()
}

#[test]
fn messages_of_every_size_arrive_in_order() {
    let net = lo();
    let (mut s, mut r) = pair(&net);
    let sizes = [0usize, 1, 1000, (1 << 20) + 3, 16 << 20, 7];
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| (0..n).map(|i| (i * 31 + k * 7) as u8).collect())
        .collect();
    let mut outs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n + 5]).collect();
    let mut reqs = Vec::new();
    for (m, o) in msgs.iter().zip(outs.iter_mut()) {
        // SAFETY: buffers outlive the requests, which are waited for below.
        let rr = unsafe { r.irecv(o.as_mut_ptr(), o.len(), 3, None) }
            .unwrap()
            .unwrap();
        // SAFETY: as above.
        let sr = unsafe { s.isend(m.as_ptr(), m.len(), 3, None) }
            .unwrap()
            .unwrap();
        reqs.push((sr, rr));
    }
    for ((mut sr, mut rr), (m, o)) in reqs.into_iter().zip(msgs.iter().zip(&outs)) {
        assert_eq!(wait(&mut sr).unwrap(), m.len());
        assert_eq!(wait(&mut rr).unwrap(), m.len());
        assert_eq!(&o[..m.len()], &m[..]);
    }
}

#[test]
fn without_helper_threads_the_caller_moves_large_messages() {
    let net = SocketNet::new(Some("lo"), Family::V4, 0, 1).unwrap();
    let (mut s, mut r) = pair(&net);
    let m: Vec<u8> = (0..(8 << 20) + 1).map(|i| (i % 251) as u8).collect();
    let mut o = vec![0u8; m.len()];
    // SAFETY: buffers outlive the requests.
    let mut rr = unsafe { r.irecv(o.as_mut_ptr(), o.len(), 1, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let mut sr = unsafe { s.isend(m.as_ptr(), m.len(), 1, None) }
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let (mut sd, mut rd) = (None, None);
    while sd.is_none() || rd.is_none() {
        sd = sd.or(sr.test().unwrap());
        rd = rd.or(rr.test().unwrap());
        assert!(start.elapsed() < Duration::from_secs(20));
    }
    assert_eq!(o, m);
}

#[test]
fn truncation_and_peer_loss_are_errors() {
    let net = lo();
    let (mut s, mut r) = pair(&net);
    let big = [1u8; 100];
    let mut small = vec![0u8; 10];
    // SAFETY: buffers outlive the requests.
    let mut sr = unsafe { s.isend(big.as_ptr(), big.len(), 0, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let mut rr = unsafe { r.irecv(small.as_mut_ptr(), small.len(), 0, None) }
        .unwrap()
        .unwrap();
    let _ = wait(&mut sr);
    let e = wait(&mut rr).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");

    let (s, mut r) = pair(&net);
    drop(s);
    let mut buf = vec![0u8; 8];
    // SAFETY: as above.
    let mut rr = unsafe { r.irecv(buf.as_mut_ptr(), 8, 0, None) }
        .unwrap()
        .unwrap();
    let e = wait(&mut rr).unwrap_err();
    assert!(matches!(e, NetError::Remote(_)), "{e}");
}

#[test]
fn unmatched_interface_names_the_setting() {
    let e = SocketNet::new(Some("nosuchif7"), Family::Any, 1, 1)
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("NCCL_SOCKET_IFNAME") && e.to_string().contains("nosuchif7"),
        "{e}"
    );
}

#[test]
fn properties_describe_the_interface() {
    let net = lo();
    assert_eq!(net.devices().unwrap(), 1);
    let p = net.properties(0).unwrap();
    assert_eq!(p.name, "lo");
    assert_eq!(p.ptr_support, oxccl_plugin::PtrType::Host as i32);
    assert!(net.properties(5).is_err());
}
