//! docs/settings.md is what `oxccl info --settings-markdown` prints from
//! the settings table in core/src/config/mod.rs: this fails where the file
//! differs, and says which command regenerates it.

use std::process::Command;

#[test]
fn settings_page_is_what_info_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl"))
        .args(["info", "--settings-markdown"])
        .output()
        .expect("run oxccl info --settings-markdown");
    assert!(
        out.status.success(),
        "oxccl info --settings-markdown failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).expect("UTF-8");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/settings.md");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if printed != committed {
        let first = printed
            .lines()
            .zip(committed.lines())
            .position(|(a, b)| a != b)
            .map_or(
                printed.lines().count().min(committed.lines().count()),
                |i| i,
            )
            + 1;
        panic!(
            "docs/settings.md differs from what `oxccl info --settings-markdown` prints (first at line {first}; {} lines printed, {} committed): run `{}` from the repository root and commit it",
            printed.lines().count(),
            committed.lines().count(),
            oxccl::config::MARKDOWN_COMMAND
        );
    }
}
