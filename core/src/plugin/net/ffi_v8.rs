//! `ncclNet_v8_t` from a library, as the core's `Net` trait.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Arc;

use libloading::Library;
use oxccl_plugin::ffi::net_v8::{NetV8, PropertiesV8};
use oxccl_plugin::ffi::*;
use oxccl_plugin::{
    ListenComm, MrHandle, Net, NetError, NetHandle, NetProperties, NetResult, PtrType, RecvComm,
    Request, SendComm, NET_HANDLE_MAXSIZE,
};

/// An opened library.
pub struct Lib(Arc<Library>);

pub fn open(name: &str) -> Result<Lib, String> {
    // SAFETY: opening runs the library's initialisers; the user chose it.
    unsafe { Library::new(name) }
        .map(|l| Lib(Arc::new(l)))
        .map_err(|e| e.to_string())
}

impl Lib {
    pub fn has(&self, sym: &str) -> bool {
        // SAFETY: only the address is taken, not called or read.
        unsafe { self.0.get::<*const c_void>(sym.as_bytes()) }.is_ok()
    }
}

/// Shared by every object of the plugin: keeps the library mapped while any lives.
#[derive(Clone)]
struct Vt {
    vt: &'static NetV8,
    _lib: Arc<Library>,
}

fn check(what: &str, r: i32) -> NetResult<()> {
    let m = |k: &str| format!("plugin {what} returned {k} ({r})");
    match r {
        NCCL_SUCCESS => Ok(()),
        NCCL_SYSTEM_ERROR => Err(NetError::System(m("ncclSystemError"))),
        NCCL_INVALID_ARGUMENT => Err(NetError::InvalidArgument(m("ncclInvalidArgument"))),
        NCCL_REMOTE_ERROR => Err(NetError::Remote(m("ncclRemoteError"))),
        _ => Err(NetError::Internal(m("an error"))),
    }
}

fn missing(f: &str) -> NetError {
    NetError::Internal(format!("the plugin's ncclNet_v8 has a NULL {f}"))
}

pub struct CNet {
    v: Vt,
    name: String,
}

// SAFETY: the vtable is immutable static data of the library (function
// pointers and a name); NCCL calls a plugin's device functions from any thread.
unsafe impl Send for Vt {}
// SAFETY: as above.
unsafe impl Sync for Vt {}

impl CNet {
    /// Checks the vtable and calls its `init` (without a logger: NCCL's is
    /// variadic, which stable Rust cannot define; plugins must accept NULL).
    pub fn new(lib: Lib) -> NetResult<CNet> {
        // SAFETY: the symbol is a `ncclNet_v8_t` by the ABI's definition, and
        // lives as long as the library, which `Vt` keeps loaded.
        let vt: &'static NetV8 = unsafe {
            let s = lib
                .0
                .get::<*const NetV8>(b"ncclNetPlugin_v8\0")
                .map_err(|e| NetError::Internal(e.to_string()))?;
            &**s
        };
        let needed = [
            ("init", vt.init.is_some()),
            ("devices", vt.devices.is_some()),
            ("getProperties", vt.get_properties.is_some()),
            ("listen", vt.listen.is_some()),
            ("connect", vt.connect.is_some()),
            ("accept", vt.accept.is_some()),
            ("regMr", vt.reg_mr.is_some()),
            ("deregMr", vt.dereg_mr.is_some()),
            ("isend", vt.isend.is_some()),
            ("irecv", vt.irecv.is_some()),
            ("test", vt.test.is_some()),
            ("closeSend", vt.close_send.is_some()),
            ("closeRecv", vt.close_recv.is_some()),
            ("closeListen", vt.close_listen.is_some()),
        ];
        let null: Vec<&str> = needed
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(n, _)| *n)
            .collect();
        if !null.is_empty() || vt.name.is_null() {
            return Err(NetError::Internal(format!(
                "broken vtable: NULL {}",
                if null.is_empty() {
                    "name".into()
                } else {
                    null.join(", ")
                }
            )));
        }
        // SAFETY: checked non-null above; a NUL-terminated name by the ABI.
        let name = unsafe { CStr::from_ptr(vt.name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `init` checked non-null; NULL logger is documented above.
        check("init", unsafe { (vt.init.expect("checked"))(None) })?;
        Ok(CNet {
            v: Vt { vt, _lib: lib.0 },
            name,
        })
    }
}

