//! Run-time compilation of the device source to a cubin for one GPU
//! architecture, with template instances picked by name expression.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

use cudarc::nvrtc::sys;

use crate::error::{Error, Result};

/// The NVRTC entry points used here, checked once (cudarc panics on a
/// missing one).
const SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcAddNameExpression",
    "nvrtcCompileProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetLoweredName",
    "nvrtcDestroyProgram",
];

fn library() -> Result<()> {
    static LIB: OnceLock<Result<()>> = OnceLock::new();
    LIB.get_or_init(|| {
        // SAFETY: only tries to open the library by its usual names.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::System(
                "NVRTC (libnvrtc.so) not found: install the CUDA toolkit's runtime compiler or add its lib directory to LD_LIBRARY_PATH".into(),
            ));
        }
        // SAFETY: the library was found; `get` only looks a name up.
        let missing: Vec<&str> = SYMBOLS
            .iter()
            .copied()
            .filter(|s| unsafe { sys::culib().get::<*const ()>(s.as_bytes()) }.is_err())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Error::System(format!("NVRTC lacks {}: too old", missing.join(", "))))
        }
    })
    .clone()
}

fn check(r: sys::nvrtcResult, what: &str) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::System(format!("{what}: {r:?}")))
    }
}

/// NVRTC's version as (major, minor).
pub fn version() -> Result<(i32, i32)> {
    library()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    check(
        // SAFETY: valid out-pointers.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) },
        "nvrtcVersion",
    )?;
    Ok((major, minor))
}

/// A compiled program: the cubin and each name expression's symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    /// (name expression, lowered symbol), in the order asked.
    pub symbols: Vec<(String, String)>,
}

impl Compiled {
    pub fn symbol(&self, expr: &str) -> Option<&str> {
        self.symbols
            .iter()
            .find(|(e, _)| e == expr)
            .map(|(_, s)| s.as_str())
    }
}

/// A program handle, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram, destroyed once.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Internal(format!("{s:?} contains a NUL")))
}

/// Compiles `source` to a cubin for `sm_{major}{minor}` with `options`,
/// instantiating every name expression in `names`.
pub fn compile(
    source: &str,
    file: &str,
    arch: (i32, i32),
    names: &[String],
    options: &[&str],
) -> Result<Compiled> {
    library()?;
    let src = cstring(source)?;
    let file = cstring(file)?;
    let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
    check(
        // SAFETY: valid out-pointer; NUL-terminated strings; no headers.
        unsafe {
            sys::nvrtcCreateProgram(
                &mut raw,
                src.as_ptr(),
                file.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let prog = Program(raw);
    let cnames = names
        .iter()
        .map(|n| cstring(n))
        .collect::<Result<Vec<_>>>()?;
    for n in &cnames {
        check(
            // SAFETY: live program, NUL-terminated string.
            unsafe { sys::nvrtcAddNameExpression(prog.0, n.as_ptr()) },
            "nvrtcAddNameExpression",
        )?;
    }
    let mut opts = vec![cstring(&format!(
        "--gpu-architecture=sm_{}{}",
        arch.0, arch.1
    ))?];
    for o in options {
        opts.push(cstring(o)?);
    }
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: live program; the option array and its strings outlive the call.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::System(format!(
            "NVRTC could not compile the kernels for sm_{}{} ({r:?}):\n{}",
            arch.0,
            arch.1,
            log(&prog)
        )));
    }
    let mut size = 0usize;
    check(
        // SAFETY: live, compiled program; valid out-pointer.
        unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) },
        "nvrtcGetCUBINSize",
    )?;
    let mut cubin = vec![0u8; size];
    check(
        // SAFETY: the buffer holds `size` bytes as the call requires.
        unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) },
        "nvrtcGetCUBIN",
    )?;
    let mut symbols = Vec::with_capacity(names.len());
    for (n, c) in names.iter().zip(&cnames) {
        let mut lowered: *const c_char = std::ptr::null();
        check(
            // SAFETY: live program; the expression was added before compiling.
            unsafe { sys::nvrtcGetLoweredName(prog.0, c.as_ptr(), &mut lowered) },
            "nvrtcGetLoweredName",
        )?;
        // SAFETY: NVRTC returns a NUL-terminated string owned by the
        // program, copied here before the program is destroyed.
        let s = unsafe { CStr::from_ptr(lowered) }
            .to_string_lossy()
            .into_owned();
        symbols.push((n.clone(), s));
    }
    Ok(Compiled { cubin, symbols })
}

fn log(prog: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: live program; valid out-pointer.
    if unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return String::new();
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: the buffer holds `size` bytes as the call requires.
    if unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr().cast()) }
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return String::new();
    }
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .to_string()
}
