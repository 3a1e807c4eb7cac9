//! The env plugin both ways on host memory: oxccl loading an env plugin in
//! C (a fixture at v2 and at v1) and reading every setting through it, and
//! oxccl's own env plugin (liboxccl_env.so, serving oxccl's TOML file)
//! loaded by oxccl. NCCL loading ours is tools/env_plugin_nccl.sh (GPU
//! machine).

use std::path::PathBuf;
use std::time::Duration;

use oxccl::config::{Config, Source, PARAMS};
use oxccl_tests::{as_child, assert_all_ok, built_library, spawn};

fn fixture(name: &str) -> String {
    format!("{}/lib{name}.so", env!("OXCCL_FIXTURES"))
}

/// A fresh directory for one test's files, removed by the caller.
fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxccl-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A rank: the settings the plugin alone gave are in force and read
/// through it, and every collective is right over the network (shared
/// memory was disabled through the plugin).
fn rank_body(plugin: &'static str) -> impl FnOnce(oxccl_tests::Rank) {
    move |r| {
        oxccl::log::init();
        let cfg = Config::load().unwrap();
        assert!(
            cfg.shm_disable,
            "NCCL_SHM_DISABLE=1 did not come through {plugin}"
        );
        let through = Source::EnvPlugin(plugin.to_string());
        for key in ["SHM_DISABLE", "DEBUG", "SOCKET_IFNAME"] {
            assert_eq!(cfg.source(key), Some(&through), "NCCL_{key}");
        }
        let comm = r.comm(&[]);
        oxccl_tests::check_every_collective(&comm, 1, &[8, (1 << 20) + 4]);
    }
}

/// What every rank's log shows when the plugin gave NCCL_DEBUG=INFO and
/// NCCL_SHM_DISABLE=1 (neither is in the ranks' environment).
fn assert_log(done: &[oxccl_cli::launch::Finished], loaded: &str) {
    for f in done {
        let e = &f.stderr;
        assert!(e.contains(loaded), "rank {} lacks {loaded:?}:\n{e}", f.rank);
        assert!(
            e.contains("via NET/Socket/") && !e.contains("via SHM"),
            "rank {}: shared memory was not disabled through the plugin:\n{e}",
            f.rank
        );
    }
}

fn env_plugin_in_c(name: &str, lib: &str, plugin_name: &str, symbol: &str) {
    let dir = scratch(name);
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_ENV_PLUGIN", lib),
            ("FIXTURE_ENV_NCCL_SHM_DISABLE", "1"),
            ("FIXTURE_ENV_NCCL_DEBUG", "INFO"),
            ("FIXTURE_ENV_NCCL_DEBUG_SUBSYS", "INIT,ENV"),
            ("FIXTURE_ENV_LOG", dir.to_str().unwrap()),
        ],
        Duration::from_secs(60),
    );
    assert_all_ok(&done);
    assert_log(
        &done,
        &format!("loaded env plugin {plugin_name} from {lib} ({symbol})"),
    );
    // What each rank asked the plugin, written at its finalize (at exit).
    let logs: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(logs.len(), 2, "one finalize per rank");
    for asked in &logs {
        let asked: Vec<&str> = asked.lines().collect();
        let missed: Vec<String> = PARAMS
            .iter()
            .map(|d| d.env_name())
            .filter(|n| !asked.contains(&n.as_str()))
            .collect();
        assert!(missed.is_empty(), "read around the plugin: {missed:?}");
        // NCCL reads these two with getenv, before any plugin.
        assert!(!asked.contains(&"NCCL_ENV_PLUGIN"), "{asked:?}");
    }
}

#[test]
fn c_env_plugin_v2_feeds_every_setting() {
    let name = "c_env_plugin_v2_feeds_every_setting";
    if as_child(name, rank_body("fixture-env-v2")) {
        return;
    }
    let lib = fixture("env_fixture");
    env_plugin_in_c(name, &lib, "fixture-env-v2", "ncclEnvPlugin_v2");
}

#[test]
fn c_env_plugin_v1_feeds_every_setting() {
    let name = "c_env_plugin_v1_feeds_every_setting";
    if as_child(name, rank_body("fixture-env-v1")) {
        return;
    }
    let lib = fixture("env_fixture_v1");
    env_plugin_in_c(name, &lib, "fixture-env-v1", "ncclEnvPlugin_v1");
}

