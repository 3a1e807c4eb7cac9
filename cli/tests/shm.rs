//! Two rank processes of one host: `oxccl perf --ranks 2` checks every
//! collective on random data through shared memory, each rank logs NCCL's
//! SHM line for its connections, and neither leaves a segment in /dev/shm;
//! with NCCL_SHM_DISABLE=1 the same run goes through the network.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs perf on two processes with `env`; returns each rank process's log
/// (by pid) and stdout. (The launching process writes an empty log too.)
fn perf(tag: &str, env: &[(&str, &str)]) -> (Vec<(u32, String)>, String) {
    let dir = std::env::temp_dir().join(format!("oxccl-shm-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl"))
        .args(["perf", "--ranks", "2", "--op", "all", "--time-limit", "120"])
        .args(["-b", "8", "-e", "8M", "-f", "64", "-n", "2", "-w", "1"])
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT")
        .env("NCCL_DEBUG_FILE", dir.join("log.%p"))
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_TIMEOUT", "60")
        .envs(env.iter().copied())
        .output()
        .expect("run oxccl perf");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logs: Vec<(u32, String)> = read_logs(&dir)
        .into_iter()
        .filter(|(_, l)| l.contains("Init COMPLETE"))
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        out.status.success(),
        "oxccl perf failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("# Out of bounds values : 0 OK"),
        "wrong results:\n{stdout}"
    );
    assert_eq!(logs.len(), 2, "one log per rank process: {logs:?}");
    (logs, stdout)
}

fn read_logs(dir: &Path) -> Vec<(u32, String)> {
    let paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read temp dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    paths
        .into_iter()
        .map(|p| {
            let pid = p
                .extension()
                .and_then(|x| x.to_str())
                .and_then(|x| x.parse().ok())
                .unwrap_or_else(|| panic!("log {} is not log.<pid>", p.display()));
            (pid, std::fs::read_to_string(&p).expect("read log"))
        })
        .collect()
}

/// Segments in /dev/shm made by the process `pid`.
fn segments_of(pid: u32) -> Vec<String> {
    let prefix = format!("oxccl-{pid}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn two_processes_talk_through_shared_memory() {
    let (logs, _) = perf("on", &[]);
    let text: String = logs.iter().map(|(_, l)| l.as_str()).collect();
    for line in [
        "Channel 00 : 0[-1] -> 1[-1] via SHM/direct/direct",
        "Channel 00 : 1[-1] -> 0[-1] via SHM/direct/direct",
    ] {
        assert!(text.contains(line), "no {line:?} in the logs:\n{text}");
    }
    assert!(!text.contains("via NET"), "{text}");
    for (pid, _) in &logs {
        assert_eq!(segments_of(*pid), Vec::<String>::new(), "left by {pid}");
    }
}

#[test]
fn shm_disable_sends_the_processes_through_the_network() {
    let (logs, _) = perf("off", &[("NCCL_SHM_DISABLE", "1")]);
    let text: String = logs.iter().map(|(_, l)| l.as_str()).collect();
    for part in [
        "Channel 00/0 : 0[-1] -> 1[-1] [send] via NET/",
        "[receive] via NET/",
    ] {
        assert!(text.contains(part), "no {part:?} in the logs:\n{text}");
    }
    assert!(!text.contains("via SHM"), "{text}");
}
