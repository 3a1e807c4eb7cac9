//! The net glue's optional entries (`regMrDmaBuf`, `iflush`, `getDeviceMr`,
//! `irecvConsumed`) called as NCCL calls them: through each exported
//! version's C vtable, on comms made by a fake network, with NULL and bad
//! arguments, with a network that keeps the trait's defaults, and with
//! one that panics.

use std::os::raw::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use super::*;
use crate::DeviceMr;

/// What the full fake saw last, to check that arguments crossed intact.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Serializes tests that read `SEEN`.
static SERIAL: Mutex<()> = Mutex::new(());

fn seen(what: String) {
    SEEN.lock().unwrap().push(what);
}

fn take_seen() -> Vec<String> {
    std::mem::take(&mut *SEEN.lock().unwrap())
}

struct Done;
impl Request for Done {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        Ok(Some(vec![0]))
    }
}

/// A network that implements every optional entry; size 666 panics.
struct Full;

impl SendComm for Full {
    fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrType) -> NetResult<MrHandle> {
        Ok(MrHandle(1))
    }
    fn reg_mr_dma_buf(
        &mut self,
        ptr: *mut u8,
        size: usize,
        t: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        seen(format!(
            "send dmabuf {:#x} {size} {t:?} fd {} off {}",
            ptr as usize, d.fd, d.offset
        ));
        Ok(MrHandle(0x40 + d.fd as usize))
    }
    fn dereg_mr(&mut self, _: MrHandle) -> NetResult<()> {
        Ok(())
    }
    fn get_device_mr(&mut self, mr: MrHandle) -> NetResult<DeviceMr> {
        Ok(DeviceMr(mr.0 * 2))
    }
    unsafe fn isend(
        &mut self,
        _: *const u8,
        _: usize,
        _: i32,
        _: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        Ok(None)
    }
}

impl RecvComm for Full {
    fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrType) -> NetResult<MrHandle> {
        Ok(MrHandle(1))
    }
    fn reg_mr_dma_buf(
        &mut self,
        ptr: *mut u8,
        size: usize,
        t: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        if size == 666 {
            panic!("fake plugin panics on purpose");
        }
        seen(format!(
            "recv dmabuf {:#x} {size} {t:?} fd {} off {}",
            ptr as usize, d.fd, d.offset
        ));
        Ok(MrHandle(0x80 + d.fd as usize))
    }
    fn dereg_mr(&mut self, _: MrHandle) -> NetResult<()> {
        Ok(())
    }
    unsafe fn irecv(
        &mut self,
        _: *mut u8,
        _: usize,
        _: i32,
        _: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        Ok(None)
    }
    fn iflush(
        &mut self,
        data: *mut u8,
        size: usize,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        if size == 666 {
            panic!("fake plugin panics on purpose");
        }
        seen(format!("iflush {:#x} {size} {mr:?}", data as usize));
        // NCCL's rule: nothing received, nothing to flush.
        Ok((size > 0).then(|| Box::new(Done) as Box<dyn Request>))
    }
    fn irecv_consumed(&mut self, n: usize) -> NetResult<()> {
        seen(format!("consumed {n}"));
        Ok(())
    }
}

/// A network that keeps every default of the trait (as net-socket does).
struct Bare;

impl SendComm for Bare {
    fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrType) -> NetResult<MrHandle> {
        Ok(MrHandle(1))
    }
    fn dereg_mr(&mut self, _: MrHandle) -> NetResult<()> {
        Ok(())
    }
    unsafe fn isend(
        &mut self,
        _: *const u8,
        _: usize,
        _: i32,
        _: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        Ok(None)
    }
}

impl RecvComm for Bare {
    fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrType) -> NetResult<MrHandle> {
        Ok(MrHandle(1))
    }
    fn dereg_mr(&mut self, _: MrHandle) -> NetResult<()> {
        Ok(())
    }
    unsafe fn irecv(
        &mut self,
        _: *mut u8,
        _: usize,
        _: i32,
        _: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        Ok(None)
    }
}