/// Our plugin serving a TOML file to oxccl: the values reach the library
/// through the plugin (the rank body checks their source), and the plugin's
/// own init line (logged before oxccl's logging was set up) is in the log.
/// oxccl takes its abi_stable root module, or with OXCCL_PLUGIN_ABI=c its
/// NCCL C symbols, which serve the same.
fn our_env_plugin_serves_the_toml_file(name: &str, abi: &str, loaded_as: &str) {
    if as_child(name, rank_body("oxccl-env")) {
        return;
    }
    let Some(lib) = built_library("liboxccl_env.so") else {
        println!("skipped: liboxccl_env.so was not built beside the tests (cargo build --workspace builds it)");
        return;
    };
    let dir = scratch(name);
    let toml = dir.join("oxccl.toml");
    std::fs::write(
        &toml,
        "[env]\nNCCL_SHM_DISABLE = true\nNCCL_DEBUG = \"INFO\"\nNCCL_DEBUG_SUBSYS = \"INIT,ENV\"\n",
    )
    .unwrap();
    let lib = lib.to_str().unwrap().to_string();
    let done = spawn(
        name,
        2,
        &[
            ("NCCL_ENV_PLUGIN", &lib),
            ("OXCCL_CONFIG", toml.to_str().unwrap()),
            ("OXCCL_PLUGIN_ABI", abi),
        ],
        Duration::from_secs(60),
    );
    std::fs::remove_dir_all(&dir).ok();
    assert_all_ok(&done);
    assert_log(
        &done,
        &format!("loaded env plugin oxccl-env from {lib} ({loaded_as})"),
    );
    for f in &done {
        assert!(
            f.stderr.contains(&format!(
                "oxccl-env: 3 variable(s) from {} for NCCL 2.31.2+oxccl",
                toml.display()
            )),
            "{}",
            f.stderr
        );
    }
}

#[test]
fn our_env_plugin_serves_the_toml_file_through_its_root_module() {
    our_env_plugin_serves_the_toml_file(
        "our_env_plugin_serves_the_toml_file_through_its_root_module",
        "auto",
        &format!(
            "oxccl_env_root_module, oxccl-plugin {}",
            env!("CARGO_PKG_VERSION")
        ),
    );
}

#[test]
fn our_env_plugin_serves_the_toml_file_through_its_c_symbols() {
    our_env_plugin_serves_the_toml_file(
        "our_env_plugin_serves_the_toml_file_through_its_c_symbols",
        "c",
        "ncclEnvPlugin_v2",
    );
}

/// `oxccl info` names the plugin, its ABI version and, per setting, that
/// it was read through it.
#[test]
fn info_names_the_env_plugin() {
    let name = "info_names_the_env_plugin";
    if as_child(name, |_| {
        oxccl_cli::info::main(&Default::default()).unwrap();
    }) {
        return;
    }
    let lib = fixture("env_fixture_v1");
    let done = spawn(
        name,
        1,
        &[("NCCL_ENV_PLUGIN", &lib), ("FIXTURE_ENV_NCCL_ALGO", "Ring")],
        Duration::from_secs(60),
    );
    assert_all_ok(&done);
    let out = &done[0].stdout;
    let algo = out
        .lines()
        .find(|l| l.trim_start().starts_with("NCCL_ALGO "))
        .unwrap_or_else(|| panic!("no NCCL_ALGO line:\n{out}"));
    assert!(
        algo.contains("Ring") && algo.contains("env plugin fixture-env-v1"),
        "{algo}"
    );
    for line in [
        format!("NCCL_ENV_PLUGIN={lib}"),
        format!("found: {lib}"),
        "ABI version: ncclEnvPlugin_v1".to_string(),
        "name: fixture-env-v1".to_string(),
    ] {
        assert!(out.contains(&line), "no {line:?} in:\n{out}");
    }
}

/// An explicit NCCL_ENV_PLUGIN that names no library fails the
/// configuration with a message naming it (as the other plugin settings
/// do); NCCL would fall back silently.
#[test]
fn missing_env_plugin_is_named() {
    let name = "missing_env_plugin_is_named";
    if as_child(name, |_| {
        let e = Config::load().unwrap_err().to_string();
        println!("{e}");
    }) {
        return;
    }
    let done = spawn(
        name,
        1,
        &[("NCCL_ENV_PLUGIN", "no-such-env")],
        Duration::from_secs(60),
    );
    assert_all_ok(&done);
    let out = &done[0].stdout;
    assert!(
        out.contains("NCCL_ENV_PLUGIN=no-such-env")
            && out.contains("libnccl-env-no-such-env.so")
            && out.contains("none"),
        "{out}"
    );
}
