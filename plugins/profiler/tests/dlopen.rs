//! Loads the built `liboxccl_profiler.so` as NCCL does and drives it through
//! the C vtables of several versions: init, collective events started and
//! stopped on two threads, finalize; the trace must parse as JSON with one
//! complete event per collective.
#![allow(unsafe_code)]

mod common;

use std::os::raw::{c_int, c_void};
use std::path::{Path, PathBuf};

use oxccl_plugin::ffi::profiler::{v1, v4, v5, NCCL_PROFILE_COLL};
use oxccl_plugin::ffi::types::NCCL_SUCCESS;

/// Runs `per_thread` on two threads at once, `n` times each.
fn on_two_threads(n: u64, per_thread: impl Fn(u64) + Sync) {
    std::thread::scope(|s| {
        for t in 0..2 {
            let f = &per_thread;
            s.spawn(move || (0..n).for_each(|i| f(t * 100 + i)));
        }
    });
}

fn completes(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect("trace is JSON");
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .cloned()
        .collect()
}

fn trace_of(dir: &Path, rank: i32) -> PathBuf {
    let suffix = format!("-{}-rank{rank}.json", std::process::id());
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(&suffix))
        .unwrap_or_else(|| panic!("no trace of rank {rank} in {dir:?}"))
}

#[test]
fn v5_v4_v1_write_one_complete_event_per_collective() {
    let dir = std::env::temp_dir().join(format!("oxccl-prof-dl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The only test in this binary, so setting the environment is race-free.
    std::env::set_var("OXCCL_PROFILER_DIR", &dir);
    std::env::remove_var("NCCL_PROFILE_EVENT_MASK");

    // SAFETY: our own library; its initialisers only set up statics.
    let lib = unsafe { libloading::Library::new(common::library()) }.unwrap();

    // v5: rank 0.
    // SAFETY: the symbol is a `ncclProfiler_v5_t` static (layout-tested in the sdk).
    let p5: &v5::ProfilerV5 = unsafe { &**lib.get::<*const v5::ProfilerV5>(v5::SYMBOL).unwrap() };
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let mut mask: c_int = 0;
    // SAFETY: valid out-pointers, a static name, NULL logger.
    let rc = unsafe { p5.init.unwrap()(&mut ctx, 7, &mut mask, c"c0".as_ptr(), 1, 2, 0, None) };
    assert_eq!(rc, NCCL_SUCCESS);
    assert_eq!(mask, 7, "default mask is group|coll|p2p");
    let ctx5 = ctx as usize;
    // Function pointers only: the vtable holds a raw name pointer (not Sync).
    let (start5, stop5) = (p5.start_event.unwrap(), p5.stop_event.unwrap());
    on_two_threads(3, |seq| {
        // SAFETY: all-zero is a valid `ncclProfilerEventDescr_v5_t` (NULL
        // pointers, zero numbers).
        let mut d: v5::EventDescrV5 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_COLL as u64;
        d.rank = 0;
        d.detail.coll = v5::CollDescrV5 {
            seq_number: seq,
            func: c"AllReduce".as_ptr(),
            send_buff: std::ptr::null(),
            recv_buff: std::ptr::null_mut(),
            count: 256,
            root: 0,
            datatype: c"ncclFloat32".as_ptr(),
            n_channels: 2,
            n_warps: 8,
            algo: c"Ring".as_ptr(),
            proto: c"Simple".as_ptr(),
            parent_group: std::ptr::null_mut(),
        };
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context from init; `d` lives for the call.
        let rc = unsafe { start5(ctx5 as *mut c_void, &mut h, &mut d) };
        assert_eq!(rc, NCCL_SUCCESS);
        assert!(!h.is_null());
        // SAFETY: the handle from start, stopped once.
        assert_eq!(unsafe { stop5(h) }, NCCL_SUCCESS);
    });
    // SAFETY: the context from init, finalized once.
    assert_eq!(unsafe { p5.finalize.unwrap()(ctx) }, NCCL_SUCCESS);
    let xs = completes(&trace_of(&dir, 0));
    assert_eq!(xs.len(), 6, "{xs:?}");
    assert!(xs.iter().all(|e| e["name"] == "AllReduce" && e["pid"] == 0));
    assert!(xs.iter().all(|e| e["args"]["count"] == 256));
    assert_eq!(
        xs.iter()
            .map(|e| e["tid"].as_u64().unwrap())
            .collect::<std::collections::HashSet<_>>()
            .len(),
        2
    );

    // v4: rank 1, with a state update in between.
    // SAFETY: the symbol is a `ncclProfiler_v4_t` static.
    let p4: &v4::ProfilerV4 = unsafe { &**lib.get::<*const v4::ProfilerV4>(v4::SYMBOL).unwrap() };
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointers, NULL name and logger.
    let rc = unsafe { p4.init.unwrap()(&mut ctx, &mut mask, std::ptr::null(), 5, 1, 2, 1, None) };
    assert_eq!(rc, NCCL_SUCCESS);
    let ctx4 = ctx as usize;
    // Function pointers only: the vtable holds a raw name pointer (not Sync).
    let (start4, stop4, record4) = (
        p4.start_event.unwrap(),
        p4.stop_event.unwrap(),
        p4.record_event_state.unwrap(),
    );
    on_two_threads(2, |seq| {
        // SAFETY: all-zero is a valid v4 descriptor.
        let mut d: v4::EventDescrV4 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_COLL as u8;
        d.rank = 1;
        // Writing a union field is safe; `ty` says which member NCCL fills.
        d.detail.coll.seq_number = seq;
        d.detail.coll.func = c"Broadcast".as_ptr();
        d.detail.coll.count = 10;
        d.detail.coll.datatype = c"ncclInt8".as_ptr();
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context from init; `d` lives for the call.
        let rc = unsafe { start4(ctx4 as *mut c_void, &mut h, &mut d) };
        assert_eq!(rc, NCCL_SUCCESS);
        // SAFETY: a live handle; NULL state arguments are allowed.
        let rc = unsafe { record4(h, 0, std::ptr::null_mut()) };
        assert_eq!(rc, NCCL_SUCCESS);
        // SAFETY: the handle from start, stopped once.
        assert_eq!(unsafe { stop4(h) }, NCCL_SUCCESS);
    });
    // SAFETY: the context from init, finalized once.
    assert_eq!(unsafe { p4.finalize.unwrap()(ctx) }, NCCL_SUCCESS);
    let xs = completes(&trace_of(&dir, 1));
    assert_eq!(xs.len(), 4);
    assert!(xs.iter().all(|e| e["name"] == "Broadcast" && e["pid"] == 1));

    // v1: no rank at init (taken from the events), numeric func and type.
    // SAFETY: the symbol is a `ncclProfiler_v1_t` static.
    let p1: &v1::ProfilerV1 = unsafe { &**lib.get::<*const v1::ProfilerV1>(v1::SYMBOL).unwrap() };
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointers.
    let rc = unsafe { p1.init.unwrap()(&mut ctx, &mut mask) };
    assert_eq!(rc, NCCL_SUCCESS);
    let ctx1 = ctx as usize;
    // Function pointers only: the vtable holds a raw name pointer (not Sync).
    let (start1, stop1) = (p1.start_event.unwrap(), p1.stop_event.unwrap());
    on_two_threads(1, |seq| {
        // SAFETY: all-zero is a valid v1 descriptor.
        let mut d: v1::EventDescrV1 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_COLL as u8;
        d.rank = 2;
        // Writing a union field is safe; `ty` says which member NCCL fills.
        d.detail.coll.seq_number = seq;
        d.detail.coll.func = 2; // ncclFuncAllGather
        d.detail.coll.datatype = 9; // ncclBfloat16
        d.detail.coll.count = 4;
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context from init; `d` lives for the call.
        let rc = unsafe { start1(ctx1 as *mut c_void, &mut h, &mut d) };
        assert_eq!(rc, NCCL_SUCCESS);
        // SAFETY: the handle from start, stopped once.
        assert_eq!(unsafe { stop1(h) }, NCCL_SUCCESS);
    });
    // SAFETY: the context from init, finalized once.
    assert_eq!(unsafe { p1.finalize.unwrap()(ctx) }, NCCL_SUCCESS);
    let xs = completes(&trace_of(&dir, 2));
    assert_eq!(xs.len(), 2);
    assert!(xs
        .iter()
        .all(|e| e["name"] == "AllGather" && e["args"]["dtype"] == "ncclBfloat16"));

    // NULL arguments give an error code, not a crash.
    // SAFETY: NULL pointers are what is being tested.
    let rc = unsafe {
        p5.start_event.unwrap()(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_ne!(rc, NCCL_SUCCESS);
    std::fs::remove_dir_all(&dir).ok();
}
