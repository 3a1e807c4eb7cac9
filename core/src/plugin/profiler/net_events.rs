//! Events the network defines, reported through the profiler callback the
//! core gives every net plugin at `init` (NCCL's `ncclProfilerCallback`,
//! src/plugin/profiler.cc): with each profiled `isend`/`irecv` the core
//! passes a handle to a [`NetParent`] it owns (the proxy step that posted
//! the operation, its communicator's profiler and the group's activation
//! mask), and the plugin starts `ncclProfileNetPlugin` events under it,
//! updates (`ncclProfilerNetPluginUpdate`) and stops them.
//!
//! A parent is made only when the mask has `NCCL_PROFILE_NET_PLUGIN`;
//! otherwise the plugin gets a NULL handle and reports nothing. The event
//! handle given back to the plugin is the core's own (the profiler's handle
//! with the profiler that made it), so that a stop needs nothing else and
//! may come from any thread, at any time after the start.
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use oxccl_plugin::ffi::profiler::NCCL_PROFILER_NET_PLUGIN_UPDATE;
use oxccl_plugin::ffi::{
    NCCL_INTERNAL_ERROR, NCCL_PROFILER_NET_EVENT_START, NCCL_PROFILER_NET_EVENT_STOP,
    NCCL_PROFILER_NET_EVENT_UPDATE, NCCL_PROFILER_NET_EVENT_UPDATE_AND_STOP, NCCL_SUCCESS,
};
use oxccl_plugin::NetProf;

use super::{Event, Handle, ProfilerComm, StateArgs};

/// What the profiler handle of one network operation points at: NCCL's
/// `ncclProxyEventHandle` (the step's event and, through its sub-args, the
/// rank, context and mask). Boxed, so that its address stays put while the
/// owner moves; the owner keeps it until the operation's request has
/// completed and its step has ended.
pub struct NetParent {
    comm: Arc<ProfilerComm>,
    step: Handle,
    mask: i32,
}

impl NetParent {
    pub fn new(comm: Arc<ProfilerComm>, step: Handle, mask: i32) -> Box<NetParent> {
        Box::new(NetParent { comm, step, mask })
    }

    /// The handle and the core's callback, as a Rust network takes them
    /// (a C plugin gets the handle alone; it was given the callback at
    /// `init`).
    pub fn prof(&self) -> Option<NetProf> {
        let p: *const NetParent = self;
        // SAFETY: `callback` is an `ncclProfilerCallback_t`; `p` points at
        // this boxed parent, which its owner keeps past the request.
        unsafe { NetProf::new(Some(callback), p as *mut c_void) }
    }
}

/// An open net-plugin event: what the plugin's `eHandle` points at.
struct Open {
    comm: Arc<ProfilerComm>,
    h: Handle,
}

/// The callback every net plugin's `init` gets. Never unwinds.
///
/// # Safety
/// As NCCL's: `e_handle` a valid pointer; on start `p_handle` NULL or a
/// handle the core passed with an operation not yet complete; on the others
/// `*e_handle` what the start wrote (or NULL).
pub unsafe extern "C" fn callback(
    e_handle: *mut *mut c_void,
    ty: c_int,
    p_handle: *mut c_void,
    plugin_id: i64,
    ext_data: *mut c_void,
) -> i32 {
    if e_handle.is_null() {
        return NCCL_SUCCESS;
    }
    let run = AssertUnwindSafe(|| {
        if ty == NCCL_PROFILER_NET_EVENT_START {
            // SAFETY: a valid out-pointer (checked non-NULL above).
            unsafe { *e_handle = std::ptr::null_mut() };
            if p_handle.is_null() {
                return;
            }
            // SAFETY: the core's parent, alive until the request completes.
            let p = unsafe { &*(p_handle as *const NetParent) };
            let ev = Event::NetPlugin {
                parent: p.step,
                id: plugin_id,
                data: ext_data,
            };
            let h = p.comm.start(p.mask, ev);
            if !h.0.is_null() {
                let open = Box::new(Open {
                    comm: p.comm.clone(),
                    h,
                });
                // SAFETY: as above.
                unsafe { *e_handle = Box::into_raw(open) as *mut c_void };
            }
            return;
        }
        // SAFETY: the plugin passes back what the start wrote.
        let open = unsafe { *e_handle } as *mut Open;
        if open.is_null() {
            return;
        }
        let update =
            ty == NCCL_PROFILER_NET_EVENT_UPDATE || ty == NCCL_PROFILER_NET_EVENT_UPDATE_AND_STOP;
        let stop =
            ty == NCCL_PROFILER_NET_EVENT_STOP || ty == NCCL_PROFILER_NET_EVENT_UPDATE_AND_STOP;
        if update {
            // SAFETY: a live `Open` (stops clear the plugin's handle).
            let o = unsafe { &*open };
            let args = StateArgs::NetPlugin { data: ext_data };
            o.comm.record(o.h, NCCL_PROFILER_NET_PLUGIN_UPDATE, args);
        }
        if stop {
            // SAFETY: made by `Box::into_raw` at the start, freed once: the
            // plugin's handle is cleared, so a second stop finds NULL.
            let o = unsafe { Box::from_raw(open) };
            // SAFETY: as above.
            unsafe { *e_handle = std::ptr::null_mut() };
            o.comm.stop(o.h);
        }
    });
    match catch_unwind(run) {
        Ok(()) => NCCL_SUCCESS,
        Err(_) => NCCL_INTERNAL_ERROR,
    }
}
