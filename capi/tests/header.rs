//! `include/nccl.h` is generated from the Rust definitions by cbindgen; this
//! test fails when the committed header is stale. Set OXCCL_BLESS_HEADER=1
//! to rewrite it.

use std::path::Path;

#[test]
fn committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut out);
    let fresh = String::from_utf8(out).expect("utf-8");
    let path = dir.join("include/nccl.h");
    if std::env::var_os("OXCCL_BLESS_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write include/nccl.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/nccl.h is stale: run `OXCCL_BLESS_HEADER=1 cargo test -p oxccl-capi --test header`"
    );
}

/// Every function NCCL 2.30.7's `nccl.h` declares (each also as `pnccl...`).
/// `ncclResetDebugInit` is declared there only where NCCL_OS_LINUX is
/// defined, which NCCL's own build defines, so its library exports it.
const NCCL_2_30: [&str; 64] = [
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRankConfig",
    "ncclCommInitRank",
    "ncclCommInitAll",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommRevoke",
    "ncclCommSplit",
    "ncclCommShrink",
    "ncclCommGetUniqueId",
    "ncclCommGrow",
    "ncclCommInitRankScalable",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclResetDebugInit",
    "ncclCommGetAsyncError",
    "ncclCommCount",
    "ncclCommCuDevice",
    "ncclCommUserRank",
    "ncclCommRegister",
    "ncclCommDeregister",
    "ncclCommSuspend",
    "ncclCommResume",
    "ncclCommMemStats",
    "ncclCommWindowRegister",
    "ncclCommWindowDeregister",
    "ncclWinGetUserPtr",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclReduce",
    "ncclBcast",
    "ncclBroadcast",
    "ncclAllReduce",
    "ncclReduceScatter",
    "ncclAllGather",
    "ncclAlltoAll",
    "ncclGather",
    "ncclScatter",
    "ncclSend",
    "ncclRecv",
    "ncclPutSignal",
    "ncclSignal",
    "ncclWaitSignal",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclGroupSimulateEnd",
    "ncclParamBind",
    "ncclParamGetI8",
    "ncclParamGetI16",
    "ncclParamGetI32",
    "ncclParamGetI64",
    "ncclParamGetU8",
    "ncclParamGetU16",
    "ncclParamGetU32",
    "ncclParamGetU64",
    "ncclParamGetStr",
    "ncclParamGet",
    "ncclParamGetParameter",
    "ncclParamGetAllParameterKeys",
    "ncclParamDumpAll",
];

/// Declared by our header besides NCCL's `nccl.h`: NCCL's device API
/// (`nccl_device.h`), which oxccl refuses.
const DEVICE_API: [&str; 2] = ["ncclDevCommCreate", "ncclDevCommDestroy"];

/// The names of the functions a header declares: identifiers starting
/// with `nccl` or `pnccl` and followed by `(`.
fn declared(header: &str) -> std::collections::BTreeSet<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = std::collections::BTreeSet::new();
    let mut rest = header;
    while let Some(i) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        rest = &rest[i..];
        let n = rest.find(|c: char| !ident(c)).unwrap_or(rest.len());
        let (word, after) = rest.split_at(n);
        if (word.starts_with("nccl") || word.starts_with("pnccl")) && after.starts_with('(') {
            names.insert(word.to_string());
        }
        rest = after;
    }
    names
}

#[test]
fn header_declares_exactly_nccl_2_30s_functions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(dir.join("include/nccl.h")).expect("include/nccl.h");
    let got = declared(&header);
    let want: std::collections::BTreeSet<String> = NCCL_2_30
        .iter()
        .chain(DEVICE_API.iter())
        .map(|s| s.to_string())
        .collect();
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "nccl.h: missing {missing:?}, not NCCL 2.30's {extra:?}"
    );
    assert!(header.contains("#define NCCL_VERSION_CODE 23007"));
}

/// The cdylib cargo built for this test run.
fn library() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    let up = deps.parent().expect("profile dir").to_path_buf();
    [deps, up]
        .into_iter()
        .map(|d| d.join("libnccl.so"))
        .find(|p| p.exists())
        .expect("libnccl.so next to the test binary: build with `cargo test -p oxccl-capi`")
}

#[test]
fn library_exports_every_function_and_its_profiling_name() {
    let path = library();
    // SAFETY: loading our own library runs no initialisers beyond Rust's
    // (it has no constructors); nothing is called through the symbols.
    let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen libnccl.so");
    let mut missing = Vec::new();
    for name in NCCL_2_30.iter().chain(DEVICE_API.iter()) {
        for sym in [name.to_string(), format!("p{name}")] {
            // SAFETY: only the address is looked up; its type is not used.
            let found = unsafe { lib.get::<*const ()>(sym.as_bytes()) }.is_ok();
            if !found {
                missing.push(sym);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} does not export {missing:?}",
        path.display()
    );
}