/// The vtables are generic over a provider; these entries never reach it.
struct P;
impl Provider for P {
    fn cell() -> &'static OnceLock<Result<Box<dyn Net>, NetError>> {
        static CELL: OnceLock<Result<Box<dyn Net>, NetError>> = OnceLock::new();
        &CELL
    }
    fn make() -> NetResult<Box<dyn Net>> {
        Err(NetError::Internal("not used by these tests".into()))
    }
    const NAME: &'static [u8] = b"test\0";
    const IRECV_CONSUMED: bool = true;
}

/// A provider that keeps the default: no `irecvConsumed` in its vtables.
struct Plain;
impl Provider for Plain {
    fn cell() -> &'static OnceLock<Result<Box<dyn Net>, NetError>> {
        P::cell()
    }
    fn make() -> NetResult<Box<dyn Net>> {
        P::make()
    }
    const NAME: &'static [u8] = b"plain\0";
}

#[test]
fn irecv_consumed_is_null_unless_the_network_asks() {
    assert!(net::v8::exported::<Plain>().irecv_consumed.is_none());
    assert!(net::v9::exported::<Plain>().irecv_consumed.is_none());
    assert!(net::v10::exported::<Plain>().irecv_consumed.is_none());
    assert!(net::v11::exported::<Plain>().irecv_consumed.is_none());
    assert!(vtable::<Plain>().irecv_consumed.is_none());
    assert!(vtable::<P>().irecv_consumed.is_some());
}

type RegDmaBuf = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    usize,
    c_int,
    u64,
    c_int,
    *mut *mut c_void,
) -> i32;
type Iflush = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    *mut *mut c_void,
    *mut c_int,
    *mut *mut c_void,
    *mut *mut c_void,
) -> i32;
type GetDeviceMr = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> i32;
type IrecvConsumed = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> i32;
type Test = unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> i32;
type Close = unsafe extern "C" fn(*mut c_void) -> i32;

/// One exported version's entries under test.
struct Entries {
    version: &'static str,
    reg_mr_dma_buf: RegDmaBuf,
    iflush: Iflush,
    get_device_mr: GetDeviceMr,
    irecv_consumed: IrecvConsumed,
    test: Test,
    close_send: Close,
    close_recv: Close,
}

macro_rules! entries {
    ($version:literal, $vt:expr) => {{
        let v = $vt;
        Entries {
            version: $version,
            reg_mr_dma_buf: v.reg_mr_dma_buf.expect("regMrDmaBuf set"),
            iflush: v.iflush.expect("iflush set"),
            get_device_mr: v.get_device_mr.expect("getDeviceMr set"),
            irecv_consumed: v.irecv_consumed.expect("irecvConsumed set"),
            test: v.test.expect("test set"),
            close_send: v.close_send.expect("closeSend set"),
            close_recv: v.close_recv.expect("closeRecv set"),
        }
    }};
}

fn versions() -> [Entries; 5] {
    [
        entries!("v8", net::v8::exported::<P>()),
        entries!("v9", net::v9::exported::<P>()),
        entries!("v10", net::v10::exported::<P>()),
        entries!("v11", net::v11::exported::<P>()),
        entries!("v12", vtable::<P>()),
    ]
}

fn recv_comm(r: impl RecvComm + 'static) -> *mut c_void {
    out_comm(Comm::Recv(Box::new(r)))
}

fn send_comm(s: impl SendComm + 'static) -> *mut c_void {
    out_comm(Comm::Send(Box::new(s)))
}

