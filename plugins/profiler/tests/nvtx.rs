//! NVTX ranges reach an NVTX3 tool: `nvtx_tool.c`, a stand-in for Nsight
//! Systems' injection library, is built here with `cc` and named by
//! `NVTX_INJECTION64_PATH`, the way `nsys` attaches; a child process (NVTX
//! initialises once per process) drives `liboxccl_profiler.so` through its
//! v5 C ABI as NCCL does, and the tool's log must hold the `oxccl` domain
//! and one start and one end, with matching ids and the event's name, for
//! every group, collective and p2p operation. Without the variable the tool
//! is never loaded. This proves the NVTX3 path; Nsight Systems itself is not
//! run here.
#![allow(unsafe_code)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::os::raw::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

use oxccl_plugin::ffi::profiler::{v5, NCCL_PROFILE_COLL, NCCL_PROFILE_GROUP, NCCL_PROFILE_P2P};
use oxccl_plugin::ffi::types::NCCL_SUCCESS;

const CHILD: &str = "OXCCL_NVTX_TEST_CHILD";
/// Where the tool writes its log (read by the tool, see nvtx_tool.c).
const LOG: &str = "OXCCL_NVTX_LOG";
const INJECTION: &str = "NVTX_INJECTION64_PATH";
const TOOL_NAME: &str = "liboxccl_nvtx_tool.so";

fn is_child(name: &str) -> bool {
    std::env::var(CHILD).ok().as_deref() == Some(name)
}

/// A fresh directory per test (they run in parallel), holding the tool.
fn build_tool(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("oxccl-nvtx-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nvtx_tool.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(dir.join(TOOL_NAME))
        .arg(&src)
        .arg("-lpthread")
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e} (install gcc)"));
    assert!(
        out.status.success(),
        "compiling {src:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Runs test `name` again as a child: with the tool injected, or with the
/// variable removed. Returns the child's stdout.
fn run_child(name: &str, dir: &Path, inject: bool) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, name)
        .env(LOG, dir.join("nvtx.log"))
        .env("OXCCL_PROFILER_DIR", dir)
        .env_remove("NCCL_PROFILE_EVENT_MASK")
        .env_remove("NSYS_PROFILING_SESSION_ID");
    if inject {
        cmd.env(INJECTION, dir.join(TOOL_NAME));
    } else {
        cmd.env_remove(INJECTION);
    }
    let out = cmd.output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "child {name} failed:\n{so}\n{se}");
    so
}

/// A handle crossing threads (raw pointers are not `Send`).
#[derive(Clone, Copy)]
struct Handle(usize);

/// The plugin's v5 vtable, as NCCL holds it.
struct Plugin {
    ctx: usize,
    start: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut v5::EventDescrV5) -> i32,
    stop: unsafe extern "C" fn(*mut c_void) -> i32,
}

impl Plugin {
    fn start(&self, ty: c_int, func: &'static std::ffi::CStr, parent: Handle) -> Handle {
        // SAFETY: all-zero is a valid `ncclProfilerEventDescr_v5_t` (NULL
        // pointers, zero numbers).
        let mut d: v5::EventDescrV5 = unsafe { std::mem::zeroed() };
        d.ty = ty as u64;
        d.rank = 0;
        d.parent_obj = parent.0 as *mut c_void;
        match ty {
            NCCL_PROFILE_COLL => {
                d.detail.coll = v5::CollDescrV5 {
                    seq_number: 0,
                    func: func.as_ptr(),
                    send_buff: std::ptr::null(),
                    recv_buff: std::ptr::null_mut(),
                    count: 64,
                    root: 0,
                    datatype: c"ncclFloat32".as_ptr(),
                    n_channels: 1,
                    n_warps: 8,
                    algo: c"Ring".as_ptr(),
                    proto: c"Simple".as_ptr(),
                    parent_group: parent.0 as *mut c_void,
                }
            }
            NCCL_PROFILE_P2P => {
                d.detail.p2p = v5::P2pDescrV5 {
                    func: func.as_ptr(),
                    buff: std::ptr::null_mut(),
                    datatype: c"ncclInt8".as_ptr(),
                    count: 64,
                    peer: 1,
                    n_channels: 1,
                    parent_group: parent.0 as *mut c_void,
                }
            }
            _ => {}
        }
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context from init; `d` lives for the call.
        let rc = unsafe { (self.start)(self.ctx as *mut c_void, &mut h, &mut d) };
        assert_eq!(rc, NCCL_SUCCESS);
        assert!(!h.is_null(), "{func:?} not tracked");
        Handle(h as usize)
    }

    fn stop(&self, h: Handle) {
        // SAFETY: a handle from start, stopped once.
        assert_eq!(unsafe { (self.stop)(h.0 as *mut c_void) }, NCCL_SUCCESS);
    }
}

/// The names every run below starts, with how many times.
const EXPECTED: &[(&str, usize)] = &[
    ("Group", 2),
    ("AllReduce", 4),
    ("Broadcast", 1),
    ("AllGather", 1),
    ("ReduceScatter", 1),
    ("Reduce", 1),
    ("Send", 1),
    ("Recv", 1),
    // Not a name NCCL uses: the range gets a plain string, not a
    // registered one.
    ("Custom", 1),
];

