//! Loads the built `liboxccl_env.so` as NCCL does (dlopen, dlsym of
//! `ncclEnvPlugin_v1` and `_v2`) and drives it through the C ABI only.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::path::PathBuf;

use oxccl_plugin::ffi::env::{EnvV1, EnvV2};
use oxccl_plugin::ffi::types::{NCCL_INVALID_USAGE, NCCL_SUCCESS};

fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("liboxccl_env.so"))
        .find(|p| p.exists())
        .expect("liboxccl_env.so next to the test binary (cargo builds the cdylib)")
}

fn get(
    f: unsafe extern "C" fn(*const std::os::raw::c_char) -> *const std::os::raw::c_char,
    name: &CStr,
) -> Option<String> {
    // SAFETY: a C string; the result is NULL or the plugin's C string,
    // valid until the next call for this name.
    let p = unsafe { f(name.as_ptr()) };
    // SAFETY: as above.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string())
}

/// One test, so that the variables it sets race with nothing.
#[test]
fn v1_and_v2_serve_the_file_below_the_environment() {
    let dir = std::env::temp_dir().join(format!("oxccl-env-dl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("oxccl.toml");
    std::fs::write(
        &good,
        "[env]\nNCCL_SOCKET_IFNAME = \"lo\"\nNCCL_MAX_NCHANNELS = 4\nNCCL_ALGO = \"Tree\"\n",
    )
    .unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[env]\nNCCL_X = [1]\n").unwrap();
    std::env::set_var("NCCL_ALGO", "Ring");
    std::env::set_var("OXCCL_CONFIG", &good);

    // SAFETY: our own library; its initialisers only set up statics.
    let lib = unsafe { libloading::Library::new(library()) }.unwrap();
    // SAFETY: the symbols are `ncclEnv_v2_t`/`_v1_t` statics (layout-tested in the sdk).
    let v2: &EnvV2 = unsafe { &**lib.get::<*const EnvV2>(b"ncclEnvPlugin_v2\0").unwrap() };
    // SAFETY: as above.
    let v1: &EnvV1 = unsafe { &**lib.get::<*const EnvV1>(b"ncclEnvPlugin_v1\0").unwrap() };
    // SAFETY: the plugin's static name.
    assert_eq!(unsafe { CStr::from_ptr(v2.name) }, c"oxccl-env");

    // SAFETY: NCCL's arguments; a NULL logger is allowed (lines to stderr).
    let r = unsafe { v2.init.unwrap()(2, 30, 7, c"+test".as_ptr(), None) };
    assert_eq!(r, NCCL_SUCCESS);
    let g = v2.get_env.unwrap();
    assert_eq!(get(g, c"NCCL_SOCKET_IFNAME").as_deref(), Some("lo"));
    assert_eq!(get(g, c"NCCL_MAX_NCHANNELS").as_deref(), Some("4"));
    assert_eq!(
        get(g, c"NCCL_ALGO").as_deref(),
        Some("Ring"),
        "the environment wins"
    );
    assert_eq!(get(g, c"NCCL_NOT_SET_ANYWHERE"), None);
    // SAFETY: after init.
    assert_eq!(unsafe { v2.finalize.unwrap()() }, NCCL_SUCCESS);
    assert_eq!(
        get(g, c"NCCL_SOCKET_IFNAME"),
        None,
        "nothing after finalize"
    );

    // v1 (NCCL 2.28): same plugin, no logger; a file it cannot use fails
    // init with invalid usage, so NCCL falls back to its environment.
    std::env::set_var("OXCCL_CONFIG", &bad);
    // SAFETY: NCCL's arguments.
    let r = unsafe { v1.init.unwrap()(2, 28, 9, c"+cuda13.0".as_ptr()) };
    assert_eq!(r, NCCL_INVALID_USAGE);
    std::env::set_var("OXCCL_CONFIG", &good);
    // SAFETY: as above.
    let r = unsafe { v1.init.unwrap()(2, 28, 9, c"+cuda13.0".as_ptr()) };
    assert_eq!(r, NCCL_SUCCESS);
    assert_eq!(
        get(v1.get_env.unwrap(), c"NCCL_SOCKET_IFNAME").as_deref(),
        Some("lo")
    );
    // SAFETY: after init.
    assert_eq!(unsafe { v1.finalize.unwrap()() }, NCCL_SUCCESS);
    std::fs::remove_dir_all(&dir).ok();
}
