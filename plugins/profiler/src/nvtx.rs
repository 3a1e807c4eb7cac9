//! NVTX ranges for Nsight Systems. This module is this library's own NVTX3
//! loader: it speaks NVTX3's injection interface from Rust instead of
//! compiling NVIDIA's C loader in, because the binding that did that (the
//! `nvtx` crate) generates its FFI with bindgen at build time, and bindgen
//! needs libclang on every machine that builds the workspace. Four calls are
//! all the profiler makes, so the ABI is written out below from NVTX's
//! headers (github.com/NVIDIA/NVTX, `c/include/nvtx3/`: `nvToolsExt.h`,
//! `nvtxDetail/nvtxTypes.h`, `nvtxImpl.h`, `nvtxInit.h`). Its ids and
//! layouts are append-only by NVTX's own rule, so tools built against later
//! NVTX versions still attach.
//!
//! NVTX3 attaches a tool only through `NVTX_INJECTION64_PATH`, which is how
//! `nsys` injects itself: the library named there is loaded at the first
//! NVTX call, and its `InitializeInjectionNvtx2` gets a getter of export
//! tables, through which it writes its handlers into the loader's
//! function-pointer slots. Other NVTX3 copies in the process (NCCL's, the
//! CUDA runtime's) each attach the same tool to their own slots; ours are
//! only this module's. NVTX v2's `libnvToolsExt.so.1` is not used: CUDA 12
//! and later do not ship it.
//!
//! Every module NVTX defines gets a table with NVTX's exact slot count, not
//! only the CORE2 one called here, because a real tool fills every slot it
//! knows: with a shorter table Nsight Systems would write past our memory. A
//! slot the tool leaves empty makes its call a no-op, as in NVTX.
//!
//! Without the variable nothing is loaded and no NVTX call is made at all,
//! not even the domain's creation, so a normal run pays one load of an
//! initialised `OnceLock` per event. A tool that cannot be loaded, lacks the
//! entry point or refuses to initialise leaves NVTX off for the process,
//! silently, as NVTX3's loader does.
//!
//! Ranges are start/end, not push/pop, because NCCL may stop an event on
//! another thread than the one that started it; they live in the domain
//! `oxccl`, and the names NCCL uses are registered once, so that starting a
//! range passes a handle rather than a string.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString, OsStr};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use libloading::Library;

/// The variable through which NVTX3 finds the tool to load.
pub const INJECTION_ENV: &str = "NVTX_INJECTION64_PATH";

/// The domain every range of this plugin belongs to.
pub const DOMAIN: &CStr = c"oxccl";

/// The event names that get ranges (groups, collectives, p2p, API calls),
/// registered when the domain is created. Others go as plain strings.
const NAMES: &[&CStr] = &[
    c"Group",
    c"GroupApi",
    c"AllReduce",
    c"Broadcast",
    c"Reduce",
    c"AllGather",
    c"ReduceScatter",
    c"Send",
    c"Recv",
    c"SendRecv",
    c"AllToAll",
    c"Gather",
    c"Scatter",
    c"AllGatherV",
];

// NVTX3 loader failures (nvToolsExt.h), kept as NVTX's numbers so that a
// failure reads the same as in NVTX's own loader (success, NVTX_SUCCESS = 0,
// is `Ok` here).
const NVTX_ERR_INIT_LOAD_LIBRARY: c_int = 4;
const NVTX_ERR_INIT_MISSING_LIBRARY_ENTRY_POINT: c_int = 5;
const NVTX_ERR_INIT_FAILED_LIBRARY_ENTRY_POINT: c_int = 6;
const NVTX_ERR_NO_INJECTION_LIBRARY_AVAILABLE: c_int = 7;

/// `NVTX_VERSION`: what the version export table and event attributes say.
const NVTX_VERSION: u16 = 3;

// NvtxExportTableID. 2 is NVTX_ETID_RESERVED0, which NVTX answers with NULL.
const ETID_CALLBACKS: u32 = 1;
const ETID_VERSIONINFO: u32 = 3;

