//! AWS's libfabric net plugin (github.com/aws/aws-ofi-nccl, ncclNet_v12)
//! under oxccl: built from its source by `tools/aws_ofi_nccl.sh build`
//! where that source is on this machine (`OXCCL_OFI_SRC`, a git dir or a
//! source tree; else the mirror this project's machines keep), it carries
//! every collective between two processes over libfabric's tcp provider on
//! loopback. Skipped, saying why, where the source, the build tools,
//! libfabric's or hwloc's headers, or CUDA headers are missing (the script
//! exits 3 and names them).
//!
//! The build is kept in the temporary directory (`oxccl-aws-ofi-nccl`) and
//! reused while it is of the same source: a build takes minutes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use oxccl_tests::{as_child, assert_all_ok, check_every_collective, spawn};

const MIRROR: &str = "/work/.mirror/aws+aws-ofi-nccl/repo";

#[test]
fn aws_ofi_nccl_carries_every_collective() {
    let name = "aws_ofi_nccl_carries_every_collective";
    if as_child(name, |r| {
        oxccl::log::init();
        let comm = r.comm(&[]);
        assert_eq!(comm.net_name().unwrap(), "Libfabric");
        check_every_collective(&comm, 1, &[8, 4096, (1 << 20) + 12]);
    }) {
        return;
    }
    let src = match std::env::var_os("OXCCL_OFI_SRC") {
        Some(p) => PathBuf::from(p),
        None if Path::new(MIRROR).exists() => PathBuf::from(MIRROR),
        None => {
            println!(
                "skipped: OXCCL_OFI_SRC is unset (a git dir or source tree of aws/aws-ofi-nccl)"
            );
            return;
        }
    };
    let dir = std::env::temp_dir().join("oxccl-aws-ofi-nccl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/aws_ofi_nccl.sh");
    let out = Command::new("timeout")
        .arg("900")
        .arg(&script)
        .arg("build")
        .arg(&dir)
        .env("OFI_SRC", &src)
        .output()
        .expect("running tools/aws_ofi_nccl.sh");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.code() == Some(3) {
        println!("skipped: {}", said.trim());
        return;
    }
    assert!(
        out.status.success(),
        "tools/aws_ofi_nccl.sh build failed:\n{said}"
    );
    let lib = dir.join("lib");
    let plugin = lib.join("libnccl-net-ofi.so");
    let plugin = plugin.to_str().expect("utf-8 path");
    let ld = lib.to_str().expect("utf-8 path");
    let env = [
        ("NCCL_NET_PLUGIN", plugin),
        // Its stand-in CUDA runtime (the plugin dlopens libcudart.so).
        ("LD_LIBRARY_PATH", ld),
        ("FI_PROVIDER", "tcp"),
        ("FI_TCP_IFACE", "lo"),
        // The plugin leaves out lo unless told otherwise.
        ("OFI_NCCL_EXCLUDE_TCP_IF", "docker0"),
        // Ranks of one host would otherwise meet in shared memory.
        ("NCCL_SHM_DISABLE", "1"),
        ("OXCCL_HOST_DIRECT", "0"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
    ];
    let done = spawn(name, 2, &env, Duration::from_secs(180));
    assert_all_ok(&done);
    for f in &done {
        let e = &f.stderr;
        let loaded = format!("loaded net plugin Libfabric from {plugin} (ncclNetPlugin_v12)");
        assert!(e.contains(&loaded), "rank {}: no '{loaded}':\n{e}", f.rank);
        assert!(
            e.contains("NET/OFI Initializing aws-ofi-nccl"),
            "rank {}: the plugin's own init line is missing:\n{e}",
            f.rank
        );
        assert!(
            e.contains("via NET/Libfabric/0"),
            "rank {}: no connection via NET/Libfabric/0:\n{e}",
            f.rank
        );
    }
}
