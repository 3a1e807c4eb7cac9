//! The whole network (discovery, listen/connect/accept, registration,
//! isend/irecv/test over several QPs) against a fake `libibverbs.so.1`
//! (`fake_verbs.c`): built here with `cc` against the system's rdma-core
//! `verbs.h` and found by the plugin's own `dlopen` through
//! LD_LIBRARY_PATH, in a child process. It moves data inside the process,
//! and refuses what hardware refuses (wrong QP attribute masks or states,
//! keys that do not cover a buffer, a message larger than its receive). It
//! proves the plugin's logic and its C layouts; it is no substitute for a
//! NIC. Skipped, saying so, where `cc` or `infiniband/verbs.h` is missing.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use oxccl_net_ib::{Config, IbNet};
use oxccl_plugin::{DmaBuf, MrHandle, Net, NetError, PtrType, RecvComm, Request, SendComm};

const CHILD: &str = "OXCCL_FAKE_VERBS_CHILD";

/// One directory per test: tests run in parallel and each removes its own.
/// `defines` are `-D` flags selecting a variant of the fake.
fn build_fake(name: &str, defines: &[&str]) -> Result<PathBuf, String> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_verbs.c");
    let dir =
        std::env::temp_dir().join(format!("oxccl-fake-ibverbs-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let out = Command::new("cc")
        .args(defines.iter().map(|d| format!("-D{d}")))
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join("libibverbs.so.1"))
        .arg(&src)
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc failed (is libibverbs-dev installed?): {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(dir)
}

/// Runs test `name` again as a child with the fake library and `env`.
fn run_child(name: &str, env: &[(&str, &str)]) -> Option<(String, String)> {
    run_child_with(name, env, &[])
}

/// As `run_child`, with a variant of the fake built with `defines`.
fn run_child_with(name: &str, env: &[(&str, &str)], defines: &[&str]) -> Option<(String, String)> {
    let dir = match build_fake(name, defines) {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: cannot build the fake libibverbs: {e}");
            return None;
        }
    };
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture"])
        .env(CHILD, name)
        .env("LD_LIBRARY_PATH", &dir)
        .env("NCCL_SOCKET_IFNAME", "lo")
        // The checks read the plugin's INFO lines (devices found), which
        // without a logger it prints only where NCCL_DEBUG asks.
        .env("NCCL_DEBUG", "INFO");
    for k in [
        "NCCL_IB_HCA",
        "NCCL_IB_DISABLE",
        "NCCL_IB_QPS_PER_CONNECTION",
        "NCCL_GDR_FLUSH_DISABLE",
        "OXCCL_IB_CONNECT_TIMEOUT",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "child {name} failed:\n{so}\n{se}");
    Some((so, se))
}

fn is_child(name: &str) -> bool {
    std::env::var(CHILD).ok().as_deref() == Some(name)
}

fn wait(r: &mut Box<dyn Request>) -> Result<usize, String> {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        match r.test() {
            Ok(Some(sizes)) => return Ok(sizes[0]),
            Ok(None) => std::thread::sleep(Duration::from_micros(50)),
            Err(e) => return Err(e.to_string()),
        }
    }
    panic!("request did not complete in 10 s");
}

