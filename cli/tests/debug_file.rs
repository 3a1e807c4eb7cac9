//! NCCL_DEBUG_FILE: every process of a job writes its log to its own file
//! (%h and %p substituted) instead of stderr, in NCCL's line form
//! (`host:pid:tid [dev] NCCL INFO ...`) with no colour codes.

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
        !stderr.contains("Init COMPLETE"),
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
        ready += text.matches("Init COMPLETE").count();
        assert!(!text.contains('\u{1b}'), "colour codes in {name}:\n{text}");
        let pid = name.rsplit('.').next().unwrap_or_default();
        for line in text.lines() {
            // WARN lines begin with the time (NCCL_DEBUG_TIMESTAMP_LEVELS'
            // default, in NCCL_DEBUG_TIMESTAMP_FORMAT's `[%F %T] `).
            let line = match line.strip_prefix('[') {
                Some(r) if line.contains(" NCCL WARN ") => r.split_once("] ").map_or(line, |p| p.1),
                _ => line,
            };
            let (prefix, rest) = line.split_once(' ').unwrap_or_default();
            let parts: Vec<&str> = prefix.split(':').collect();
            assert!(
                parts.len() == 3 && parts[1] == pid && parts[2].parse::<u32>().is_ok(),
                "not NCCL's host:pid:tid prefix in {name}: {line}"
            );
            assert!(
                rest.starts_with('[') && rest.contains("] NCCL INFO ")
                    || rest.contains("] NCCL WARN "),
                "not NCCL's '[dev] NCCL INFO' form in {name}: {line}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        files >= 2,
        "{files} log file(s), expected one per rank process"
    );
    assert_eq!(
        ready, 2,
        "each of the 2 ranks logs NCCL's 'Init COMPLETE' once"
    );
}
