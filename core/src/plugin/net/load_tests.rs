//! The SDK's C loader ([`oxccl_plugin::net::load`]) against the socket
//! network's export glue, one version at a time: tests that need a real
//! network, which the SDK cannot link, so they run here.
#![allow(unsafe_code)]

use oxccl_net_socket::testing::pair;
use oxccl_plugin::loader::Lib;
use oxccl_plugin::net::load::{CNet, CPlugin};
use oxccl_plugin::{DmaBuf, Net, PtrType};

/// The socket network's exported vtable of one version only, as a
/// library exporting just that version would be.
/// The version chosen lives in a static read by `symbols`, so tests
/// running in parallel negotiate one at a time.
fn negotiate_only(version: u32) -> std::sync::Arc<CPlugin> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    std::sync::Arc::new(CPlugin::negotiate(&only(version), super::host()).unwrap())
}

fn only(version: u32) -> Lib {
    oxccl_net_socket::force_link();
    static WANT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    WANT.store(version, std::sync::atomic::Ordering::SeqCst);
    fn symbols(name: &str) -> Option<*const std::os::raw::c_void> {
        let v = WANT.load(std::sync::atomic::Ordering::SeqCst);
        let b = oxccl_plugin::builtin_nets()
            .into_iter()
            .find(|b| b.name == "Socket")?;
        (name == format!("ncclNetPlugin_v{v}"))
            .then(|| (b.abi?)(name))
            .flatten()
    }
    Lib::Builtin {
        name: "socket-one-version",
        symbols,
    }
}

/// Connects `net` to itself and sends one message; panics on failure.
/// Connects `net`'s device 0 to itself, sends `msg` into a receive of
/// `capacity` bytes; returns the sizes the receive reported and its buffer.
fn round_trip(net: &CNet, msg: &[u8], capacity: usize) -> (Vec<usize>, Vec<u8>) {
    let (mut s, mut r) = pair(net);
    let mut got = vec![0u8; capacity];
    let mut rq = loop {
        // SAFETY: both buffers outlive their requests (polled to completion below).
        if let Some(q) = unsafe { r.irecv(got.as_mut_ptr(), got.len(), 0, None) }.unwrap() {
            break q;
        }
    };
    let mut sq = loop {
        // SAFETY: as above.
        if let Some(q) = unsafe { s.isend(msg.as_ptr(), msg.len(), 0, None) }.unwrap() {
            break q;
        }
    };
    let (mut sd, mut rd) = (None, None);
    while sd.is_none() || rd.is_none() {
        if sd.is_none() {
            sd = sq.test().unwrap();
        }
        if rd.is_none() {
            rd = rq.test().unwrap();
        }
    }
    (rd.unwrap(), got)
}

/// A 100-byte message of `fill` arrives whole.
fn echo(net: &CNet, fill: u8) {
    let msg = vec![fill; 100];
    assert_eq!(round_trip(net, &msg, 100).1, msg);
}

/// A network whose registrations are its own: every regMr answers a
/// fresh value (not the address registered, which a layer in between
/// could make up again), and every transfer records the handle it was
/// given. Data moves through the socket network, which ignores handles.
mod marked {
    use std::os::raw::c_void;
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
    use std::sync::{Mutex, OnceLock};

    use oxccl_net_socket::SocketNet;
    use oxccl_plugin::ffi::net::{v10, v11, v12, v8, v9};
    use oxccl_plugin::net::export::{self, Exported, Provider};
    use oxccl_plugin::{
        DmaBuf, ListenComm, MrHandle, Net, NetError, NetHandle, NetProperties, NetResult, PtrType,
        RecvComm, Request, SendComm,
    };

    use oxccl_plugin::loader::Lib;