// NvtxCallbackModule.
const MODULE_CORE: c_int = 1;
const MODULE_CUDA: c_int = 2;
const MODULE_OPENCL: c_int = 3;
const MODULE_CUDART: c_int = 4;
const MODULE_CORE2: c_int = 5;
const MODULE_SYNC: c_int = 6;

// NVTX_CBID_<module>_SIZE: one past each module's highest callback id.
const CORE_SIZE: usize = 16;
const CUDA_SIZE: usize = 9;
const OPENCL_SIZE: usize = 15;
const CUDART_SIZE: usize = 7;
const CORE2_SIZE: usize = 16;
const SYNC_SIZE: usize = 7;

// NvtxCallbackIdCore2: the slots this module calls.
const CORE2_DOMAIN_RANGE_START_EX: usize = 2;
const CORE2_DOMAIN_RANGE_END: usize = 3;
const CORE2_DOMAIN_REGISTER_STRING_A: usize = 10;
const CORE2_DOMAIN_CREATE_A: usize = 12;

// nvtxMessageType_t.
const MESSAGE_TYPE_ASCII: i32 = 1;
const MESSAGE_TYPE_REGISTERED: i32 = 3;

/// One function-pointer slot (`NvtxFunctionPointer`): the tool stores a
/// handler, or nothing, during its initialisation. Atomic because the tool
/// writes it through a raw pointer while Rust holds shared references to
/// it, and so that a tool writing late (from any thread) is still sound.
type Slot = AtomicPtr<c_void>;

// A handler is stored in a slot as a data pointer, so both must agree.
const _: () = assert!(size_of::<Slot>() == size_of::<unsafe extern "C" fn()>());

/// The slots of each module, indexed by callback id (0 is NVTX's invalid id
/// and stays empty).
static CORE_SLOTS: [Slot; CORE_SIZE] = empty();
static CUDA_SLOTS: [Slot; CUDA_SIZE] = empty();
static OPENCL_SLOTS: [Slot; OPENCL_SIZE] = empty();
static CUDART_SLOTS: [Slot; CUDART_SIZE] = empty();
static CORE2_SLOTS: [Slot; CORE2_SIZE] = empty();
static SYNC_SLOTS: [Slot; SYNC_SIZE] = empty();

const fn empty<const N: usize>() -> [Slot; N] {
    [const { AtomicPtr::new(null_mut()) }; N]
}

/// A module's `NvtxFunctionTable` as the tool receives it: entry `i` is the
/// address of slot `i`. Entry 0 and one entry past the last id are null, as
/// in NVTX, so that a tool reading off the end finds null rather than
/// another module's slot. Atomics so that the tables sit in writable
/// memory, as NVTX's do, and are `Sync` without an `unsafe impl`; nothing
/// stores to them.
#[repr(transparent)]
struct Table<const LEN: usize>([AtomicPtr<Slot>; LEN]);

impl<const LEN: usize> Table<LEN> {
    const fn new<const N: usize>(slots: &'static [Slot; N]) -> Self {
        assert!(LEN == N + 1, "NVTX's tables have one entry more than ids");
        let mut table = [const { AtomicPtr::new(null_mut()) }; LEN];
        let mut id = 1;
        while id < N {
            table[id] = AtomicPtr::new(std::ptr::from_ref(&slots[id]).cast_mut());
            id += 1;
        }
        Table(table)
    }
}

static CORE_TABLE: Table<{ CORE_SIZE + 1 }> = Table::new(&CORE_SLOTS);
static CUDA_TABLE: Table<{ CUDA_SIZE + 1 }> = Table::new(&CUDA_SLOTS);
static OPENCL_TABLE: Table<{ OPENCL_SIZE + 1 }> = Table::new(&OPENCL_SLOTS);
static CUDART_TABLE: Table<{ CUDART_SIZE + 1 }> = Table::new(&CUDART_SLOTS);
static CORE2_TABLE: Table<{ CORE2_SIZE + 1 }> = Table::new(&CORE2_SLOTS);
static SYNC_TABLE: Table<{ SYNC_SIZE + 1 }> = Table::new(&SYNC_SLOTS);

/// `NvtxFunctionTable`: an array of pointers to slots.
type FunctionTable = *mut *mut Slot;

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table:
        unsafe extern "C" fn(c_int, *mut FunctionTable, *mut c_uint) -> c_int,
}