impl Net for CNet {
    fn name(&self) -> &str {
        &self.name
    }

    fn devices(&self) -> NetResult<usize> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; function checked non-null at load.
        check("devices", unsafe {
            (self.v.vt.devices.ok_or_else(|| missing("devices"))?)(&mut n)
        })?;
        Ok(n.max(0) as usize)
    }

    fn properties(&self, dev: usize) -> NetResult<NetProperties> {
        // SAFETY: an all-zero PropertiesV8 is valid (null pointers, zeros).
        let mut p: PropertiesV8 = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer.
        check("getProperties", unsafe {
            (self
                .v
                .vt
                .get_properties
                .ok_or_else(|| missing("getProperties"))?)(dev as c_int, &mut p)
        })?;
        let s = |c: *mut std::os::raw::c_char| {
            if c.is_null() {
                String::new()
            } else {
                // SAFETY: the plugin returns NUL-terminated strings it keeps alive.
                unsafe { CStr::from_ptr(c) }.to_string_lossy().into_owned()
            }
        };
        Ok(NetProperties {
            name: s(p.name),
            pci_path: s(p.pci_path),
            guid: p.guid,
            ptr_support: p.ptr_support,
            reg_is_global: p.reg_is_global != 0,
            speed_mbps: p.speed,
            port: p.port,
            latency_us: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            max_p2p_bytes: i32::MAX as usize,
        })
    }

    fn listen(&self, dev: usize) -> NetResult<(NetHandle, Box<dyn ListenComm>)> {
        let mut h = [0u8; NET_HANDLE_MAXSIZE];
        let mut c = null_mut();
        // SAFETY: a 128-byte handle buffer and a valid out-pointer.
        check("listen", unsafe {
            (self.v.vt.listen.ok_or_else(|| missing("listen"))?)(
                dev as c_int,
                h.as_mut_ptr() as *mut c_void,
                &mut c,
            )
        })?;
        Ok((
            h,
            Box::new(CComm {
                v: self.v.clone(),
                c,
                kind: Kind::Listen,
            }),
        ))
    }

    fn connect(&self, dev: usize, handle: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>> {
        let mut c = null_mut();
        let mut dc = null_mut();
        // SAFETY: the handle buffer is 128 bytes, the out-pointers valid.
        check("connect", unsafe {
            (self.v.vt.connect.ok_or_else(|| missing("connect"))?)(
                dev as c_int,
                handle.as_mut_ptr() as *mut c_void,
                &mut c,
                &mut dc,
            )
        })?;
        Ok((!c.is_null()).then(|| {
            Box::new(CComm {
                v: self.v.clone(),
                c,
                kind: Kind::Send,
            }) as Box<dyn SendComm>
        }))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Send,
    Recv,
    Listen,
}

/// A comm of the plugin; closed on drop.
struct CComm {
    v: Vt,
    c: *mut c_void,
    kind: Kind,
}

// SAFETY: NCCL's ABI lets one proxy thread use a comm at a time from any
// thread; the core never shares one comm between threads at once.
unsafe impl Send for CComm {}

impl Drop for CComm {
    fn drop(&mut self) {
        let f = match self.kind {
            Kind::Send => self.v.vt.close_send,
            Kind::Recv => self.v.vt.close_recv,
            Kind::Listen => self.v.vt.close_listen,
        };
        if let Some(f) = f {
            // SAFETY: the comm came from this plugin and is closed once.
            let _ = unsafe { f(self.c) };
        }
    }
}

impl CComm {
    fn reg(&mut self, ptr: *mut u8, size: usize, t: PtrType) -> NetResult<MrHandle> {
        let mut mh = null_mut();
        // SAFETY: valid comm and out-pointer; the memory is the caller's to register.
        check("regMr", unsafe {
            (self.v.vt.reg_mr.ok_or_else(|| missing("regMr"))?)(
                self.c,
                ptr as *mut c_void,
                size,
                t as c_int,
                &mut mh,
            )
        })?;
        Ok(MrHandle(mh as usize))
    }

    fn dereg(&mut self, m: MrHandle) -> NetResult<()> {
        // SAFETY: a handle this comm registered.
        check("deregMr", unsafe {
            (self.v.vt.dereg_mr.ok_or_else(|| missing("deregMr"))?)(self.c, m.0 as *mut c_void)
        })
    }

    fn request(&self, r: *mut c_void) -> Option<Box<dyn Request>> {
        (!r.is_null()).then(|| {
            Box::new(CRequest {
                v: self.v.clone(),
                r,
                done: false,
            }) as Box<dyn Request>
        })
    }
}

impl ListenComm for CComm {
    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        let mut c = null_mut();
        let mut dc = null_mut();
        // SAFETY: our listen comm and valid out-pointers.
        check("accept", unsafe {
            (self.v.vt.accept.ok_or_else(|| missing("accept"))?)(self.c, &mut c, &mut dc)
        })?;
        Ok((!c.is_null()).then(|| {
            Box::new(CComm {
                v: self.v.clone(),
                c,
                kind: Kind::Recv,
            }) as Box<dyn RecvComm>
        }))
    }
}