/// Calls `iflush` with one buffer as NCCL does; the result code and the request.
///
/// # Safety
/// `c` is NULL or a comm from `recv_comm`/`send_comm`, not closed.
unsafe fn flush(e: &Entries, c: *mut c_void, size: c_int, mh: *mut c_void) -> (i32, *mut c_void) {
    let mut data = 0x1000 as *mut c_void;
    let (mut sizes, mut mhs) = (size, mh);
    let mut req = 0xdead as *mut c_void;
    // SAFETY: arrays of one entry and an out-pointer, all live for the call.
    let rc = unsafe { (e.iflush)(c, 1, &mut data, &mut sizes, &mut mhs, &mut req) };
    (rc, req)
}

#[test]
fn iflush_reaches_the_plugin_through_every_version() {
    let _g = SERIAL.lock().unwrap();
    for e in versions() {
        let c = recv_comm(Full);
        take_seen();
        // SAFETY: `c` is a live receive comm.
        let (rc, req) = unsafe { flush(&e, c, 256, 0x7 as *mut c_void) };
        assert_eq!(rc, NCCL_SUCCESS, "{}", e.version);
        assert!(!req.is_null(), "{}: a flush to wait for", e.version);
        assert_eq!(
            take_seen(),
            vec!["iflush 0x1000 256 Some(MrHandle(7))".to_string()],
            "{}",
            e.version
        );
        let (mut done, mut size) = (0, -1);
        // SAFETY: `req` is the request iflush returned; test frees it when done.
        assert_eq!(unsafe { (e.test)(req, &mut done, &mut size) }, NCCL_SUCCESS);
        assert_eq!((done, size), (1, 0), "{}", e.version);
        // Nothing received: NULL request, which NCCL reads as "flushed".
        // SAFETY: as above.
        let (rc, req) = unsafe { flush(&e, c, 0, null_mut()) };
        assert_eq!((rc, req), (NCCL_SUCCESS, null_mut()), "{}", e.version);
        assert_eq!(take_seen(), vec!["iflush 0x1000 0 None".to_string()]);
        // SAFETY: closes the comm made above, once.
        assert_eq!(unsafe { (e.close_recv)(c) }, NCCL_SUCCESS);
    }
}

#[test]
fn iflush_bad_arguments_are_error_codes() {
    for e in versions() {
        let c = recv_comm(Full);
        let s = send_comm(Full);
        let v = e.version;
        let mut data = 0x1000 as *mut c_void;
        let mut size: c_int = 8;
        let mut mh = null_mut();
        let mut req = 0xdead as *mut c_void;
        // SAFETY: every pointer is NULL or valid for the call; the glue must
        // refuse the NULL ones before reading them.
        unsafe {
            let f = e.iflush;
            assert_eq!(
                f(null_mut(), 1, &mut data, &mut size, &mut mh, &mut req),
                NCCL_INVALID_ARGUMENT,
                "{v}: NULL comm"
            );
            assert!(req.is_null(), "{v}: no stale request after an error");
            assert_eq!(
                f(c, 1, &mut data, &mut size, &mut mh, null_mut()),
                NCCL_INVALID_ARGUMENT,
                "{v}: NULL request"
            );
            assert_eq!(
                f(c, 1, null_mut(), &mut size, &mut mh, &mut req),
                NCCL_INVALID_ARGUMENT,
                "{v}: NULL data"
            );
            assert_eq!(
                f(c, 1, &mut data, null_mut(), &mut mh, &mut req),
                NCCL_INVALID_ARGUMENT,
                "{v}: NULL sizes"
            );
            assert_eq!(
                f(c, 2, &mut data, &mut size, &mut mh, &mut req),
                NCCL_INVALID_ARGUMENT,
                "{v}: n = 2"
            );
            assert_eq!(
                f(c, 0, &mut data, &mut size, &mut mh, &mut req),
                NCCL_INVALID_ARGUMENT,
                "{v}: n = 0"
            );
            assert_eq!(
                f(s, 1, &mut data, &mut size, &mut mh, &mut req),
                NCCL_INVALID_ARGUMENT,
                "{v}: send comm"
            );
            let mut neg: c_int = -4;
            assert_eq!(
                f(c, 1, &mut data, &mut neg, &mut mh, &mut req),
                NCCL_INVALID_ARGUMENT,
                "{v}: negative size"
            );
            // NULL mhandles is allowed: the plugin gets no handle.
            let _g = SERIAL.lock().unwrap();
            take_seen();
            assert_eq!(
                f(c, 1, &mut data, &mut size, null_mut(), &mut req),
                NCCL_SUCCESS,
                "{v}: NULL mhandles"
            );
            assert_eq!(take_seen(), vec!["iflush 0x1000 8 None".to_string()]);
            let (mut done, mut sz) = (0, 0);
            assert_eq!((e.test)(req, &mut done, &mut sz), NCCL_SUCCESS);
            (e.close_recv)(c);
            (e.close_send)(s);
        }
    }
}

