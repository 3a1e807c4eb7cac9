//! Loads the built plugin library as NCCL would (dlopen, `ncclNetPlugin_v8`,
//! `init`, `devices`) on a machine without RDMA hardware: it must load, say
//! why it has no device in one line, and report 0 devices.
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_void};
use std::path::PathBuf;
use std::process::Command;

const CHILD: &str = "OXCCL_NET_IB_DLOPEN_CHILD";

/// The cdylib cargo built with this test (target/<profile>/deps/ under
/// `cargo test`, target/<profile>/ after `cargo build`).
fn plugin_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?.to_path_buf();
    let up = deps.parent()?.to_path_buf();
    [deps, up]
        .into_iter()
        .map(|d| d.join("liboxccl_net_ib.so"))
        .find(|p| p.exists())
}

/// The first fields of `ncclNet_v8_t`: name, then init and devices.
#[repr(C)]
struct NetV8Head {
    name: *const std::os::raw::c_char,
    init: unsafe extern "C" fn(logger: *const c_void) -> c_int,
    devices: unsafe extern "C" fn(ndev: *mut c_int) -> c_int,
}

/// In the child: load, init, count; prints the count for the parent.
fn child(path: &str) {
    // SAFETY: our own plugin; its constructors do nothing but register a static.
    let lib = unsafe { libloading::Library::new(path) }.expect("dlopen the plugin");
    // SAFETY: the symbol is a static `ncclNet_v8_t`, whose head is NetV8Head.
    let net = unsafe { lib.get::<*const NetV8Head>(b"ncclNetPlugin_v8\0") }.expect("symbol");
    let net: &NetV8Head = {
        let p: *const NetV8Head = *net;
        // SAFETY: a pointer to the exported static, alive while `lib` is.
        unsafe { &*p }
    };
    // SAFETY: NULL logger is allowed (the plugin then logs to stderr).
    let r = unsafe { (net.init)(std::ptr::null()) };
    assert_eq!(r, 0, "init returned {r}");
    let mut n: c_int = -1;
    // SAFETY: valid out-pointer.
    let r = unsafe { (net.devices)(&mut n) };
    assert_eq!(r, 0, "devices returned {r}");
    println!("NDEV={n}");
}

#[test]
fn plugin_loads_and_reports_no_device_with_a_reason() {
    if let Ok(p) = std::env::var(CHILD) {
        child(&p);
        return;
    }
    let Some(p) = plugin_path() else {
        println!("skipped: liboxccl_net_ib.so was not built beside the tests");
        return;
    };
    if std::path::Path::new("/sys/class/infiniband").exists() {
        println!("note: this machine has /sys/class/infiniband; devices may be found");
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "plugin_loads_and_reports_no_device_with_a_reason",
            "--nocapture",
        ])
        .env(CHILD, &p)
        // The reason is an INFO line: without a logger the plugin prints
        // those only where NCCL_DEBUG asks, as NCCL does.
        .env("NCCL_DEBUG", "INFO")
        .env_remove("NCCL_IB_HCA")
        .env_remove("NCCL_IB_DISABLE")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let ndev: i32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("NDEV="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no NDEV line:\n{stdout}\n{stderr}"));
    println!(
        "{} reports {ndev} device(s); its log:\n{stderr}",
        p.display()
    );
    let nic = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| d.count())
        .unwrap_or(0);
    if nic == 0 {
        assert_eq!(ndev, 0);
        let why = stderr
            .lines()
            .filter(|l| l.contains("NET/IB") && l.contains("0 devices"))
            .collect::<Vec<_>>();
        assert_eq!(why.len(), 1, "expected one line saying why:\n{stderr}");
        assert!(
            why[0].contains("libibverbs.so.1 not found")
                || why[0].contains("no IB device")
                || why[0].contains("lists no IB device"),
            "{}",
            why[0]
        );
    }
}

#[test]
fn disabled_by_setting_says_so() {
    if let Ok(p) = std::env::var(CHILD) {
        child(&p);
        return;
    }
    let Some(p) = plugin_path() else {
        println!("skipped: liboxccl_net_ib.so was not built beside the tests");
        return;
    };
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "disabled_by_setting_says_so", "--nocapture"])
        .env(CHILD, &p)
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_IB_DISABLE", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("NDEV=0"), "{stdout}");
    assert!(stderr.contains("NCCL_IB_DISABLE=1"), "{stderr}");
}