    /// (call, handle) in call order: the handle regMr made, or the one
    /// deregMr, isend or irecv received (0 for none).
    pub static MARKS: Mutex<Vec<(&'static str, usize)>> = Mutex::new(Vec::new());
    static NEXT: AtomicUsize = AtomicUsize::new(0x6d72_0001);

    fn mark(call: &'static str, h: usize) {
        MARKS.lock().unwrap().push((call, h));
    }

    struct Marked(SocketNet);
    struct Listen(Box<dyn ListenComm>);
    struct Send(Box<dyn SendComm>);
    struct Recv(Box<dyn RecvComm>);

    impl Net for Marked {
        fn name(&self) -> &str {
            "marked"
        }
        fn devices(&self) -> NetResult<usize> {
            self.0.devices()
        }
        fn properties(&self, dev: usize) -> NetResult<NetProperties> {
            let mut p = self.0.properties(dev)?;
            p.ptr_support |= PtrType::Dmabuf as i32;
            Ok(p)
        }
        fn listen(&self, dev: usize) -> NetResult<(NetHandle, Box<dyn ListenComm>)> {
            let (h, l) = self.0.listen(dev)?;
            Ok((h, Box::new(Listen(l))))
        }
        fn connect(&self, dev: usize, h: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>> {
            Ok(self
                .0
                .connect(dev, h)?
                .map(|c| Box::new(Send(c)) as Box<dyn SendComm>))
        }
    }

    impl ListenComm for Listen {
        fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
            Ok(self
                .0
                .accept()?
                .map(|c| Box::new(Recv(c)) as Box<dyn RecvComm>))
        }
    }

    fn reg() -> MrHandle {
        let h = NEXT.fetch_add(0x10, Ordering::SeqCst);
        mark("regMr", h);
        MrHandle(h)
    }

    fn seen(call: &'static str, m: Option<MrHandle>) {
        mark(call, m.map_or(0, |m| m.0));
    }

    /// (fd, offset, bytes, pointer type) of each regMrDmaBuf, in order.
    pub static DMABUFS: Mutex<Vec<(i32, u64, usize, i32)>> = Mutex::new(Vec::new());

    fn reg_dmabuf(n: usize, t: PtrType, d: DmaBuf) -> MrHandle {
        DMABUFS.lock().unwrap().push((d.fd, d.offset, n, t as i32));
        reg()
    }

    impl SendComm for Send {
        fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrType) -> NetResult<MrHandle> {
            Ok(reg())
        }
        fn reg_mr_dma_buf(
            &mut self,
            _: *mut u8,
            n: usize,
            t: PtrType,
            d: DmaBuf,
        ) -> NetResult<MrHandle> {
            Ok(reg_dmabuf(n, t, d))
        }
        fn dereg_mr(&mut self, m: MrHandle) -> NetResult<()> {
            seen("deregMr", Some(m));
            Ok(())
        }
        unsafe fn isend(
            &mut self,
            d: *const u8,
            n: usize,
            tag: i32,
            m: Option<MrHandle>,
        ) -> NetResult<Option<Box<dyn Request>>> {
            seen("isend", m);
            // SAFETY: forwarded under the caller's contract.
            unsafe { self.0.isend(d, n, tag, None) }
        }
    }

