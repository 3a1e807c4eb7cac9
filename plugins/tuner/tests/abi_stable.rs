//! The built `liboxccl_tuner.so` loaded the way oxccl loads it: through its
//! abi_stable root module, and through NCCL's C symbols when that is asked
//! for, with the same answers; and a tuner built against an SDK whose
//! types changed, refused with the type and both SDK versions named.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use oxccl_plugin::env::stable::EnvModRef;
use oxccl_plugin::ffi::types::NCCL_FUNC_ALL_REDUCE;
use oxccl_plugin::loader::{self, Lib};
use oxccl_plugin::stable::{load_root, AbiChoice, SDK_VERSION};
use oxccl_plugin::tuner::load::CTuner;

/// Where cargo put this test binary: target/<profile>/deps.
fn deps_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

fn open(path: &Path) -> Lib {
    let s = loader::open(loader::TUNER, path.to_str());
    s.opened
        .unwrap_or_else(|| panic!("{path:?} did not open: {:?}", s.failed))
}

fn library() -> PathBuf {
    let deps = deps_dir();
    [deps.clone(), deps.parent().unwrap().to_path_buf()]
        .iter()
        .map(|d| d.join("liboxccl_tuner.so"))
        .find(|p| p.exists())
        .expect("liboxccl_tuner.so next to the test binary (cargo builds the cdylib)")
}

const RING: usize = 1;
const SIMPLE: usize = 2;

#[test]
fn the_root_module_is_preferred_and_both_paths_agree() {
    let dir = std::env::temp_dir().join(format!("oxccl-tuner-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        "[[rule]]\ncollective = \"all_reduce\"\nmin_bytes = \"1M\"\nmin_ranks = 8\n\
         algorithm = \"ring\"\nprotocol = \"simple\"\nchannels = 4\n",
    )
    .unwrap();
    // The only test in this binary that sets the variable, so no race.
    std::env::set_var("OXCCL_TUNER_CONFIG", &rules);
    let lib = open(&library());

    let mut answers = Vec::new();
    for (abi, stable) in [(AbiChoice::Auto, true), (AbiChoice::C, false)] {
        let t = CTuner::open(&lib, abi).unwrap_or_else(|(_, why)| panic!("{abi:?}: {why}"));
        assert_eq!(t.is_stable(), stable, "{abi:?}: {}", t.loaded_as());
        assert_eq!(t.name, "oxccl-tuner");
        let how = t.loaded_as();
        if stable {
            assert_eq!(
                how,
                format!("oxccl_tuner_root_module, oxccl-plugin {SDK_VERSION}")
            );
        } else {
            assert_eq!(how, "ncclTunerPlugin_v6");
        }
        let ctx = t.init(42, 8, 1, None).unwrap();
        let mut answer = Vec::new();
        for bytes in [1024, 1 << 20] {
            let mut table = [[7.0f32; 3]; 7];
            table[4] = [-1.0; 3];
            let mut nch = 16;
            t.get_coll_info(&ctx, NCCL_FUNC_ALL_REDUCE, bytes, &mut table, &mut nch)
                .unwrap();
            answer.push((table, nch));
        }
        t.finalize(&ctx);
        answers.push(answer);
    }
    assert_eq!(answers[0], answers[1], "root module and C symbols differ");
    let (small, big) = (answers[0][0], answers[0][1]);
    assert_eq!(small.1, 16, "too small for the rule: channels kept");
    assert_eq!((big.0[RING][SIMPLE], big.1), (0.0, 4));

    // A broken rules file: init fails with the tuner's own message, which
    // the root module carries across (the C path has only a code).
    std::fs::write(
        &rules,
        "[[rule]]\nalgorithm = \"ring\"\nprotocol = \"warp\"\n",
    )
    .unwrap();
    let t = CTuner::open(&lib, AbiChoice::Auto).unwrap_or_else(|(_, why)| panic!("{why}"));
    let e = t.init(1, 8, 1, None).err().expect("a bad rules file");
    assert!(e.starts_with("init: ") && e.contains("warp"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Builds the fixture once, with the SDK's test-only skew feature, in a
/// target directory of its own (its dependencies are those of the
/// workspace, already fetched: offline, pinned by a copy of the lockfile).
fn skewed_fixture() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture = manifest_dir.join("abi-skew-fixture");
    let workspace = manifest_dir.join("../..");
    std::fs::copy(workspace.join("Cargo.lock"), fixture.join("Cargo.lock"))
        .expect("copying the workspace's Cargo.lock beside the fixture");
    // target/<profile>/deps -> target/abi-skew
    let target = deps_dir().join("../../abi-skew");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let start = Instant::now();
    let mut child = Command::new(cargo)
        .args(["build", "--offline", "--quiet", "--manifest-path"])
        .arg(fixture.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .spawn()
        .expect("running cargo");
    let limit = Duration::from_secs(600);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("building the abi-skew fixture took over {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.success(), "building the abi-skew fixture failed");
    eprintln!("abi-skew fixture built in {:?}", start.elapsed());
    target.join("debug/liboxccl_abi_skew_tuner.so")
}

#[test]
fn plugins_built_against_a_changed_sdk_are_refused() {
    let lib = open(&skewed_fixture());
    let Err((found, why)) = CTuner::open(&lib, AbiChoice::Auto) else {
        panic!("the skewed tuner was loaded");
    };
    eprintln!("refused: {why}");
    assert_eq!(found, ["oxccl_tuner_root_module"]);
    for said in [
        format!(
            "oxccl_tuner_root_module was built against oxccl-plugin {}+abi-skew-for-tests",
            env!("CARGO_PKG_VERSION")
        ),
        format!("this oxccl has oxccl-plugin {SDK_VERSION}"),
        "abi_stable found types whose layout differs: CollRequest: incompatible type size \
         (expected 24, found 32), too many fields (expected 4, found 5);"
            .to_string(),
        format!("rebuild the plugin against oxccl-plugin {SDK_VERSION}"),
    ] {
        assert!(why.contains(&said), "no {said:?} in: {why}");
    }
    // Its NCCL C symbols are frozen structs, not the changed Rust ones:
    // asked for, they still load.
    let t = CTuner::open(&lib, AbiChoice::C).unwrap_or_else(|(_, why)| panic!("{why}"));
    assert_eq!((t.name.as_str(), t.version), ("abi-skew", 6));

    // The env plugin beside it: its root module is refused the same way
    // (oxccl's env loader, in the core, calls this same check).
    let Some(Err(e)) = load_root::<EnvModRef>(&lib, "oxccl_env_root_module") else {
        panic!("the skewed env plugin's root module was not refused");
    };
    let why = e.to_string();
    eprintln!("refused: {why}");
    assert!(
        why.contains("found types whose layout differs: InitArgs: incompatible type size"),
        "{why}"
    );
}
