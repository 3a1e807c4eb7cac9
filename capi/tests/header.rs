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

/// The names of a checked-in list (`#` starts a comment).
fn names(file: &str) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(dir.join("tests").join(file)).expect(file);
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Every function NCCL 2.31.2's `nccl.h` declares (each also as
/// `pnccl...`). `ncclResetDebugInit` is declared there only where
/// NCCL_OS_LINUX is defined, which the header defines on Linux, so NCCL's
/// library exports it.
fn nccl_2_31() -> Vec<String> {
    names("nccl_2_31_functions.txt")
}

/// Declared by our header besides NCCL's `nccl.h`: the host functions of
/// NCCL's device API (`nccl_device/core.h`) that oxccl exports.
fn device_api() -> Vec<String> {
    names("nccl_device_2_31_functions.txt")
}

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
fn header_declares_exactly_nccl_2_31s_functions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(dir.join("include/nccl.h")).expect("include/nccl.h");
    let got = declared(&header);
    let want: std::collections::BTreeSet<String> =
        nccl_2_31().into_iter().chain(device_api()).collect();
    assert_eq!(nccl_2_31().len(), 72, "NCCL 2.31.2's nccl.h declares 72");
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "nccl.h: missing {missing:?}, not NCCL 2.31's {extra:?}"
    );
    assert!(header.contains("#define NCCL_VERSION_CODE 23102"));
    assert!(header.contains("#define NCCL_MAJOR 2"));
    assert!(header.contains("#define NCCL_MINOR 31"));
    assert!(header.contains("#define NCCL_PATCH 2"));
}

/// 2.31.2's values and initialisers, as its nccl.h spells them.
#[test]
fn header_has_nccl_2_31s_values() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(dir.join("include/nccl.h")).expect("include/nccl.h");
    for want in [
        "typedef struct ncclCollConfig_t {",
        "#define NCCL_COLLCONFIG_INITIALIZER",
        "#define NCCL_COMM_PROPERTIES_INITIALIZER",
        "#define ncclHostCftDefault NCCL_CONFIG_UNDEF_INT",
        "#define ncclHostCftEnable 1",
        "#define ncclHostCftFallback 3",
        "int hostCftMode;",
        "uint64_t userProfilerTag;",
        "#define NCCL_GIN_TYPE_PROXY 2",
        "#define NCCL_GIN_TYPE_EFA_GDA 5",
    ] {
        assert!(header.contains(want), "nccl.h lacks {want:?}");
    }
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
    for name in nccl_2_31().iter().chain(device_api().iter()) {
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

/// What `nm -D --defined-only` lists: the dynamic symbols the library
/// defines, as a C program's loader sees them.
#[test]
fn nm_lists_every_function_of_nccl_2_31s_header() {
    let path = library();
    let out = match std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&path)
        .output()
    {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!("nm -D failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("skipped: nm is not installed ({e})");
            return;
        }
    };
    let listed: std::collections::BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().rev();
            let name = f.next()?;
            let kind = f.next()?;
            (kind == "T" || kind == "W").then(|| name.to_string())
        })
        .collect();
    let mut missing = Vec::new();
    for name in nccl_2_31().iter().chain(device_api().iter()) {
        for sym in [name.clone(), format!("p{name}")] {
            if !listed.contains(&sym) {
                missing.push(sym);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "nm -D --defined-only {} lacks {missing:?}",
        path.display()
    );
    eprintln!(
        "nm -D --defined-only: all {} functions of NCCL 2.31.2's nccl.h and {} of nccl_device, each as nccl and pnccl",
        nccl_2_31().len(),
        device_api().len()
    );
}