/// `NvtxExportTableVersionInfo`.
#[repr(C)]
struct ExportTableVersionInfo {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: extern "C" fn(u32),
}

static CALLBACKS: ExportTableCallbacks = ExportTableCallbacks {
    struct_size: size_of::<ExportTableCallbacks>(),
    get_module_function_table,
};

static VERSION_INFO: ExportTableVersionInfo = ExportTableVersionInfo {
    struct_size: size_of::<ExportTableVersionInfo>(),
    version: NVTX_VERSION as u32,
    reserved0: 0,
    set_injection_nvtx_version,
};

/// The table and its `out_size` for `module`: the number of entries less
/// the trailing null, i.e. `NVTX_CBID_<module>_SIZE`, as NVTX reports it.
fn module_table(module: c_int) -> Option<(FunctionTable, c_uint)> {
    let table: &[AtomicPtr<Slot>] = match module {
        MODULE_CORE => &CORE_TABLE.0,
        MODULE_CUDA => &CUDA_TABLE.0,
        MODULE_OPENCL => &OPENCL_TABLE.0,
        MODULE_CUDART => &CUDART_TABLE.0,
        MODULE_CORE2 => &CORE2_TABLE.0,
        MODULE_SYNC => &SYNC_TABLE.0,
        _ => return None,
    };
    // `AtomicPtr<T>` has the in-memory representation of `*mut T`; the
    // pointer is taken from the whole slice so it may reach every entry.
    let ptr = table.as_ptr().cast::<*mut Slot>().cast_mut();
    Some((ptr, (table.len() - 1) as c_uint))
}

/// `GetModuleFunctionTable`: 1 and the table for a module NVTX defines, 0
/// (out-pointers untouched) for any other.
///
/// # Safety
///
/// `out_table` and `out_size` are each null or valid for one write.
unsafe extern "C" fn get_module_function_table(
    module: c_int,
    out_table: *mut FunctionTable,
    out_size: *mut c_uint,
) -> c_int {
    let Some((table, size)) = module_table(module) else {
        return 0;
    };
    if !out_size.is_null() {
        // SAFETY: non-null, so valid for a write by the caller's contract.
        unsafe { out_size.write(size) };
    }
    if !out_table.is_null() {
        // SAFETY: non-null, so valid for a write by the caller's contract.
        unsafe { out_table.write(table) };
    }
    1
}

/// `SetInjectionNvtxVersion`: NVTX ignores the tool's version too.
extern "C" fn set_injection_nvtx_version(_version: u32) {}

/// `nvtxGetExportTable`, the getter handed to the tool.
extern "C" fn get_export_table(id: u32) -> *const c_void {
    match id {
        ETID_CALLBACKS => std::ptr::from_ref(&CALLBACKS).cast(),
        ETID_VERSIONINFO => std::ptr::from_ref(&VERSION_INFO).cast(),
        _ => null(),
    }
}

/// `NvtxInitializeInjectionNvtxFunc_t`, the tool's entry point.
type InitializeInjection = unsafe extern "C" fn(extern "C" fn(u32) -> *const c_void) -> c_int;

/// Handler types of the CORE2 slots called here (nvtxTypes.h).
type DomainCreateA = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type DomainRegisterStringA = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DomainRangeStartEx = unsafe extern "C" fn(*mut c_void, *const EventAttributes) -> u64;
type DomainRangeEnd = unsafe extern "C" fn(*mut c_void, u64);

/// `nvtxEventAttributes_v2` (`nvtxEventAttributes_t`). The payload union is
/// kept as its 64-bit member; the message union as a pointer (ASCII text or
/// a registered string handle).
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_void,
}

// The layout NVTX's headers give on 64-bit targets (x86-64, aarch64).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<EventAttributes>() == 48);
    assert!(std::mem::offset_of!(EventAttributes, category) == 4);
    assert!(std::mem::offset_of!(EventAttributes, color_type) == 8);
    assert!(std::mem::offset_of!(EventAttributes, color) == 12);
    assert!(std::mem::offset_of!(EventAttributes, payload_type) == 16);
    assert!(std::mem::offset_of!(EventAttributes, reserved0) == 20);
    assert!(std::mem::offset_of!(EventAttributes, payload) == 24);
    assert!(std::mem::offset_of!(EventAttributes, message_type) == 32);
    assert!(std::mem::offset_of!(EventAttributes, message) == 40);
};

