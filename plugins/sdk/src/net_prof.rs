//! Events a network defines and reports to the profiler (NCCL's
//! `ncclProfilerCallback_t`, net v10 and later): the caller of `isend` /
//! `irecv` passes a profiler handle with each operation, and the network
//! starts its own events under it (NCCL's socket transport: one per socket
//! transfer, [`crate::profiler::abi::net_socket_v1`]), updates and stops
//! them. The profiler plugin receives them as `ncclProfileNetPlugin` events,
//! children of the proxy step that posted the operation.
//!
//! A network gets a [`NetProf`] through [`crate::SendComm::isend_profiled`]
//! / [`crate::RecvComm::irecv_profiled`]: `None` when nobody asked for
//! network events (the profiler's activation mask lacks
//! `NCCL_PROFILE_NET_PLUGIN`), which costs the network nothing.
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_void};

use crate::ffi::types::{
    ProfilerCallback, NCCL_PROFILER_NET_EVENT_START, NCCL_PROFILER_NET_EVENT_STOP,
    NCCL_PROFILER_NET_EVENT_UPDATE, NCCL_PROFILER_NET_EVENT_UPDATE_AND_STOP,
};

/// The C type of a profiler callback (non-NULL).
pub type CallbackFn = unsafe extern "C" fn(
    e_handle: *mut *mut c_void,
    ty: c_int,
    p_handle: *mut c_void,
    plugin_id: i64,
    ext_data: *mut c_void,
) -> i32;

/// The profiler callback and the handle of one operation: what a network
/// needs to report events of that operation.
///
/// The handle is valid until the operation's request has been reported
/// complete by `test` (the ABI's promise; oxccl's core keeps it longer, until
/// the proxy step above it ends): start events of the operation before
/// that. Updates and stops go through the [`NetEvent`] and need no handle.
#[derive(Clone, Copy, Debug)]
pub struct NetProf {
    cb: CallbackFn,
    phandle: *mut c_void,
}

// SAFETY: the callback is a plain function that NCCL (and oxccl) call from
// any thread, the network's helper threads included; the handle is opaque
// here and only passed back to it.
unsafe impl Send for NetProf {}
// SAFETY: as above; nothing is reached through `&NetProf` but the callback.
unsafe impl Sync for NetProf {}

impl NetProf {
    /// `None` when either half is NULL (no profiler, or this operation is
    /// not profiled).
    ///
    /// # Safety
    /// `cb` is an `ncclProfilerCallback_t`, and `phandle` the handle its
    /// owner passed with one `isend`/`irecv`, valid as [`NetProf`] says.
    pub unsafe fn new(cb: ProfilerCallback, phandle: *mut c_void) -> Option<NetProf> {
        let cb = cb?;
        (!phandle.is_null()).then_some(NetProf { cb, phandle })
    }

    /// The callback, for a network that passes the operation on to a C
    /// plugin (which was given the callback at its `init`).
    pub fn callback(&self) -> CallbackFn {
        self.cb
    }

    /// The operation's handle, for a C plugin's `isend`/`irecv`.
    pub fn phandle(&self) -> *mut c_void {
        self.phandle
    }

    /// Starts an event `id` (`NCCL_PROFILER_NET_TYPE_*` | its layout's
    /// version) described by `data`, which the profiler reads during the
    /// call. `None` when the profiler did not start it.
    pub fn start<T>(&self, id: i64, data: &T) -> Option<NetEvent> {
        let mut h: *mut c_void = std::ptr::null_mut();
        let d = data as *const T as *mut c_void;
        // SAFETY: `phandle` is valid (the constructor's contract); `h` is a
        // valid out-pointer and `data` lives for the call.
        unsafe { (self.cb)(&mut h, NCCL_PROFILER_NET_EVENT_START, self.phandle, id, d) };
        (!h.is_null()).then_some(NetEvent { cb: self.cb, h })
    }
}

/// A started network event: stopped by [`NetEvent::stop`] or when dropped.
#[derive(Debug)]
pub struct NetEvent {
    cb: CallbackFn,
    h: *mut c_void,
}

// SAFETY: the event handle is the profiler's, usable from any thread (NCCL's
// socket transport stops events on its helper threads).
unsafe impl Send for NetEvent {}

impl NetEvent {
    fn call(&mut self, ty: c_int, data: *mut c_void) {
        if self.h.is_null() {
            return;
        }
        // SAFETY: `h` is the handle the callback's start wrote, not yet
        // stopped; `data` lives for the call.
        unsafe { (self.cb)(&mut self.h, ty, std::ptr::null_mut(), 0, data) };
    }

    /// Records a new state of the event, described by `data`
    /// (`ncclProfilerNetPluginUpdate`).
    pub fn update<T>(&mut self, data: &T) {
        self.call(
            NCCL_PROFILER_NET_EVENT_UPDATE,
            data as *const T as *mut c_void,
        );
    }

    /// Updates, then stops.
    pub fn update_and_stop<T>(mut self, data: &T) {
        self.call(
            NCCL_PROFILER_NET_EVENT_UPDATE_AND_STOP,
            data as *const T as *mut c_void,
        );
        self.h = std::ptr::null_mut();
    }

    pub fn stop(self) {}
}

impl Drop for NetEvent {
    fn drop(&mut self) {
        self.call(NCCL_PROFILER_NET_EVENT_STOP, std::ptr::null_mut());
        self.h = std::ptr::null_mut();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// (type, phandle, id, first byte of data) of every call.
    static CALLS: Mutex<Vec<(c_int, usize, i64, u8)>> = Mutex::new(Vec::new());
    static EV: u8 = 0;

    unsafe extern "C" fn cb(
        e: *mut *mut c_void,
        ty: c_int,
        p: *mut c_void,
        id: i64,
        data: *mut c_void,
    ) -> i32 {
        let first = if data.is_null() {
            0
        } else {
            // SAFETY: the tests pass a u8.
            unsafe { *(data as *const u8) }
        };
        CALLS.lock().unwrap().push((ty, p as usize, id, first));
        if ty == NCCL_PROFILER_NET_EVENT_START {
            // SAFETY: a valid out-pointer from NetProf::start.
            unsafe { *e = &EV as *const u8 as *mut c_void };
        }
        0
    }

    #[test]
    fn start_update_stop_reach_the_callback_once_each() {
        // SAFETY: a test callback and a handle it never dereferences.
        assert!(unsafe { NetProf::new(Some(cb), std::ptr::null_mut()) }.is_none());
        // SAFETY: as above.
        assert!(unsafe { NetProf::new(None, 0x10 as *mut c_void) }.is_none());
        // SAFETY: as above.
        let p = unsafe { NetProf::new(Some(cb), 0x10 as *mut c_void) }.unwrap();
        let mut e = p.start(7, &1u8).unwrap();
        e.update(&2u8);
        e.stop();
        p.start(8, &3u8).unwrap().update_and_stop(&4u8);
        drop(p.start(9, &5u8));
        let calls = CALLS.lock().unwrap().clone();
        assert_eq!(
            calls,
            [
                (0, 0x10, 7, 1),
                (2, 0, 0, 2),
                (1, 0, 0, 0),
                (0, 0x10, 8, 3),
                (3, 0, 0, 4),
                (0, 0x10, 9, 5),
                (1, 0, 0, 0),
            ]
        );
    }
}
