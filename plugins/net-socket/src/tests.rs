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