fn connect_pair(net: &IbNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let (mut h, mut l) = net.listen(0).unwrap();
    let (mut s, mut r) = (None, None);
    let until = Instant::now() + Duration::from_secs(10);
    while (s.is_none() || r.is_none()) && Instant::now() < until {
        if s.is_none() {
            s = net.connect(0, &mut h).unwrap();
        }
        if r.is_none() {
            r = l.accept().unwrap();
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    (s.expect("connected"), r.expect("accepted"))
}

fn data_path() {
    let net = IbNet::from_env().unwrap();
    // FAKE_IBV_PORTS ports of one HCA: merged into one device unless
    // NCCL_IB_MERGE_NICS=0.
    let ports: i32 = std::env::var("FAKE_IBV_PORTS").map_or(1, |v| v.parse().unwrap());
    let merged = std::env::var("NCCL_IB_MERGE_NICS").as_deref() != Ok("0");
    let (ndev, per_dev) = if merged {
        (1, ports)
    } else {
        (ports as usize, 1)
    };
    assert_eq!(net.devices().unwrap(), ndev);
    let p = net.properties(0).unwrap();
    assert_eq!(p.name, "fake0");
    assert_eq!(p.speed_mbps, 100_000 * per_dev, "4x EDR per port");
    assert_eq!(p.ptr_support & PtrType::Host as i32, PtrType::Host as i32);
    let (mut s, mut r) = connect_pair(&net);

    let sizes = [0usize, 1, 7, 4096, 65_537, (1 << 20) + 3, 12, 3];
    let src: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, n)| (0..*n).map(|j| (j * 31 + i * 7) as u8).collect())
        .collect();
    let mut dst: Vec<Vec<u8>> = sizes.iter().map(|n| vec![0u8; n + 64]).collect();
    // One registration for all sources of a size class would be the core's
    // way; per buffer exercises the cache's many entries.
    let smr: Vec<_> = src
        .iter()
        .map(|b| {
            s.reg_mr(b.as_ptr() as *mut u8, b.len(), PtrType::Host)
                .unwrap()
        })
        .collect();
    let rmr: Vec<_> = dst
        .iter_mut()
        .map(|b| r.reg_mr(b.as_mut_ptr(), b.len(), PtrType::Host).unwrap())
        .collect();

    // Round 1: receives posted before sends; round 2: sends first (the
    // receiver-not-ready path).
    for round in 0..2 {
        let mut recvs = Vec::new();
        let mut sends = Vec::new();
        for i in 0..sizes.len() {
            let tag = i as i32 - 3;
            // SAFETY: buffers outlive the requests, which are waited for below.
            let post_recv = |r: &mut Box<dyn RecvComm>, d: &mut Vec<u8>| unsafe {
                r.irecv(d.as_mut_ptr(), d.len(), tag, Some(rmr[i]))
                    .unwrap()
                    .unwrap()
            };
            // SAFETY: as above.
            let post_send = |s: &mut Box<dyn SendComm>| unsafe {
                s.isend(src[i].as_ptr(), src[i].len(), tag, Some(smr[i]))
                    .unwrap()
                    .unwrap()
            };
            if round == 0 {
                recvs.push(post_recv(&mut r, &mut dst[i]));
                sends.push(post_send(&mut s));
            } else {
                sends.push(post_send(&mut s));
                recvs.push(post_recv(&mut r, &mut dst[i]));
            }
        }
        // Test in reverse order: completion order is not request order.
        for (i, rq) in recvs.iter_mut().enumerate().rev() {
            assert_eq!(wait(rq).unwrap(), sizes[i], "round {round} receive {i}");
            assert_eq!(&dst[i][..sizes[i]], &src[i][..], "round {round} data {i}");
        }
        for (i, sq) in sends.iter_mut().enumerate() {
            assert_eq!(wait(sq).unwrap(), sizes[i], "round {round} send {i}");
        }
        for d in dst.iter_mut() {
            d.fill(0);
        }
    }
    for m in smr {
        s.dereg_mr(m).unwrap();
    }
    for m in rmr {
        r.dereg_mr(m).unwrap();
    }

    // A message larger than its receive fails both ends, with a reason.
    let big = [1u8; 100];
    let mut small = vec![0u8; 50];
    let bm = s
        .reg_mr(big.as_ptr() as *mut u8, 100, PtrType::Host)
        .unwrap();
    let sm = r.reg_mr(small.as_mut_ptr(), 50, PtrType::Host).unwrap();
    // SAFETY: buffers outlive the requests.
    let mut rq = unsafe { r.irecv(small.as_mut_ptr(), 50, 1, Some(sm)) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let mut sq = unsafe { s.isend(big.as_ptr(), 100, 1, Some(bm)) }
        .unwrap()
        .unwrap();
    let e = wait(&mut rq).unwrap_err();
    assert!(e.contains("local length error"), "{e}");
    assert!(wait(&mut sq).is_err());
    // The connection is broken from then on: posting says so.
    // SAFETY: as above.
    assert!(unsafe { s.isend(big.as_ptr(), 1, 2, Some(bm)) }.is_err());
    // A send without a registration is refused before reaching the NIC.
    let (mut s2, _r2) = connect_pair(&net);
    // SAFETY: nothing is posted.
    let e = unsafe { s2.isend(big.as_ptr(), 1, 0, None) }.err().unwrap();
    assert!(e.to_string().contains("regMr"), "{e}");
    println!("DATA_PATH_OK");
}

#[test]
fn data_path_over_fake_infiniband() {
    let name = "data_path_over_fake_infiniband";
    if is_child(name) {
        return data_path();
    }
    if let Some((so, se)) = run_child(name, &[("NCCL_IB_QPS_PER_CONNECTION", "3")]) {
        assert!(so.contains("DATA_PATH_OK"), "{so}\n{se}");
        assert!(se.contains("fake0:1/IB"), "{se}");
    }
}

#[test]
fn data_path_over_fake_roce() {
    let name = "data_path_over_fake_roce";
    if is_child(name) {
        return data_path();
    }
    if let Some((so, se)) = run_child(name, &[("FAKE_IBV_LINK", "eth")]) {
        assert!(so.contains("DATA_PATH_OK"), "{so}\n{se}");
        assert!(se.contains("fake0:1/RoCE"), "{se}");
    }
}

#[test]
fn hca_setting_that_selects_nothing_is_named() {
    let name = "hca_setting_that_selects_nothing_is_named";
    if is_child(name) {
        let net = IbNet::from_env().unwrap();
        assert_eq!(net.devices().unwrap(), 0);
        return;
    }
    for hca in ["mlx5", "^fake", "=fake", "fake0:2"] {
        if let Some((_, se)) = run_child(name, &[("NCCL_IB_HCA", hca)]) {
            assert!(
                se.contains(&format!("NCCL_IB_HCA={hca:?}")) && se.contains("fake0:1"),
                "NCCL_IB_HCA={hca}: {se}"
            );
        }
    }
}

#[test]
fn timeout_and_retry_settings_reach_the_queue_pairs() {
    let name = "timeout_and_retry_settings_reach_the_queue_pairs";
    if is_child(name) {
        return data_path();
    }
    let env = [
        ("NCCL_IB_TIMEOUT", "14"),
        ("NCCL_IB_RETRY_CNT", "3"),
        ("FAKE_IBV_EXPECT_TIMEOUT", "14"),
        ("FAKE_IBV_EXPECT_RETRY", "3"),
    ];
    if let Some((so, se)) = run_child(name, &env) {
        assert!(so.contains("DATA_PATH_OK"), "{so}\n{se}");
    }
}

/// With GPUDirect assumed, a receive end flushes through a QP connected to
/// itself (an RDMA read of the received buffer), as NCCL does.
#[test]
fn flush_reads_back_through_a_loopback_qp() {
    let name = "flush_reads_back_through_a_loopback_qp";
    if is_child(name) {
        let cfg = Config {
            gdr_override: Some(true),
            ..Config::from_env().unwrap()
        };
        let net = IbNet::with_config(cfg);
        assert_ne!(
            net.properties(0).unwrap().ptr_support & PtrType::Cuda as i32,
            0
        );
        let (mut s, mut r) = connect_pair(&net);
        let src = [5u8; 256];
        let mut dst = [0u8; 256];
        let sm = s
            .reg_mr(src.as_ptr() as *mut u8, 256, PtrType::Host)
            .unwrap();
        let rm = r.reg_mr(dst.as_mut_ptr(), 256, PtrType::Host).unwrap();
        // SAFETY: buffers outlive the requests, waited for below.
        let mut rq = unsafe { r.irecv(dst.as_mut_ptr(), 256, 0, Some(rm)) }
            .unwrap()
            .unwrap();
        // SAFETY: as above.
        let mut sq = unsafe { s.isend(src.as_ptr(), 256, 0, Some(sm)) }
            .unwrap()
            .unwrap();
        assert_eq!(wait(&mut rq).unwrap(), 256);
        assert_eq!(wait(&mut sq).unwrap(), 256);
        let mut fq = r
            .iflush(dst.as_mut_ptr(), 256, Some(rm))
            .unwrap()
            .expect("a flush request");
        assert_eq!(wait(&mut fq).unwrap(), 0);
        // Without the handle (NCCL always passes it), the covering
        // registration is found.
        let mut fq = r.iflush(dst.as_mut_ptr(), 256, None).unwrap().unwrap();
        assert_eq!(wait(&mut fq).unwrap(), 0);
        // Nothing received, nothing to flush: no request, which the C ABI
        // reads as "flushed".
        assert!(r.iflush(dst.as_mut_ptr(), 0, Some(rm)).unwrap().is_none());
        // Unregistered memory or an unknown handle cannot be flushed: an
        // error, not a crash. (On the heap: the stack page of `dst` is
        // registered, pages being the unit.)
        let mut other = vec![0u8; 8];
        assert!(r.iflush(other.as_mut_ptr(), 8, None).is_err());
        let e = r
            .iflush(dst.as_mut_ptr(), 8, Some(MrHandle(9999)))
            .err()
            .unwrap();
        assert!(e.to_string().contains("0x270f"), "{e}");
        // Flushes left untested fill their own budget and then fail loudly
        // (a NULL request would read as "flushed"); testing them frees it.
        let mut pending: Vec<_> = (0..32)
            .map(|_| r.iflush(dst.as_mut_ptr(), 256, Some(rm)).unwrap().unwrap())
            .collect();
        let e = r.iflush(dst.as_mut_ptr(), 256, Some(rm)).err().unwrap();
        assert!(e.to_string().contains("flushes in flight"), "{e}");
        for f in pending.iter_mut() {
            assert_eq!(wait(f).unwrap(), 0);
        }
        let mut fq = r.iflush(dst.as_mut_ptr(), 256, Some(rm)).unwrap().unwrap();
        assert_eq!(wait(&mut fq).unwrap(), 0);
        println!("FLUSH_OK");
        return;
    }
    if let Some((so, se)) = run_child(name, &[]) {
        assert!(so.contains("FLUSH_OK"), "{so}\n{se}");
    }
}

/// NCCL_GDR_FLUSH_DISABLE=1: GPU-direct stays on, but receives are not
/// flushed (no loopback QP, and iflush has nothing to wait for).
#[test]
fn flush_disabled_by_setting() {
    let name = "flush_disabled_by_setting";
    if is_child(name) {
        let cfg = Config {
            gdr_override: Some(true),
            ..Config::from_env().unwrap()
        };
        assert!(cfg.gdr_flush_disable);
        let net = IbNet::with_config(cfg);
        let (_s, mut r) = connect_pair(&net);
        let mut dst = [0u8; 64];
        let rm = r.reg_mr(dst.as_mut_ptr(), 64, PtrType::Host).unwrap();
        assert!(r.iflush(dst.as_mut_ptr(), 64, Some(rm)).unwrap().is_none());
        println!("NO_FLUSH_OK");
        return;
    }
    if let Some((so, se)) = run_child(name, &[("NCCL_GDR_FLUSH_DISABLE", "1")]) {
        assert!(so.contains("NO_FLUSH_OK"), "{so}\n{se}");
    }
}

/// A page-aligned heap buffer of `pages` pages (plus slack to align).
fn aligned(pages: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; (pages + 1) * 4096];
    let off = (4096 - v.as_ptr() as usize % 4096) % 4096;
    (v, off)
}