    impl RecvComm for Recv {
        fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrType) -> NetResult<MrHandle> {
            Ok(reg())
        }
        fn reg_mr_dma_buf(
            &mut self,
            _: *mut u8,
            n: usize,
            t: PtrType,
            d: DmaBuf,
        ) -> NetResult<MrHandle> {
            Ok(reg_dmabuf(n, t, d))
        }
        fn dereg_mr(&mut self, m: MrHandle) -> NetResult<()> {
            seen("deregMr", Some(m));
            Ok(())
        }
        unsafe fn irecv(
            &mut self,
            d: *mut u8,
            n: usize,
            tag: i32,
            m: Option<MrHandle>,
        ) -> NetResult<Option<Box<dyn Request>>> {
            seen("irecv", m);
            // SAFETY: forwarded under the caller's contract.
            unsafe { self.0.irecv(d, n, tag, None) }
        }
    }

    struct P;
    impl Provider for P {
        fn cell() -> &'static OnceLock<Result<Box<dyn Net>, NetError>> {
            static CELL: OnceLock<Result<Box<dyn Net>, NetError>> = OnceLock::new();
            &CELL
        }
        fn make() -> NetResult<Box<dyn Net>> {
            Ok(Box::new(Marked(SocketNet::from_env()?)))
        }
        const NAME: &'static [u8] = b"marked\0";
    }

    // The export glue's vtables of every version; it passes handles
    // through unchanged both ways (`MrHandle(p as usize)`), so a
    // handle the network sees is the one that crossed the C ABI.
    static V8: Exported<v8::NetV8> = Exported(v8::exported::<P>());
    static V9: Exported<v9::NetV9> = Exported(v9::exported::<P>());
    static V10: Exported<v10::NetV10> = Exported(v10::exported::<P>());
    static V11: Exported<v11::NetV11> = Exported(v11::exported::<P>());
    static V12: Exported<v12::NetV12> = Exported(export::vtable::<P>());
    /// v12 as a plugin without regMrDmaBuf exports it.
    static V12_NO_DMABUF: Exported<v12::NetV12> = Exported(v12::NetV12 {
        reg_mr_dma_buf: None,
        ..export::vtable::<P>()
    });
    /// [`only`]'s version for [`V12_NO_DMABUF`].
    pub const NO_DMABUF: u32 = 112;
    static WANT: AtomicU32 = AtomicU32::new(0);

    fn symbols(name: &str) -> Option<*const c_void> {
        let v = WANT.load(Ordering::SeqCst);
        if name != format!("ncclNetPlugin_v{}", if v == NO_DMABUF { 12 } else { v }) {
            return None;
        }
        Some(match v {
            NO_DMABUF => std::ptr::addr_of!(V12_NO_DMABUF).cast(),
            8 => std::ptr::addr_of!(V8).cast(),
            9 => std::ptr::addr_of!(V9).cast(),
            10 => std::ptr::addr_of!(V10).cast(),
            11 => std::ptr::addr_of!(V11).cast(),
            _ => std::ptr::addr_of!(V12).cast(),
        })
    }

    /// This network as a library exporting `version` only.
    pub fn only(version: u32) -> std::sync::Arc<super::CPlugin> {
        static ONE: Mutex<()> = Mutex::new(());
        let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
        WANT.store(version, Ordering::SeqCst);
        let lib = Lib::Builtin {
            name: "marked",
            symbols,
        };
        std::sync::Arc::new(super::CPlugin::negotiate(&lib, super::super::host()).unwrap())
    }
}

/// regMrDmaBuf reaches the plugin with the descriptor, offset, size and
/// pointer type given, from both ends and in every version that has it
/// (v8 on), and its handle is the plugin's; a plugin whose vtable has
/// no regMrDmaBuf is not taken to accept dma-buf, whatever it reports
/// (NCCL's dmaBufSupported needs the entry).
#[test]
fn dma_buf_registrations_cross_the_abi() {
    let dmabuf = |net: &CNet| net.properties(0).unwrap().ptr_support & PtrType::Dmabuf as i32;
    for v in [8u32, 9, 10, 11, 12] {
        let net = marked::only(v).open(0, None).unwrap();
        assert_ne!(dmabuf(&net), 0, "v{v}");
        let (mut s, mut r) = pair(&net);
        let mut buf = vec![0u8; 8192];
        let d = DmaBuf {
            fd: 40 + v as i32,
            offset: 4096,
        };
        let start = marked::DMABUFS.lock().unwrap().len();
        let sm = s
            .reg_mr_dma_buf(buf.as_mut_ptr(), 100, PtrType::Cuda, d)
            .unwrap();
        let rm = r
            .reg_mr_dma_buf(buf.as_mut_ptr(), 200, PtrType::Cuda, d)
            .unwrap();
        let seen = marked::DMABUFS.lock().unwrap()[start..].to_vec();
        let cuda = PtrType::Cuda as i32;
        assert_eq!(
            seen,
            vec![(d.fd, 4096, 100, cuda), (d.fd, 4096, 200, cuda)],
            "v{v}"
        );
        assert_ne!((sm.0, rm.0), (0, 0), "v{v}");
        s.dereg_mr(sm).unwrap();
        r.dereg_mr(rm).unwrap();
    }
    let net = marked::only(marked::NO_DMABUF).open(0, None).unwrap();
    assert_eq!(dmabuf(&net), 0);
    let (mut s, _r) = pair(&net);
    let e = s
        .reg_mr_dma_buf(
            std::ptr::null_mut(),
            1,
            PtrType::Cuda,
            DmaBuf { fd: 3, offset: 0 },
        )
        .unwrap_err();
    assert!(e.to_string().contains("regMrDmaBuf"), "{e}");
}