#[test]
fn reg_mr_dma_buf_reaches_both_ends_through_every_version() {
    let _g = SERIAL.lock().unwrap();
    for e in versions() {
        let (c, s) = (recv_comm(Full), send_comm(Full));
        let v = e.version;
        let mut mh = null_mut();
        take_seen();
        // SAFETY: live comms, valid out-pointer.
        unsafe {
            let f = e.reg_mr_dma_buf;
            assert_eq!(
                f(c, 0x2000 as *mut c_void, 4096, 2, 64, 9, &mut mh),
                NCCL_SUCCESS,
                "{v}"
            );
            assert_eq!(mh as usize, 0x89, "{v}: the plugin's handle comes back");
            assert_eq!(
                f(s, 0x3000 as *mut c_void, 100, 2, 0, 5, &mut mh),
                NCCL_SUCCESS,
                "{v}"
            );
            assert_eq!(mh as usize, 0x45, "{v}");
        }
        assert_eq!(
            take_seen(),
            vec![
                "recv dmabuf 0x2000 4096 Cuda fd 9 off 64".to_string(),
                "send dmabuf 0x3000 100 Cuda fd 5 off 0".to_string(),
            ],
            "{v}"
        );
        // SAFETY: closes the comms made above, once each.
        unsafe {
            (e.close_recv)(c);
            (e.close_send)(s);
        }
    }
}

#[test]
fn reg_mr_dma_buf_bad_arguments_are_error_codes() {
    for e in versions() {
        let c = recv_comm(Full);
        let v = e.version;
        let mut mh = 0x11 as *mut c_void;
        let d = 0x2000 as *mut c_void;
        // SAFETY: pointers are NULL or valid; the glue refuses the NULL ones.
        unsafe {
            let f = e.reg_mr_dma_buf;
            assert_eq!(
                f(null_mut(), d, 8, 2, 0, 3, &mut mh),
                NCCL_INVALID_ARGUMENT,
                "{v}: NULL comm"
            );
            assert_eq!(
                f(c, d, 8, 2, 0, 3, null_mut()),
                NCCL_INVALID_ARGUMENT,
                "{v}: NULL mhandle"
            );
            assert_eq!(
                f(c, d, 8, 3, 0, 3, &mut mh),
                NCCL_INVALID_ARGUMENT,
                "{v}: type 3"
            );
            (e.close_recv)(c);
        }
    }
}