/// Where dma-buf works (the fake's default), the device reports
/// NCCL_PTR_DMABUF, and a buffer registered through its dma-buf carries
/// data and is flushed; the registration reaches ibv_reg_dmabuf_mr with
/// NCCL's arguments (page-aligned iova and length, offset moved back
/// with the start).
#[test]
fn dmabuf_registration_carries_data() {
    let name = "dmabuf_registration_carries_data";
    if is_child(name) {
        use std::os::fd::AsRawFd;
        let net = IbNet::from_env().unwrap();
        let ps = net.properties(0).unwrap().ptr_support;
        assert_ne!(ps & PtrType::Dmabuf as i32, 0, "ptr_support {ps:#x}");
        let (mut s, mut r) = connect_pair(&net);
        // Any open descriptor is a dma-buf to the fake.
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = f.as_raw_fd();
        let (mut dst, off) = aligned(2);
        // The receive starts 100 bytes into a page, 4096 + 100 bytes into
        // its dma-buf: the page starts 4096 bytes in.
        let buf = dst[off + 100..].as_mut_ptr();
        let page = dst[off..].as_ptr() as usize;
        let d = DmaBuf {
            fd,
            offset: 4096 + 100,
        };
        let rm = r.reg_mr_dma_buf(buf, 4000, PtrType::Cuda, d).unwrap();
        println!("EXPECT fake: reg_dmabuf fd={fd} offset=4096 len=8192 iova={page:#x}");
        let src = [7u8; 4000];
        let sm = s
            .reg_mr(src.as_ptr() as *mut u8, 4000, PtrType::Host)
            .unwrap();
        // SAFETY: buffers outlive the requests, waited for below.
        let mut rq = unsafe { r.irecv(buf, 4000, 3, Some(rm)) }.unwrap().unwrap();
        // SAFETY: as above.
        let mut sq = unsafe { s.isend(src.as_ptr(), 4000, 3, Some(sm)) }
            .unwrap()
            .unwrap();
        assert_eq!(wait(&mut rq).unwrap(), 4000);
        assert_eq!(wait(&mut sq).unwrap(), 4000);
        assert!(dst[off + 100..off + 4100].iter().all(|b| *b == 7));
        // dma-buf alone enables the flush, as in NCCL.
        let mut fq = r.iflush(buf, 4000, Some(rm)).unwrap().expect("a flush");
        assert_eq!(wait(&mut fq).unwrap(), 0);
        r.dereg_mr(rm).unwrap();
        // What cannot be a dma-buf registration is refused with the reason.
        let mut bad = |fd, offset, ty| {
            let e = s
                .reg_mr_dma_buf(buf, 64, ty, DmaBuf { fd, offset })
                .err()
                .unwrap();
            assert!(
                matches!(e, NetError::InvalidArgument(_) | NetError::System(_)),
                "{e}"
            );
            e.to_string()
        };
        assert!(bad(-1, 100, PtrType::Cuda).contains("fd -1"));
        assert!(bad(fd, 100, PtrType::Host).contains("host memory"));
        assert!(bad(fd, 10, PtrType::Cuda).contains("100 bytes into its page"));
        assert!(bad(9999, 100, PtrType::Cuda).contains("Bad file descriptor"));
        println!("DMABUF_OK");
        return;
    }
    if let Some((so, se)) = run_child(name, &[]) {
        assert!(so.contains("DMABUF_OK"), "{so}\n{se}");
        let want = so
            .lines()
            .find_map(|l| l.strip_prefix("EXPECT "))
            .expect("the child says what to expect");
        assert!(se.contains(want), "{want}\n{se}");
    }
}