/// The child's work: one communicator through the v5 C ABI, two groups
/// on two threads, half the operations of the first stopped on another
/// thread than the one that started them (as NCCL may do). Prints whether
/// the tool library is mapped into the process at the end.
fn drive() {
    // SAFETY: our own library; its initialisers only set up statics.
    let lib = unsafe { libloading::Library::new(common::library()) }.unwrap();
    // SAFETY: the symbol is a `ncclProfiler_v5_t` static (layout-tested in the sdk).
    let p5: &v5::ProfilerV5 = unsafe { &**lib.get::<*const v5::ProfilerV5>(v5::SYMBOL).unwrap() };
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let mut mask: c_int = 0;
    // SAFETY: valid out-pointers, a static name, NULL logger.
    let rc = unsafe { p5.init.unwrap()(&mut ctx, 3, &mut mask, c"nvtx".as_ptr(), 1, 2, 0, None) };
    assert_eq!(rc, NCCL_SUCCESS);
    let p = Plugin {
        ctx: ctx as usize,
        start: p5.start_event.unwrap(),
        stop: p5.stop_event.unwrap(),
    };
    let none = Handle(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let g = p.start(NCCL_PROFILE_GROUP, c"Group", none);
            for _ in 0..3 {
                let c = p.start(NCCL_PROFILE_COLL, c"AllReduce", g);
                p.stop(c);
            }
            p.stop(g);
        });
        let g = p.start(NCCL_PROFILE_GROUP, c"Group", none);
        let ops: Vec<Handle> = [
            (NCCL_PROFILE_COLL, c"AllReduce"),
            (NCCL_PROFILE_COLL, c"Broadcast"),
            (NCCL_PROFILE_COLL, c"AllGather"),
            (NCCL_PROFILE_COLL, c"ReduceScatter"),
            (NCCL_PROFILE_COLL, c"Reduce"),
            (NCCL_PROFILE_P2P, c"Send"),
            (NCCL_PROFILE_P2P, c"Recv"),
            (NCCL_PROFILE_COLL, c"Custom"),
        ]
        .into_iter()
        .map(|(ty, f)| p.start(ty, f, g))
        .collect();
        let (there, here) = ops.split_at(ops.len() / 2);
        let there = there.to_vec();
        let p = &p;
        s.spawn(move || there.into_iter().for_each(|h| p.stop(h)))
            .join()
            .unwrap();
        here.iter().for_each(|&h| p.stop(h));
        p.stop(g);
    });
    // SAFETY: the context from init, finalized once.
    assert_eq!(unsafe { p5.finalize.unwrap()(ctx) }, NCCL_SUCCESS);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    println!("TOOL_MAPPED={}", maps.contains(TOOL_NAME));
}

/// One `start` line of the tool's log.
#[derive(Debug)]
struct Start {
    domain: String,
    kind: String,
    name: String,
}

#[test]
fn ranges_reach_an_nvtx3_tool() {
    let name = "ranges_reach_an_nvtx3_tool";
    if is_child(name) {
        return drive();
    }
    let dir = build_tool(name);
    let out = run_child(name, &dir, true);
    assert!(out.contains("TOOL_MAPPED=true"), "{out}");
    let log = std::fs::read_to_string(dir.join("nvtx.log")).expect("the tool wrote its log");
    let lines: Vec<Vec<&str>> = log.lines().map(|l| l.split(' ').collect()).collect();
    let kind = |k: &'static str| lines.iter().filter(move |l| l[0] == k);

    assert_eq!(kind("init").count(), 1, "{log}");
    assert_eq!(
        kind("domain").map(|l| l[1]).collect::<Vec<_>>(),
        ["oxccl"],
        "one domain, oxccl:\n{log}"
    );
    // Start/end only: no push/pop, nothing outside the domain.
    for other in [
        "push",
        "pop",
        "global-start",
        "global-end",
        "init-incomplete",
    ] {
        assert_eq!(kind(other).count(), 0, "{other} in:\n{log}");
    }
    let registered: Vec<&str> = kind("string").map(|l| l[2]).collect();
    assert!(kind("string").all(|l| l[1] == "oxccl"), "{log}");

    let mut starts: HashMap<u64, Start> = HashMap::new();
    for l in kind("start") {
        let id: u64 = l[4].parse().unwrap();
        let s = Start {
            domain: l[1].into(),
            kind: l[2].into(),
            name: l[3].into(),
        };
        assert!(
            starts.insert(id, s).is_none(),
            "range id {id} started twice"
        );
    }
    let mut ended: HashMap<u64, usize> = HashMap::new();
    for l in kind("end") {
        assert_eq!(l[1], "oxccl", "{log}");
        *ended.entry(l[2].parse().unwrap()).or_default() += 1;
    }
    for (id, s) in &starts {
        assert_eq!(s.domain, "oxccl", "{log}");
        assert_eq!(
            ended.get(id),
            Some(&1),
            "range {id} ({}) ended once",
            s.name
        );
        let expect = if s.name == "Custom" {
            "ascii"
        } else {
            "registered"
        };
        assert_eq!(s.kind, expect, "{}: {log}", s.name);
        if s.kind == "registered" {
            assert!(registered.contains(&s.name.as_str()), "{}", s.name);
        }
    }
    assert_eq!(ended.len(), starts.len(), "an end without a start:\n{log}");

    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for s in starts.values() {
        *names.entry(s.name.as_str()).or_default() += 1;
    }
    let expected: BTreeMap<&str, usize> = EXPECTED.iter().copied().collect();
    assert_eq!(names, expected, "{log}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn without_the_variable_no_tool_is_loaded() {
    let name = "without_the_variable_no_tool_is_loaded";
    if is_child(name) {
        return drive();
    }
    let dir = build_tool(name);
    let out = run_child(name, &dir, false);
    assert!(out.contains("TOOL_MAPPED=false"), "{out}");
    assert!(
        !dir.join("nvtx.log").exists(),
        "the tool wrote a log though NVTX_INJECTION64_PATH was unset"
    );
    std::fs::remove_dir_all(&dir).ok();
}