impl EventAttributes {
    /// No color, payload or category: a range carries only its name.
    fn message(message_type: i32, message: *const c_void) -> Self {
        EventAttributes {
            version: NVTX_VERSION,
            size: size_of::<EventAttributes>() as u16,
            category: 0,
            color_type: 0,
            color: 0,
            payload_type: 0,
            reserved0: 0,
            payload: 0,
            message_type,
            message,
        }
    }
}

/// The handler in CORE2 slot `id`, if the tool set one.
///
/// # Safety
///
/// `F` is the `unsafe extern "C" fn` type NVTX gives callback `id`.
unsafe fn core2<F: Copy>(id: usize) -> Option<F> {
    // Relaxed: the tool stores during its initialisation, which the
    // `OnceLock` in `get` orders before every call made through it.
    let p = CORE2_SLOTS[id].load(Ordering::Relaxed);
    const { assert!(size_of::<Option<F>>() == size_of::<*mut c_void>()) };
    // SAFETY: a slot holds null or the tool's handler for `id`, whose type
    // is `F` by the caller's contract; `Option` of a function pointer has
    // the layout of the pointer, null being `None` (sizes checked above).
    unsafe { std::mem::transmute_copy::<*mut c_void, Option<F>>(&p) }
}

fn clear_slots() {
    for slots in [
        &CORE_SLOTS[..],
        &CUDA_SLOTS,
        &OPENCL_SLOTS,
        &CUDART_SLOTS,
        &CORE2_SLOTS,
        &SYNC_SLOTS,
    ] {
        slots
            .iter()
            .for_each(|s| s.store(null_mut(), Ordering::Relaxed));
    }
}

/// NVTX3's `nvtxInitializeInjectionLibrary` for the library at `path`: the
/// loaded tool, or NVTX's error code. A failed tool is unloaded and its
/// slots emptied, as NVTX3 turns every call into a no-op then.
fn initialize_injection(path: &OsStr) -> Result<Library, c_int> {
    if path.is_empty() {
        // NVTX3 would dlopen("") (the main program), which is never a tool.
        return Err(NVTX_ERR_NO_INJECTION_LIBRARY_AVAILABLE);
    }
    // SAFETY: this runs the tool's initialisers (and its finalisers if it
    // is unloaded below); naming it in NVTX_INJECTION64_PATH is asking for
    // exactly that, as with NVTX3's own loader.
    let tool = unsafe { Library::new(path) }.map_err(|_| NVTX_ERR_INIT_LOAD_LIBRARY)?;
    // SAFETY: NVTX defines the entry point's type; `Option` for a symbol
    // whose value is null, which NVTX counts as missing.
    let init = match unsafe { tool.get::<Option<InitializeInjection>>(c"InitializeInjectionNvtx2") }
    {
        Ok(init) => *init,
        Err(_) => None,
    };
    let Some(init) = init else {
        return Err(NVTX_ERR_INIT_MISSING_LIBRARY_ENTRY_POINT);
    };
    // SAFETY: the tool's entry point, called once per process (from `get`'s
    // `OnceLock`) with a getter whose tables live for the process.
    if unsafe { init(get_export_table) } == 0 {
        clear_slots();
        return Err(NVTX_ERR_INIT_FAILED_LIBRARY_ENTRY_POINT);
    }
    Ok(tool)
}

/// A domain or registered-string handle from the tool: opaque, only passed
/// back to it.
#[derive(Clone, Copy)]
struct Handle(*mut c_void);

// SAFETY: never dereferenced here; NVTX lets any thread pass a handle back
// to the tool, and the tool keeps what it names for the process's life.
unsafe impl Send for Handle {}
// SAFETY: as for `Send`: shared handles are only copied.
unsafe impl Sync for Handle {}

