//! The built `liboxccl_tuner.so` loaded the way oxccl loads it: through its
//! abi_stable root module, and through NCCL's C symbols when that is asked
//! for, with the same answers.

use std::path::{Path, PathBuf};

use oxccl_plugin::ffi::types::NCCL_FUNC_ALL_REDUCE;
use oxccl_plugin::loader::{self, Lib};
use oxccl_plugin::stable::{AbiChoice, SDK_VERSION};
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
