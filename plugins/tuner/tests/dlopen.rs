//! Loads the built `liboxccl_tuner.so` as NCCL does (dlopen + dlsym of the
//! versioned vtable) and drives it through the C ABI only.
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_void};
use std::path::PathBuf;

use oxccl_plugin::ffi::tuner::{v2::TunerV2, v5::TunerV5, v6::TunerV6, NCCL_ALGO_PROTO_IGNORE};
use oxccl_plugin::ffi::types::{NCCL_FUNC_ALL_REDUCE, NCCL_FUNC_BROADCAST, NCCL_SUCCESS};

fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("liboxccl_tuner.so"))
        .find(|p| p.exists())
        .expect("liboxccl_tuner.so next to the test binary (cargo builds the cdylib)")
}

const RING: usize = 1;
const TREE: usize = 0;
const SIMPLE: usize = 2;
const LL: usize = 0;

#[test]
fn versions_v2_v5_v6_apply_the_rules() {
    let dir = std::env::temp_dir().join(format!("oxccl-tuner-dl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        "[[rule]]\ncollective = \"broadcast\"\nalgorithm = \"tree\"\nprotocol = \"ll\"\n\n\
         [[rule]]\ncollective = \"all_reduce\"\nmin_bytes = \"1M\"\nmin_ranks = 8\n\
         algorithm = \"ring\"\nprotocol = \"simple\"\nchannels = 4\n",
    )
    .unwrap();
    // The only test in this binary that sets the variable, so no race.
    std::env::set_var("OXCCL_TUNER_CONFIG", &rules);

    // SAFETY: our own library; its initialisers only set up statics.
    let lib = unsafe { libloading::Library::new(library()) }.unwrap();

    // v5: cost table in, the rule's cell set to 0 and the channels set.
    // SAFETY: the symbol is a `ncclTuner_v5_t` static (layout-tested in the sdk).
    let v5: &TunerV5 = unsafe { &**lib.get::<*const TunerV5>(b"ncclTunerPlugin_v5\0").unwrap() };
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; NULL logger and constants are allowed.
    let rc = unsafe {
        v5.init.unwrap()(
            &mut ctx,
            42,
            8,
            1,
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, NCCL_SUCCESS);
    let mut table = [[7.0f32; 3]; 7];
    table[4] = [NCCL_ALGO_PROTO_IGNORE; 3];
    let mut nch: c_int = 16;
    // SAFETY: a 7x3 table passed as NCCL does (cast to float**).
    let rc = unsafe {
        v5.get_coll_info.unwrap()(
            ctx,
            NCCL_FUNC_ALL_REDUCE,
            1 << 20,
            1,
            table.as_mut_ptr() as *mut *mut f32,
            7,
            3,
            0,
            &mut nch,
        )
    };
    assert_eq!(rc, NCCL_SUCCESS);
    assert_eq!(table[RING][SIMPLE], 0.0);
    assert_eq!(nch, 4);
    let zeros = table.iter().flatten().filter(|&&c| c == 0.0).count();
    assert_eq!(zeros, 1, "only the rule's cell is selected: {table:?}");
    // Too small for rule 2: table and channels untouched.
    let mut table2 = [[7.0f32; 3]; 7];
    let mut nch2: c_int = 16;
    // SAFETY: as above.
    let rc = unsafe {
        v5.get_coll_info.unwrap()(
            ctx,
            NCCL_FUNC_ALL_REDUCE,
            1024,
            1,
            table2.as_mut_ptr() as *mut *mut f32,
            7,
            3,
            0,
            &mut nch2,
        )
    };
    assert_eq!(rc, NCCL_SUCCESS);
    assert_eq!((table2, nch2), ([[7.0f32; 3]; 7], 16));
    // SAFETY: the context from init, finalized once.
    assert_eq!(unsafe { v5.finalize.unwrap()(ctx) }, NCCL_SUCCESS);

    // v5 with NULL arguments: an error code, not a crash.
    // SAFETY: NULL pointers are what is being tested.
    let rc = unsafe {
        v5.get_coll_info.unwrap()(
            std::ptr::null_mut(),
            NCCL_FUNC_ALL_REDUCE,
            1,
            1,
            std::ptr::null_mut(),
            7,
            3,
            0,
            std::ptr::null_mut(),
        )
    };
    assert_ne!(rc, NCCL_SUCCESS);

    // v2: no table; algorithm and protocol come back as out-parameters.
    // SAFETY: the symbol is a `ncclTuner_v2_t` static.
    let v2: &TunerV2 = unsafe { &**lib.get::<*const TunerV2>(b"ncclTunerPlugin_v2\0").unwrap() };
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer, NULL logger.
    let rc = unsafe { v2.init.unwrap()(8, 1, None, &mut ctx) };
    assert_eq!(rc, NCCL_SUCCESS);
    let (mut algo, mut proto, mut nch): (c_int, c_int, c_int) = (-1, -1, 2);
    // SAFETY: valid out-pointers.
    let rc = unsafe {
        v2.get_coll_info.unwrap()(
            ctx,
            NCCL_FUNC_BROADCAST,
            4096,
            0,
            0,
            1,
            &mut algo,
            &mut proto,
            &mut nch,
        )
    };
    assert_eq!(rc, NCCL_SUCCESS);
    assert_eq!((algo as usize, proto as usize, nch), (TREE, LL, 2));
    // SAFETY: as above.
    let rc = unsafe {
        v2.get_coll_info.unwrap()(
            ctx,
            NCCL_FUNC_ALL_REDUCE,
            8 << 20,
            0,
            0,
            1,
            &mut algo,
            &mut proto,
            &mut nch,
        )
    };
    assert_eq!(rc, NCCL_SUCCESS);
    assert_eq!((algo as usize, proto as usize, nch), (RING, SIMPLE, 4));
    // SAFETY: the context from init, destroyed once.
    assert_eq!(unsafe { v2.destroy.unwrap()(ctx) }, NCCL_SUCCESS);

    // v6: same as v5, and getChunkSize left NULL (NCCL keeps its own).
    // SAFETY: the symbol is a `ncclTuner_v6_t` static.
    let v6: &TunerV6 = unsafe { &**lib.get::<*const TunerV6>(b"ncclTunerPlugin_v6\0").unwrap() };
    assert!(v6.get_chunk_size.is_none());
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: as for v5.
    let rc = unsafe {
        v6.init.unwrap()(
            &mut ctx,
            1,
            8,
            1,
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, NCCL_SUCCESS);
    // SAFETY: the context from init.
    assert_eq!(unsafe { v6.finalize.unwrap()(ctx) }, NCCL_SUCCESS);

    // A broken file: init fails with an error code (the message goes to
    // NCCL's WARN log).
    std::fs::write(
        &rules,
        "[[rule]]\nalgorithm = \"ring\"\nprotocol = \"warp\"\n",
    )
    .unwrap();
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: as for v5.
    let rc = unsafe {
        v5.init.unwrap()(
            &mut ctx,
            1,
            8,
            1,
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_ne!(rc, NCCL_SUCCESS);
    std::fs::remove_dir_all(&dir).ok();
}
