//! The proxy thread itself, over the socket network on loopback: the
//! tests play both ranks' kernels on plain host areas.

use super::*;
use oxccl_net_socket::testing::pair;
use oxccl_net_socket::SocketNet;
use oxccl_plugin::{MrHandle, NetResult, PtrType, RecvComm, SendComm};
use rand::{Rng, SeedableRng};
use std::sync::atomic::AtomicUsize;

const LIMIT: Duration = Duration::from_secs(30);

/// One rank's kernel on one FIFO: sends `steps` random slices of
/// random size to its peer and receives as many, in the protocol the
/// kernels use on it. Through the LL FIFO it stores a slot's size word
/// a poll before its lines, as a GPU's unfenced stores may land, and
/// polls the lines' flags rather than `tail`.
struct Kernel {
    mine: Arc<Area>,
    mirror: Arc<Area>,
    fifo: Fifo,
    out: usize,
    inc: usize,
    sent: u64,
    recvd: u64,
    /// An LL slot whose size word is stored and whose lines are not.
    pending: Option<Vec<u8>>,
    rng: rand::rngs::StdRng,
}

/// Slice `step` from rank `from` through `proto`: its size and bytes,
/// known to both sides (whole lines' data through LL).
fn slice(from: usize, proto: Proto, step: u64, slot: usize) -> Vec<u8> {
    let seed = ((from as u64) << 40) | (u64::from(proto == Proto::Ll) << 39) | step;
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let len = match proto {
        Proto::Simple => r.random_range(1..=slot),
        Proto::Ll => r.random_range(1..=slot / LL_LINE) * 8,
    };
    (0..len).map(|_| r.random()).collect()
}

impl Kernel {
    fn new(
        rank: usize,
        peer: usize,
        layout: Layout,
        areas: [&Arc<Area>; 2],
        proto: Proto,
    ) -> Kernel {
        Kernel {
            mine: areas[0].clone(),
            mirror: areas[1].clone(),
            fifo: layout.fifo(proto),
            out: layout.cell(rank, peer, 0),
            inc: layout.cell(peer, rank, 0),
            sent: 0,
            recvd: 0,
            pending: None,
            rng: rand::rngs::StdRng::seed_from_u64(rank as u64 * 2 + u64::from(proto == Proto::Ll)),
        }
    }

    /// One poll: a send where a slot is free, a receive where a slice
    /// arrived (checked against the sender's bytes).
    fn poll(&mut self, rank: usize, peer: usize, steps: u64) {
        let l = self.fifo;
        let ll = l.proto == Proto::Ll;
        if let Some(data) = self.pending.take() {
            let off = l.slot(self.out, self.sent);
            let flag = u64::from(ll_flag(self.sent));
            for (i, w) in data.chunks(8).enumerate() {
                let w = u64::from_le_bytes(w.try_into().unwrap());
                self.mirror
                    .store(off + i * LL_LINE, (w & 0xffff_ffff) | flag << 32);
                self.mirror
                    .store(off + i * LL_LINE + 8, (w >> 32) | flag << 32);
            }
            self.sent += 1;
        }
        let free = self.mine.load(l.head(self.inc)) + l.nslots as u64;
        if self.sent < steps && self.sent < free && self.rng.random_bool(0.5) {
            let data = slice(rank, l.proto, self.sent, l.slot_bytes);
            if ll {
                self.mirror
                    .store(l.size(self.out, self.sent), (data.len() * 2) as u64);
                self.pending = Some(data);
            } else {
                self.mirror.write_bytes(l.slot(self.out, self.sent), &data);
                self.mirror
                    .store(l.size(self.out, self.sent), data.len() as u64);
                self.sent += 1;
                self.mirror.store(l.tail(self.out), self.sent);
            }
        }
        if self.recvd >= steps {
            return;
        }
        let want = slice(peer, l.proto, self.recvd, l.slot_bytes);
        let off = l.slot(self.inc, self.recvd);
        let got = if ll {
            let flag = u64::from(ll_flag(self.recvd));
            let mut got = Vec::with_capacity(want.len());
            for i in 0..want.len() / 8 {
                let (a, b) = (
                    self.mine.load(off + i * LL_LINE),
                    self.mine.load(off + i * LL_LINE + 8),
                );
                if a >> 32 != flag || b >> 32 != flag {
                    return;
                }
                got.extend_from_slice(&((a & 0xffff_ffff) | b << 32).to_le_bytes());
            }
            got
        } else {
            if self.recvd >= self.mine.load(l.tail(self.inc)) {
                return;
            }
            let mut got = vec![0; want.len()];
            self.mine.read_bytes(off, &mut got);
            got
        };
        assert_eq!(
            got, want,
            "{:?} slice {} from rank {peer}",
            l.proto, self.recvd
        );
        self.recvd += 1;
        self.mirror.store(l.head(self.out), self.recvd);
    }
}