/// Where dma-buf cannot work (the kernel refuses it, or libibverbs is too
/// old to have ibv_reg_dmabuf_mr), the device does not report
/// NCCL_PTR_DMABUF and a dma-buf registration says why.
#[test]
fn without_dmabuf_the_device_says_why() {
    let name = "without_dmabuf_the_device_says_why";
    if is_child(name) {
        let net = IbNet::from_env().unwrap();
        assert_eq!(
            net.properties(0).unwrap().ptr_support & PtrType::Dmabuf as i32,
            0
        );
        let (mut s, _r) = connect_pair(&net);
        let mut buf = [0u8; 64];
        let e = s
            .reg_mr_dma_buf(
                buf.as_mut_ptr(),
                64,
                PtrType::Cuda,
                DmaBuf { fd: 0, offset: 0 },
            )
            .err()
            .unwrap();
        assert!(matches!(e, NetError::InvalidUsage(_)), "{e}");
        println!("WHY {e}");
        return;
    }
    /// The child's environment, the fake's build flags, the reason expected.
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a str);
    let cases: [Case; 2] = [
        (
            &[("FAKE_IBV_DMABUF", "unsupported")],
            &[],
            "refuses dma-buf",
        ),
        (&[], &["FAKE_NO_DMABUF"], "lacks ibv_reg_dmabuf_mr"),
    ];
    for (env, defines, why) in cases {
        if let Some((so, se)) = run_child_with(name, env, defines) {
            let line = so.lines().find(|l| l.starts_with("WHY ")).unwrap_or("");
            assert!(
                line.contains("NCCL_PTR_DMABUF") && line.contains(why),
                "{why}: {so}\n{se}"
            );
        }
    }
}

