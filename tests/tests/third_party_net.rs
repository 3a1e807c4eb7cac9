//! Net plugins written for NCCL by others, under oxccl.
//!
//! - Google's Fast Socket (github.com/google/nccl-fastsocket, ncclNet_v6),
//!   built from its source by `tools/fastsocket.sh build` where that source
//!   and NCCL 2.13's are on this machine (`OXCCL_FASTSOCKET_SRC`,
//!   `OXCCL_NCCL_SRC`: git dirs or source trees; nothing is downloaded),
//!   carries every collective between two processes; skipped, saying why,
//!   where the sources, g++ or the socket net's library are missing.
//! - A fixture (fixtures/net_v6_strict.c, built here with `cc`) keeps the
//!   three habits of Fast Socket that NCCL tolerates and oxccl once did not:
//!   accept blocks until the peer connects, test never reports the received
//!   size, and a test of any but a comm's oldest request fails. It runs
//!   wherever a C compiler is.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use oxccl_tests::{as_child, assert_all_ok, built_library, check_every_collective, spawn};

fn every_collective(expect_net: &'static str) -> impl FnOnce(oxccl_tests::Rank) {
    move |r| {
        oxccl::log::init();
        let comm = r.comm(&[]);
        assert_eq!(comm.net_name().unwrap(), expect_net);
        check_every_collective(&comm, 1, &[8, 4096, (1 << 20) + 12]);
    }
}

/// A fresh directory for this test's build, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("oxccl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs every collective on 2 ranks through `plugin`; asserts it was loaded
/// at v6 under `net` and carried the connections.
fn run_through(name: &str, plugin: &Path, net: &'static str, extra: &[(&str, &str)]) {
    let plugin = plugin.to_str().expect("utf-8 path");
    let mut env = vec![
        ("NCCL_NET_PLUGIN", plugin),
        // Ranks of one host would otherwise meet in shared memory.
        ("NCCL_SHM_DISABLE", "1"),
        ("OXCCL_HOST_DIRECT", "0"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
    ];
    env.extend_from_slice(extra);
    let done = spawn(name, 2, &env, Duration::from_secs(120));
    assert_all_ok(&done);
    for f in &done {
        let e = &f.stderr;
        let loaded = format!("loaded net plugin {net} from {plugin} (ncclNetPlugin_v6)");
        assert!(e.contains(&loaded), "rank {}: no '{loaded}':\n{e}", f.rank);
        let via = format!("via NET/{net}/0");
        assert!(e.contains(&via), "rank {}: no '{via}':\n{e}", f.rank);
    }
}

#[test]
fn fastsocket_like_plugin_carries_every_collective() {
    let name = "fastsocket_like_plugin_carries_every_collective";
    if as_child(name, every_collective("fixture-strict")) {
        return;
    }
    let Some(inner) = built_library("liboxccl_net_socket.so") else {
        println!("skipped: liboxccl_net_socket.so was not built beside the tests (cargo build --workspace builds it)");
        return;
    };
    let dir = Scratch::new("strict-net");
    let lib = dir.0.join("libnet_v6_strict.so");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(fixtures.join("net_v6_strict.c"))
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{cc} failed to build fixtures/net_v6_strict.c: {s}"),
        Err(e) => {
            println!("skipped: no C compiler ({cc}: {e})");
            return;
        }
    }
    let inner = inner.to_str().expect("utf-8 path").to_string();
    run_through(
        name,
        &lib,
        "fixture-strict",
        &[("FIXTURE_INNER_NET", &inner)],
    );
}

/// Where a source is: the variable, else the mirror this project's machines
/// keep, else None with the reason.
fn source(var: &str, mirror: &str) -> Result<PathBuf, String> {
    match std::env::var_os(var) {
        Some(p) => Ok(PathBuf::from(p)),
        None if Path::new(mirror).exists() => Ok(PathBuf::from(mirror)),
        None => Err(format!("{var} is unset (a git dir or source tree)")),
    }
}

#[test]
fn fastsocket_carries_every_collective() {
    let name = "fastsocket_carries_every_collective";
    if as_child(name, every_collective("FastSocket")) {
        return;
    }
    let srcs = source(
        "OXCCL_FASTSOCKET_SRC",
        "/work/.mirror/google+nccl-fastsocket/repo",
    )
    .and_then(|f| {
        Ok((
            f,
            source("OXCCL_NCCL_SRC", "/work/.mirror/NVIDIA+nccl/repo")?,
        ))
    });
    let (fs, nccl) = match srcs {
        Ok(s) => s,
        Err(why) => {
            println!("skipped: {why}; Google's Fast Socket is built from its source and NCCL 2.13's headers");
            return;
        }
    };
    if Command::new("g++").arg("--version").output().is_err() {
        println!("skipped: no g++ to build Fast Socket");
        return;
    }
    let dir = Scratch::new("fastsocket");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/fastsocket.sh");
    let out = Command::new("timeout")
        .arg("300")
        .arg(&script)
        .arg("build")
        .arg(&dir.0)
        .env("FASTSOCKET_SRC", &fs)
        .env("NCCL_SRC", &nccl)
        .output()
        .expect("running tools/fastsocket.sh");
    assert!(
        out.status.success(),
        "tools/fastsocket.sh build failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = dir.0.join("libnccl-net-fastsocket.so");
    run_through(name, &lib, "FastSocket", &[]);
}