#[test]
fn random_slices_cross_the_network_and_a_goodbye_ends_it_quietly() {
    // Data on the control socket, then on helper threads' sockets.
    for (threads, socks) in [(0, 1), (2, 2)] {
        let ledger = Ledger::new();
        let (p0, p1) = drive_pair(threads, socks, &ledger);
        // Rank 0 leaves; rank 1 hears its goodbye, with no failure.
        drop(p0);
        let t = Instant::now();
        while p1.gone().is_none() {
            assert!(t.elapsed() < LIMIT, "rank 1 never heard the goodbye");
            std::thread::sleep(Duration::from_millis(1));
        }
        let gone = p1.gone().unwrap().to_string();
        assert!(gone.contains("rank 0 destroyed its communicator"), "{gone}");
        assert!(p1.failure().is_none(), "{:?}", p1.failure());
        drop(p1);
        ledger.assert_none_in_flight();
    }
}

/// Both ranks destroyed at once, as at the end of a job: every
/// connection closes with no request in flight (the receives the
/// proxy posted ahead used to be closed in flight: issue 40, item 9).
#[test]
fn destroy_closes_connections_with_no_request_in_flight() {
    for (threads, socks) in [(0, 1), (2, 2)] {
        let ledger = Ledger::new();
        let (p0, p1) = drive_pair(threads, socks, &ledger);
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(move || drop(p0));
            s.spawn(move || drop(p1));
        });
        // Both answered each other well within the wait for a goodbye.
        assert!(t.elapsed() < BYE_WAIT, "{:?}", t.elapsed());
        ledger.assert_none_in_flight();
    }
}

/// What connections had in flight when they closed, as a network
/// plugin sees it: the test's network wraps the socket network's ends
/// and counts their requests.
struct Ledger {
    closed: Mutex<Vec<(&'static str, usize)>>,
}

impl Ledger {
    fn new() -> Arc<Ledger> {
        Arc::new(Ledger {
            closed: Mutex::new(Vec::new()),
        })
    }

    fn assert_none_in_flight(&self) {
        let c = self.closed.lock().unwrap();
        // 2 ranks x 2 FIFOs x (a send end + a receive end).
        assert_eq!(c.len(), 8, "{c:?}");
        assert!(
            c.iter().all(|(_, n)| *n == 0),
            "closed with requests in flight: {c:?}"
        );
    }
}

struct Counted<C: ?Sized> {
    inner: Box<C>,
    live: Arc<AtomicUsize>,
    ledger: Arc<Ledger>,
    what: &'static str,
}

impl<C: ?Sized> Counted<C> {
    fn wrap(&self, r: NetResult<Option<Box<dyn Request>>>) -> NetResult<Option<Box<dyn Request>>> {
        Ok(r?.map(|inner| {
            self.live.fetch_add(1, Ordering::SeqCst);
            Box::new(CountedReq {
                inner,
                live: Some(self.live.clone()),
            }) as Box<dyn Request>
        }))
    }
}

impl<C: ?Sized> Drop for Counted<C> {
    fn drop(&mut self) {
        let n = self.live.load(Ordering::SeqCst);
        self.ledger.closed.lock().unwrap().push((self.what, n));
    }
}

struct CountedReq {
    inner: Box<dyn Request>,
    live: Option<Arc<AtomicUsize>>,
}

impl CountedReq {
    fn done<T>(&mut self, r: NetResult<Option<T>>) -> NetResult<Option<T>> {
        if let (Ok(Some(_)), Some(l)) = (&r, &self.live) {
            l.fetch_sub(1, Ordering::SeqCst);
            self.live = None;
        }
        r
    }
}

impl Request for CountedReq {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        let r = self.inner.test();
        self.done(r)
    }
    fn test_first(&mut self) -> NetResult<Option<Option<usize>>> {
        let r = self.inner.test_first();
        self.done(r)
    }
}