/// The `mhandle` the adapter passes to isend, irecv and deregMr is
/// exactly what the plugin's regMr wrote, and the handle the adapter
/// returns from regMr is that value too, in every version (no boxing
/// or copying on the way).
#[test]
fn transfers_carry_the_handle_reg_mr_made() {
    for v in [8u32, 9, 10, 11, 12] {
        let net = marked::only(v).open(0, None).unwrap();
        let (mut s, mut r) = pair(&net);
        let msg = vec![v as u8; 64];
        let mut got = vec![0u8; 64];
        let start = marked::MARKS.lock().unwrap().len();
        let rm = r
            .reg_mr(got.as_mut_ptr(), got.len(), PtrType::Host)
            .unwrap();
        let sm = s
            .reg_mr(msg.as_ptr() as *mut u8, msg.len(), PtrType::Host)
            .unwrap();
        let mut rq = loop {
            let (p, n) = (got.as_mut_ptr(), got.len());
            // SAFETY: both buffers outlive their requests (polled to completion below).
            if let Some(q) = unsafe { r.irecv(p, n, 0, Some(rm)) }.unwrap() {
                break q;
            }
        };
        let mut sq = loop {
            // SAFETY: as above.
            if let Some(q) = unsafe { s.isend(msg.as_ptr(), msg.len(), 0, Some(sm)) }.unwrap() {
                break q;
            }
        };
        let (mut sd, mut rd) = (None, None);
        while sd.is_none() || rd.is_none() {
            if sd.is_none() {
                sd = sq.test().unwrap();
            }
            if rd.is_none() {
                rd = rq.test().unwrap();
            }
        }
        assert_eq!(got, msg, "v{v}");
        s.dereg_mr(sm).unwrap();
        r.dereg_mr(rm).unwrap();
        let mut seen = marked::MARKS.lock().unwrap()[start..].to_vec();
        seen.dedup();
        assert_ne!(
            rm.0,
            got.as_ptr() as usize,
            "v{v}: a handle of the plugin's own"
        );
        assert_eq!(
            seen,
            vec![
                ("regMr", rm.0),
                ("regMr", sm.0),
                ("irecv", rm.0),
                ("isend", sm.0),
                ("deregMr", sm.0),
                ("deregMr", rm.0),
            ],
            "v{v}"
        );
    }
}

/// Per-communicator views over the export glue: several v11/v12
/// contexts alive at once, one finalized while the others keep working;
/// before v11 every view shares the process's one `init`.
#[test]
fn contexts_per_communicator_coexist() {
    for v in [11u32, 12] {
        let plugin = negotiate_only(v);
        let a = plugin.open(1, None).unwrap();
        let b = plugin.open(2, None).unwrap();
        assert!(a.has_context() && b.has_context(), "v{v}");
        echo(&a, 1);
        echo(&b, 2);
        drop(a);
        echo(&b, 3);
        let c = plugin.open(3, None).unwrap();
        echo(&c, 4);
        drop(b);
        echo(&c, 5);
    }
    for v in [8u32, 9, 10] {
        let plugin = negotiate_only(v);
        let a = plugin.open(1, None).unwrap();
        assert!(!a.has_context(), "v{v}");
        echo(&a, 6);
    }
}

/// Every version's adapter against the same network's export glue:
/// connect, accept and one message each way of the one connection.
#[test]
fn every_version_round_trips_a_message() {
    for v in [8u32, 9, 10, 11, 12] {
        let plugin = negotiate_only(v);
        assert_eq!(plugin.version(), format!("v{v}"));
        let net = plugin.open(0, None).unwrap();
        assert!(net.properties(0).unwrap().max_p2p_bytes > 0);
        let msg: Vec<u8> = (0..1000u32).map(|i| (i * v) as u8).collect();
        let (rd, got) = round_trip(&net, &msg, 4096);
        assert_eq!(rd, vec![1000], "v{v}");
        assert_eq!(&got[..1000], &msg[..], "v{v}");
    }
}
