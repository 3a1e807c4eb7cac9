//! A bad setting through the C API: ncclCommInitRank returns
//! ncclInvalidArgument and ncclGetLastError names the variable and what it
//! accepts (NCCL_TIMEOUT=inf was "internal error (a bug in oxccl)", a
//! panic caught at the boundary). Each case runs in a child process of
//! this test, whose environment it sets.

use std::ffi::CStr;
use std::process::Command;

use nccl::types::{ncclComm_t, ncclResult_t, ncclUniqueId};

const CHILD: &str = "OXCCL_TEST_CHILD";
const NAME: &str = "init_refuses_a_bad_setting_naming_it";

/// In the child: a unique id made without the setting `name` (which
/// ncclGetUniqueId would refuse too), then one rank's init with it;
/// prints `RESULT <code> <last error>`.
fn child(name: &str) {
    let value = std::env::var_os(name);
    std::env::remove_var(name);
    let mut id = ncclUniqueId { internal: [0; 128] };
    assert_eq!(nccl::ncclGetUniqueId(&mut id), ncclResult_t::ncclSuccess);
    if let Some(v) = value {
        std::env::set_var(name, v);
    }
    let mut comm: ncclComm_t = std::ptr::null_mut();
    let r = nccl::ncclCommInitRank(&mut comm, 1, id, 0);
    // SAFETY: ncclGetLastError returns a NUL-terminated string owned by the
    // library, valid until the next failing call.
    let last = unsafe { CStr::from_ptr(nccl::ncclGetLastError(std::ptr::null_mut())) };
    println!("RESULT {} {}", r as i32, last.to_string_lossy());
}

/// Runs the child with `name=value` and returns its RESULT line, asserting
/// ncclInvalidArgument and a message naming the setting and saying `says`.
fn refused(name: &str, value: &str, says: &str) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new(&exe)
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, name)
        .env("OXCCL_HOST_MEMORY", "1")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env(name, value)
        .output()
        .expect("run the child");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .find_map(|l| l.find("RESULT ").map(|i| l[i..].to_string()))
        .unwrap_or_else(|| panic!("{name}={value}: the child printed no RESULT:\n{text}"));
    let want = format!("RESULT {} ", ncclResult_t::ncclInvalidArgument as i32);
    assert!(
        line.starts_with(&want)
            && line.contains(&format!("{name}={value:?}"))
            && line.contains(says),
        "{name}={value}: {line}"
    );
    println!("{name}={value}: {line}");
    line
}

#[test]
fn init_refuses_a_bad_setting_naming_it() {
    if let Ok(name) = std::env::var(CHILD) {
        child(&name);
        return;
    }
    for v in ["inf", "1e30", "0", "-5", "NaN"] {
        refused("NCCL_TIMEOUT", v, "from 0.001 to 31536000");
    }
    refused("OXCCL_HOST_MEMORY", "maybe", "expected 0 or 1");
    refused("NCCL_BUFFSIZE", "1", "from 64K to 512M");
    refused("NCCL_PROTO", "fast", "is no protocol");
}