/// A peer whose listener never answers (its accept is never called: the
/// kernel completes the TCP handshake, nobody reads the hello) ends the
/// connect with an error naming the peer and OXCCL_IB_CONNECT_TIMEOUT,
/// after that many seconds rather than never.
#[test]
fn connect_to_a_silent_peer_times_out() {
    let name = "connect_to_a_silent_peer_times_out";
    if is_child(name) {
        let net = IbNet::from_env().unwrap();
        let (mut h, _l) = net.listen(0).unwrap();
        let t0 = Instant::now();
        let e = loop {
            match net.connect(0, &mut h) {
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Ok(Some(_)) => panic!("connected to a listener that never accepts"),
                Err(e) => break e,
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "no timeout");
        };
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_secs(1), "{waited:?}");
        let t = e.to_string();
        assert!(
            matches!(e, NetError::Remote(_))
                && t.contains("127.0.0.1:")
                && t.contains("OXCCL_IB_CONNECT_TIMEOUT=1"),
            "{t}"
        );
        println!("TIMEOUT_OK {t}");
        return;
    }
    if let Some((so, se)) = run_child(name, &[("OXCCL_IB_CONNECT_TIMEOUT", "1")]) {
        assert!(so.contains("TIMEOUT_OK"), "{so}\n{se}");
    }
}

/// Two ports of one HCA become one device whose QPs alternate between the
/// ports (a CQ each, one registration shared through the HCA's PD).
#[test]
fn merged_ports_carry_traffic() {
    let name = "merged_ports_carry_traffic";
    if is_child(name) {
        return data_path();
    }
    let env = [("FAKE_IBV_PORTS", "2"), ("NCCL_IB_QPS_PER_CONNECTION", "4")];
    if let Some((so, se)) = run_child(name, &env) {
        assert!(so.contains("DATA_PATH_OK"), "{so}\n{se}");
        assert!(
            se.contains("using 1 device(s): fake0:1/IB+fake0:2/IB"),
            "{se}"
        );
    }
    let env = [("FAKE_IBV_PORTS", "2"), ("NCCL_IB_MERGE_NICS", "0")];
    if let Some((so, se)) = run_child(name, &env) {
        assert!(so.contains("DATA_PATH_OK"), "{so}\n{se}");
        assert!(
            se.contains("using 2 device(s): fake0:1/IB, fake0:2/IB"),
            "{se}"
        );
    }
}