/// NVTX state while a tool is attached.
pub struct Nvtx {
    /// Keeps the tool mapped: its handlers sit in the slots.
    _tool: Library,
    domain: Handle,
    names: Vec<(&'static CStr, Handle)>,
}

/// An open range; [`end`] (or dropping it) ends it, on any thread.
#[must_use = "dropping a range ends it"]
pub struct NvtxRange {
    nvtx: &'static Nvtx,
    /// What `nvtxDomainRangeStartEx` returned.
    id: u64,
}

impl Drop for NvtxRange {
    fn drop(&mut self) {
        // SAFETY: the type NVTX gives CORE2's DomainRangeEnd.
        if let Some(end) = unsafe { core2::<DomainRangeEnd>(CORE2_DOMAIN_RANGE_END) } {
            // SAFETY: the tool's handler, with its own domain handle and a
            // range id it returned.
            unsafe { end(self.nvtx.domain.0, self.id) }
        }
    }
}

static NVTX: OnceLock<Option<Nvtx>> = OnceLock::new();

fn load() -> Option<Nvtx> {
    // Unset: no load is even tried.
    let path = std::env::var_os(INJECTION_ENV)?;
    let tool = initialize_injection(&path).ok()?;
    // SAFETY: the type NVTX gives CORE2's DomainCreateA.
    let domain = match unsafe { core2::<DomainCreateA>(CORE2_DOMAIN_CREATE_A) } {
        // SAFETY: the tool's handler, with a C string.
        Some(create) => unsafe { create(DOMAIN.as_ptr()) },
        None => null_mut(),
    };
    let domain = Handle(domain);
    // SAFETY: the type NVTX gives CORE2's DomainRegisterStringA.
    let register = unsafe { core2::<DomainRegisterStringA>(CORE2_DOMAIN_REGISTER_STRING_A) };
    let names = NAMES
        .iter()
        .map(|&n| {
            let handle = match register {
                // SAFETY: the tool's handler, with its domain and a C string.
                Some(register) => unsafe { register(domain.0, n.as_ptr()) },
                None => null_mut(),
            };
            (n, Handle(handle))
        })
        .collect();
    Some(Nvtx {
        _tool: tool,
        domain,
        names,
    })
}

/// NVTX if a tool is attached.
pub fn get() -> Option<&'static Nvtx> {
    NVTX.get_or_init(load).as_ref()
}

impl Nvtx {
    /// Opens a range named `name` in the `oxccl` domain.
    pub fn start(&'static self, name: &str) -> NvtxRange {
        // SAFETY: the type NVTX gives CORE2's DomainRangeStartEx.
        let Some(start) = (unsafe { core2::<DomainRangeStartEx>(CORE2_DOMAIN_RANGE_START_EX) })
        else {
            // NVTX's no-op returns range id 0.
            return NvtxRange { nvtx: self, id: 0 };
        };
        let registered = self
            .names
            .iter()
            .find(|(n, h)| n.to_bytes() == name.as_bytes() && !h.0.is_null());
        let id = match registered {
            Some((_, h)) => {
                let a = EventAttributes::message(MESSAGE_TYPE_REGISTERED, h.0.cast_const());
                // SAFETY: the tool's handler, with its domain and attributes
                // that live for the call.
                unsafe { start(self.domain.0, &a) }
            }
            None => {
                // NCCL's names are C strings, so a NUL inside one cannot
                // happen; cut there if it ever does. A tool that gave no
                // handle for a registered name gets the text instead.
                let cut = name.split('\0').next().unwrap_or_default();
                let c = CString::new(cut).unwrap_or_default();
                let a = EventAttributes::message(MESSAGE_TYPE_ASCII, c.as_ptr().cast());
                // SAFETY: as above; `c` outlives the call, and the tool
                // copies what it keeps.
                unsafe { start(self.domain.0, &a) }
            }
        };
        NvtxRange { nvtx: self, id }
    }
}