// The wrappers pass the networks' unsafe transfer calls on unchanged.
#[allow(unsafe_code)]
impl SendComm for Counted<dyn SendComm> {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, t: PtrType) -> NetResult<MrHandle> {
        self.inner.reg_mr(ptr, size, t)
    }
    fn dereg_mr(&mut self, mr: MrHandle) -> NetResult<()> {
        self.inner.dereg_mr(mr)
    }
    unsafe fn isend(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        // SAFETY: the caller's contract, passed on.
        let r = unsafe { self.inner.isend(data, size, tag, mr) };
        self.wrap(r)
    }
}

#[allow(unsafe_code)]
impl RecvComm for Counted<dyn RecvComm> {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, t: PtrType) -> NetResult<MrHandle> {
        self.inner.reg_mr(ptr, size, t)
    }
    fn dereg_mr(&mut self, mr: MrHandle) -> NetResult<()> {
        self.inner.dereg_mr(mr)
    }
    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        // SAFETY: the caller's contract, passed on.
        let r = unsafe { self.inner.irecv(data, size, tag, mr) };
        self.wrap(r)
    }
}

/// Two ranks' proxies over the socket network (`threads` helper
/// threads of `socks` sockets), both FIFOs, their connections counted
/// in `ledger`, driven until each rank's kernel sent and received 300
/// random slices.
fn drive_pair(threads: usize, socks: usize, ledger: &Arc<Ledger>) -> (Proxy, Proxy) {
    let net = SocketNet::new(Some("lo"), oxccl_netif::Family::V4, threads, socks).unwrap();
    // Both FIFOs of one connection at once, each over links of its own.
    let layout = Layout::new(2, 1, 4, 4096, 1024);
    let areas: Vec<[Arc<Area>; 2]> = (0..2)
        .map(|_| [(); 2].map(|()| Arc::new(Area::private(layout.bytes).unwrap())))
        .collect();
    let mut kernels: Vec<(usize, Kernel)> = (0..2)
        .flat_map(|r| {
            let [m, o] = &areas[r];
            [Proto::Simple, Proto::Ll].map(|p| (r, Kernel::new(r, 1 - r, layout, [m, o], p)))
        })
        .collect();
    let counted = || {
        let (s, r) = pair(&net);
        let s = Box::new(Counted {
            inner: s,
            live: Arc::default(),
            ledger: ledger.clone(),
            what: "send",
        }) as Box<dyn SendComm>;
        let r = Box::new(Counted {
            inner: r,
            live: Arc::default(),
            ledger: ledger.clone(),
            what: "recv",
        }) as Box<dyn RecvComm>;
        (s, r)
    };
    let (s01, r01) = counted();
    let (s10, r10) = counted();
    let (ls01, lr01) = counted();
    let (ls10, lr10) = counted();
    let start = |rank: usize, send, recv, ll_send, ll_recv| {
        let link = |send, recv| Link {
            peer: 1 - rank,
            chan: 0,
            send: SendConn::new(send),
            recv: RecvConn::new(recv),
        };
        let [m, o] = &areas[rank];
        let a = Areas::on_host(m.clone(), o.clone(), layout, rank, false);
        Proxy::start(vec![link(send, recv)], vec![link(ll_send, ll_recv)], a).unwrap()
    };
    let p0 = start(0, s01, r10, ls01, lr10);
    let p1 = start(1, s10, r01, ls10, lr01);
    const STEPS: u64 = 300;
    let t = Instant::now();
    while kernels
        .iter()
        .any(|(_, k)| k.recvd < STEPS || k.sent < STEPS)
    {
        for (r, k) in kernels.iter_mut() {
            k.poll(*r, 1 - *r, STEPS);
        }
        assert!(
            t.elapsed() < LIMIT,
            "stalled at {:?}",
            kernels
                .iter()
                .map(|(_, k)| (k.sent, k.recvd))
                .collect::<Vec<_>>()
        );
        assert!(p0.failure().is_none() && p1.failure().is_none());
    }
    (p0, p1)
}