fn mr(m: Option<MrHandle>) -> *mut c_void {
    m.map_or(null_mut(), |m| m.0 as *mut c_void)
}

fn int_size(size: usize) -> NetResult<c_int> {
    c_int::try_from(size).map_err(|_| {
        NetError::InvalidArgument(format!("{size} bytes exceed ncclNet_v8's int sizes"))
    })
}

impl SendComm for CComm {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, t: PtrType) -> NetResult<MrHandle> {
        self.reg(ptr, size, t)
    }
    fn dereg_mr(&mut self, m: MrHandle) -> NetResult<()> {
        self.dereg(m)
    }
    unsafe fn isend(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        m: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let mut r = null_mut();
        // SAFETY: the caller keeps `data` valid until completion (trait contract).
        check("isend", unsafe {
            (self.v.vt.isend.ok_or_else(|| missing("isend"))?)(
                self.c,
                data as *mut c_void,
                int_size(size)?,
                tag,
                mr(m),
                &mut r,
            )
        })?;
        Ok(self.request(r))
    }
}

impl RecvComm for CComm {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, t: PtrType) -> NetResult<MrHandle> {
        self.reg(ptr, size, t)
    }
    fn dereg_mr(&mut self, m: MrHandle) -> NetResult<()> {
        self.dereg(m)
    }
    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        m: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let (mut d, mut s, mut t, mut mh) = (data as *mut c_void, int_size(size)?, tag, mr(m));
        let mut r = null_mut();
        // SAFETY: one-entry arrays on the stack, read during the call; the
        // buffer stays valid until completion (trait contract).
        check("irecv", unsafe {
            (self.v.vt.irecv.ok_or_else(|| missing("irecv"))?)(
                self.c, 1, &mut d, &mut s, &mut t, &mut mh, &mut r,
            )
        })?;
        Ok(self.request(r))
    }
}

struct CRequest {
    v: Vt,
    r: *mut c_void,
    done: bool,
}

// SAFETY: as for CComm.
unsafe impl Send for CRequest {}

impl Request for CRequest {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        if self.done {
            return Err(NetError::Internal("request tested after completion".into()));
        }
        let (mut done, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: a live request of this plugin; it frees it once done.
        let r = unsafe {
            (self.v.vt.test.ok_or_else(|| missing("test"))?)(self.r, &mut done, &mut size)
        };
        if r != NCCL_SUCCESS {
            self.done = true;
        }
        check("test", r)?;
        if done != 0 {
            self.done = true;
            return Ok(Some(vec![size.max(0) as usize]));
        }
        Ok(None)
    }
}