/// Closes a range opened by [`Nvtx::start`] (`nvtxDomainRangeEnd`).
pub fn end(range: NvtxRange) {
    drop(range)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables a tool sees: NVTX's module ids and slot counts (those
    /// tests/nvtx_tool.c and Nsight Systems rely on), entry `i` at slot `i`,
    /// null at 0 and past the end, and nothing for other modules.
    #[test]
    fn export_tables_are_nvtx3s() {
        let modules: [(c_int, usize, &[Slot]); 6] = [
            (1, 16, &CORE_SLOTS),
            (2, 9, &CUDA_SLOTS),
            (3, 15, &OPENCL_SLOTS),
            (4, 7, &CUDART_SLOTS),
            (5, 16, &CORE2_SLOTS),
            (6, 7, &SYNC_SLOTS),
        ];
        let callbacks = get_export_table(1).cast::<ExportTableCallbacks>();
        assert!(!callbacks.is_null());
        // SAFETY: the getter's answer for id 1 is `CALLBACKS`.
        let callbacks = unsafe { &*callbacks };
        assert_eq!(callbacks.struct_size, 16);
        for (module, size, slots) in modules {
            let mut table: FunctionTable = null_mut();
            let mut n: c_uint = 0;
            // SAFETY: valid out-pointers.
            let ok = unsafe { (callbacks.get_module_function_table)(module, &mut table, &mut n) };
            assert_eq!((ok, n as usize), (1, size), "module {module}");
            assert_eq!(slots.len(), size);
            // SAFETY: NVTX's tables have `size + 1` entries.
            let entries = unsafe { std::slice::from_raw_parts(table, size + 1) };
            assert!(entries[0].is_null() && entries[size].is_null());
            for (entry, slot) in entries.iter().zip(slots).take(size).skip(1) {
                assert_eq!(entry.cast_const(), std::ptr::from_ref(slot));
            }
            // SAFETY: null out-pointers are allowed.
            let ok =
                unsafe { (callbacks.get_module_function_table)(module, null_mut(), null_mut()) };
            assert_eq!(ok, 1);
        }
        for module in [0, 7, -1] {
            let mut n: c_uint = 99;
            // SAFETY: valid out-pointers.
            let ok = unsafe { (callbacks.get_module_function_table)(module, null_mut(), &mut n) };
            assert_eq!((ok, n), (0, 99));
        }
        let info = get_export_table(3).cast::<ExportTableVersionInfo>();
        assert!(!info.is_null());
        // SAFETY: the getter's answer for id 3 is `VERSION_INFO`.
        let info = unsafe { &*info };
        assert_eq!((info.struct_size, info.version, info.reserved0), (24, 3, 0));
        (info.set_injection_nvtx_version)(3);
        for id in [0, 2, 4, 0x7fff_ffff] {
            assert!(get_export_table(id).is_null(), "export table {id}");
        }
    }

    /// NVTX3's loader codes for a tool that is missing, has no entry point,
    /// or is not named.
    #[test]
    fn unusable_tools_give_nvtx_error_codes() {
        let missing = OsStr::new("/nonexistent/liboxccl-no-such-tool.so");
        assert_eq!(initialize_injection(missing).err(), Some(4));
        // Loaded already and harmless to load again, but no entry point.
        assert_eq!(initialize_injection(OsStr::new("libc.so.6")).err(), Some(5));
        assert_eq!(initialize_injection(OsStr::new("")).err(), Some(7));
    }

    /// A tool whose entry point returns 0 (the stand-in of tests/nvtx.rs
    /// does without its log variable) gives NVTX's code and is unloaded.
    #[test]
    fn a_refusing_tool_is_unloaded() {
        if std::env::var_os("OXCCL_NVTX_LOG").is_some() {
            eprintln!("skipped: OXCCL_NVTX_LOG is set, so the stand-in would attach");
            return;
        }
        let dir = std::env::temp_dir().join(format!("oxccl-nvtx-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tool = dir.join("liboxccl_nvtx_refusing_tool.so");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/nvtx_tool.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = std::process::Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&tool)
            .args([src, "-lpthread"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e} (install gcc)"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(initialize_injection(tool.as_os_str()).err(), Some(6));
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(
            !maps.contains("liboxccl_nvtx_refusing_tool"),
            "still mapped"
        );
        assert!(CORE2_SLOTS
            .iter()
            .all(|s| s.load(Ordering::Relaxed).is_null()));
        std::fs::remove_dir_all(&dir).ok();
    }
}
