//! NCCL_DEBUG_FILE: every process of a job writes its log to its own file
//! (%h and %p substituted) instead of stderr.

use std::process::Command;

#[test]
fn each_rank_logs_to_its_own_file() {
    let dir = std::env::temp_dir().join(format!("oxccl-debug-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pattern = dir.join("log.%h.%p");
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl"))
        .args(["perf", "--ranks", "2", "--op", "all_reduce"])
        .args(["-b", "8", "-e", "1K", "-f", "32", "-n", "2", "-w", "1"])
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT")
        .env("NCCL_DEBUG_FILE", &pattern)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .output()
        .expect("run oxccl perf");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "oxccl perf failed: {stderr}");
    assert!(
        !stderr.contains("communicator ready"),
        "INFO lines went to stderr although NCCL_DEBUG_FILE is set:\n{stderr}"
    );
    let mut ready = 0;
    let mut files = 0;
    for e in std::fs::read_dir(&dir).expect("read temp dir") {
        let path = e.expect("dir entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.contains('%'), "unsubstituted name {name}");
        let text = std::fs::read_to_string(&path).expect("read log");
        files += 1;
        ready += text.matches("communicator ready").count();
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        files >= 2,
        "{files} log file(s), expected one per rank process"
    );
    assert_eq!(
        ready, 2,
        "each of the 2 ranks logs 'communicator ready' once"
    );
}