#[test]
fn a_network_with_the_defaults_refuses_as_nccl_expects() {
    for e in versions() {
        let (c, s) = (recv_comm(Bare), send_comm(Bare));
        let v = e.version;
        let mut mh = null_mut();
        let mut dptr = null_mut();
        // SAFETY: live comms and out-pointers.
        unsafe {
            // NCCL's socket transport answers iflush with ncclInternalError.
            let (rc, req) = flush(&e, c, 64, 0x11 as *mut c_void);
            assert_eq!((rc, req), (NCCL_INTERNAL_ERROR, null_mut()), "{v}: iflush");
            // dma-buf memory from a network that never offered it: the caller's mistake.
            for comm in [c, s] {
                let rc = (e.reg_mr_dma_buf)(comm, 0x1000 as *mut c_void, 8, 2, 0, 3, &mut mh);
                assert_eq!(rc, NCCL_INVALID_USAGE, "{v}: regMrDmaBuf");
                let rc = (e.get_device_mr)(comm, 0x11 as *mut c_void, &mut dptr);
                assert_eq!(rc, NCCL_INTERNAL_ERROR, "{v}: getDeviceMr");
            }
            // Called by NCCL after every receive whenever present: must succeed.
            assert_eq!(
                (e.irecv_consumed)(c, 1, 0xdead as *mut c_void),
                NCCL_SUCCESS,
                "{v}"
            );
            (e.close_recv)(c);
            (e.close_send)(s);
        }
    }
}

#[test]
fn device_mr_and_irecv_consumed_reach_the_plugin() {
    let _g = SERIAL.lock().unwrap();
    for e in versions() {
        let (c, s) = (recv_comm(Full), send_comm(Full));
        let v = e.version;
        let mut dptr = null_mut();
        take_seen();
        // SAFETY: live comms and out-pointers; the request pointer given to
        // irecvConsumed is never read (it stands for one `test` freed).
        unsafe {
            assert_eq!(
                (e.get_device_mr)(s, 0x21 as *mut c_void, &mut dptr),
                NCCL_SUCCESS,
                "{v}"
            );
            assert_eq!(dptr as usize, 0x42, "{v}");
            assert_eq!(
                (e.get_device_mr)(s, null_mut(), &mut dptr),
                NCCL_INVALID_ARGUMENT,
                "{v}"
            );
            assert_eq!(
                (e.get_device_mr)(s, 0x21 as *mut c_void, null_mut()),
                NCCL_INVALID_ARGUMENT,
                "{v}"
            );
            assert_eq!(
                (e.get_device_mr)(null_mut(), 0x21 as *mut c_void, &mut dptr),
                NCCL_INVALID_ARGUMENT,
                "{v}"
            );
            assert_eq!(
                (e.irecv_consumed)(c, 3, 0xdead as *mut c_void),
                NCCL_SUCCESS,
                "{v}"
            );
            assert_eq!(
                (e.irecv_consumed)(c, -1, null_mut()),
                NCCL_INVALID_ARGUMENT,
                "{v}"
            );
            assert_eq!(
                (e.irecv_consumed)(s, 1, null_mut()),
                NCCL_INVALID_ARGUMENT,
                "{v}: send comm"
            );
            assert_eq!(
                (e.irecv_consumed)(null_mut(), 1, null_mut()),
                NCCL_INVALID_ARGUMENT,
                "{v}"
            );
            (e.close_recv)(c);
            (e.close_send)(s);
        }
        assert_eq!(take_seen(), vec!["consumed 3".to_string()], "{v}");
    }
}

#[test]
fn a_panicking_plugin_gives_an_error_code() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let hook = std::panic::take_hook();
    // Keeps the expected panic messages out of the test output.
    std::panic::set_hook(Box::new(|_| {
        CALLS.fetch_add(1, Ordering::Relaxed);
    }));
    for e in versions() {
        let c = recv_comm(Full);
        let mut mh = null_mut();
        // SAFETY: live comm and out-pointers.
        unsafe {
            let (rc, req) = flush(&e, c, 666, null_mut());
            assert_eq!(
                (rc, req),
                (NCCL_INTERNAL_ERROR, null_mut()),
                "{}",
                e.version
            );
            let rc = (e.reg_mr_dma_buf)(c, 0x1000 as *mut c_void, 666, 2, 0, 3, &mut mh);
            assert_eq!(rc, NCCL_INTERNAL_ERROR, "{}", e.version);
            (e.close_recv)(c);
        }
    }
    std::panic::set_hook(hook);
    assert!(CALLS.load(Ordering::Relaxed) >= 10);
}
