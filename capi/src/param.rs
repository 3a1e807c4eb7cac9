//! NCCL 2.30's parameter API over oxccl's settings: the keys are the
//! variables `oxccl info` lists (`NCCL_CHUNK_SIZE`, ...), with the values
//! it shows, resolved from the environment, the configuration file and the
//! defaults at each call (what a communicator created now would use).
//!
//! Where oxccl differs from NCCL: NCCL's parameters carry a C type and its
//! typed getters refuse any other; oxccl keeps every setting as text, so a
//! typed getter parses the text (digits with an optional K/M/G suffix, as
//! oxccl reads sizes) and refuses what is not an integer or does not fit,
//! and `ncclParamGet` copies the text with its NUL. Every setting is listed
//! (NCCL lists only its documented ones unless `NCCL_PARAM_DUMP_ALL` is
//! set; oxccl has no undocumented ones).

use std::cell::RefCell;
use std::ffi::CString;
use std::io::Write as _;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::{LazyLock, Once};

use oxccl::config::{Config, ParamDef, PARAMS};
use oxccl::Error;

use crate::comm::out as put;
use crate::guard::{entry, ok, Outcome};
use crate::types::*;

/// What a handle points at: one setting, under its NCCL name.
struct Slot {
    def: ParamDef,
    name: CString,
}

/// Built once and never changed: a handle stays valid for the life of the
/// process, as NCCL's (owned by the library, never freed by the caller).
static SLOTS: LazyLock<Vec<Slot>> = LazyLock::new(|| {
    PARAMS
        .iter()
        .map(|d| Slot {
            def: *d,
            name: CString::new(d.env_name()).expect("setting names hold no NUL"),
        })
        .collect()
});

thread_local! {
    // One buffer per call that hands out a string, each replaced only by
    // the next call of the same function on the same thread: NCCL's
    // lifetime rule for each of them.
    static STR_OUT: RefCell<CString> = RefCell::new(CString::default());
    static PARAMETER_OUT: RefCell<CString> = RefCell::new(CString::default());
    static KEY_TABLE: RefCell<Vec<*const c_char>> = const { RefCell::new(Vec::new()) };
}

/// The calls that can come before any other of the library's install its
/// logger, so that their refusals are logged as NCCL_DEBUG asks.
fn logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(oxccl::log::init);
}

fn key_arg(key: *const c_char) -> Result<String, Error> {
    crate::comm::c_str(key).ok_or_else(|| Error::InvalidArgument("key is NULL".into()))
}

fn find(key: &str) -> Result<&'static Slot, Error> {
    if let Some(s) = SLOTS.iter().find(|s| s.name.as_bytes() == key.as_bytes()) {
        return Ok(s);
    }
    // NCCL's keys are the variables' full names; a bare one is a likely slip.
    let hint = SLOTS
        .iter()
        .find(|s| s.def.key == key)
        .map(|s| format!(" (did you mean {:?}?)", s.name))
        .unwrap_or_default();
    Err(Error::InvalidArgument(format!(
        "unknown parameter {key:?}{hint}: oxccl's parameters are the NCCL_ variables `oxccl info` lists"
    )))
}

fn slot_of(h: ncclParamHandle_t) -> Result<&'static Slot, Error> {
    if h.is_null() {
        return Err(Error::InvalidArgument("handle is NULL".into()));
    }
    SLOTS
        .iter()
        .find(|s| std::ptr::eq(*s as *const Slot, h as *const Slot))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "handle {:p} was not made by ncclParamBind",
                h as *const ncclParamHandle
            ))
        })
}

fn name_of(slot: &Slot) -> String {
    slot.def.env_name()
}

/// The setting's value as `oxccl info` would show it now ("" when unset).
fn value_of(slot: &Slot) -> Result<String, Error> {
    let cfg = Config::load()?;
    let value = cfg
        .entries()
        .find(|e| e.def.key == slot.def.key)
        .map(|e| e.value.clone());
    value.ok_or_else(|| Error::Internal(format!("{} is declared but not resolved", name_of(slot))))
}

/// An integer as oxccl reads settings: optional sign, digits, optional
/// K/M/G (powers of 1024).
fn parse_int(name: &str, text: &str) -> Result<i128, Error> {
    let t = text.trim();
    if t.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{name} is unset and has no default: there is no integer to read (ncclParamGetStr reads it as \"\")"
        )));
    }
    let not_int = || {
        Error::InvalidArgument(format!(
            "{name} is {text:?}, not an integer (digits, with an optional sign and K, M or G suffix)"
        ))
    };
    let (neg, rest) = match t.as_bytes()[0] {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    let (digits, mult): (&str, i128) = match rest.char_indices().last() {
        Some((i, 'k' | 'K')) => (&rest[..i], 1 << 10),
        Some((i, 'm' | 'M')) => (&rest[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&rest[..i], 1 << 30),
        _ => (rest, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(not_int());
    }
    let n: u64 = digits.parse().map_err(|_| {
        Error::InvalidArgument(format!("{name} is {text:?}, beyond any 64-bit integer"))
    })?;
    let v = i128::from(n) * mult;
    Ok(if neg { -v } else { v })
}

/// The C integer types the typed getters write.
trait Int: TryFrom<i128> + Copy {
    const MIN: i128;
    const MAX: i128;
}

macro_rules! int {
    ($($t:ty),*) => {
        $(impl Int for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
        })*
    };
}

int!(i8, i16, i32, i64, u8, u16, u32, u64);

/// Reads the bound setting as an integer of C type `ctype`.
fn get_int<T: Int>(h: ncclParamHandle_t, dst: *mut T, ctype: &str) -> Outcome {
    let slot = slot_of(h)?;
    if dst.is_null() {
        return Err(Error::InvalidArgument("out is NULL".into()));
    }
    let name = name_of(slot);
    let text = value_of(slot)?;
    let v = parse_int(&name, &text)?;
    let x = T::try_from(v).map_err(|_| {
        Error::InvalidArgument(format!(
            "{name} is {text:?} ({v}), which does not fit in {ctype} ({}..={}): read it with a wider getter",
            T::MIN,
            T::MAX
        ))
    })?;
    put("out", dst, x)?;
    ok()
}

#[no_mangle]
pub extern "C" fn ncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t {
    entry("ncclParamBind", || {
        logging();
        let slot = find(&key_arg(key)?)?;
        let h = slot as *const Slot as ncclParamHandle_t;
        put("out", out, h)?;
        ok()
    })
}

// Written out one by one (not by a macro) so that cbindgen sees each.

#[no_mangle]
pub extern "C" fn ncclParamGetI8(h: ncclParamHandle_t, out: *mut i8) -> ncclResult_t {
    entry("ncclParamGetI8", || get_int(h, out, "int8_t"))
}

#[no_mangle]
pub extern "C" fn ncclParamGetI16(h: ncclParamHandle_t, out: *mut i16) -> ncclResult_t {
    entry("ncclParamGetI16", || get_int(h, out, "int16_t"))
}

#[no_mangle]
pub extern "C" fn ncclParamGetI32(h: ncclParamHandle_t, out: *mut i32) -> ncclResult_t {
    entry("ncclParamGetI32", || get_int(h, out, "int32_t"))
}

#[no_mangle]
pub extern "C" fn ncclParamGetI64(h: ncclParamHandle_t, out: *mut i64) -> ncclResult_t {
    entry("ncclParamGetI64", || get_int(h, out, "int64_t"))
}

#[no_mangle]
pub extern "C" fn ncclParamGetU8(h: ncclParamHandle_t, out: *mut u8) -> ncclResult_t {
    entry("ncclParamGetU8", || get_int(h, out, "uint8_t"))
}

#[no_mangle]
pub extern "C" fn ncclParamGetU16(h: ncclParamHandle_t, out: *mut u16) -> ncclResult_t {
    entry("ncclParamGetU16", || get_int(h, out, "uint16_t"))
}

#[no_mangle]
pub extern "C" fn ncclParamGetU32(h: ncclParamHandle_t, out: *mut u32) -> ncclResult_t {
    entry("ncclParamGetU32", || get_int(h, out, "uint32_t"))
}

#[no_mangle]
pub extern "C" fn ncclParamGetU64(h: ncclParamHandle_t, out: *mut u64) -> ncclResult_t {
    entry("ncclParamGetU64", || get_int(h, out, "uint64_t"))
}

fn to_c(name: &str, text: String) -> Result<CString, Error> {
    CString::new(text)
        .map_err(|_| Error::InvalidArgument(format!("{name}'s value holds a NUL byte")))
}

/// The value as text; the pointer stays valid until this thread's next
/// `ncclParamGetStr`.
#[no_mangle]
pub extern "C" fn ncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t {
    entry("ncclParamGetStr", || {
        let slot = slot_of(h)?;
        if out.is_null() {
            return Err(Error::InvalidArgument("out is NULL".into()));
        }
        let s = to_c(&name_of(slot), value_of(slot)?)?;
        let p = STR_OUT.with(|b| {
            let mut b = b.borrow_mut();
            *b = s;
            b.as_ptr()
        });
        put("out", out, p)?;
        ok()
    })
}

/// Copies the value's text and its NUL into `out`; `*len` gets the bytes
/// copied, or 0 when `maxLen` is too small (then nothing is copied).
#[no_mangle]
pub extern "C" fn ncclParamGet(
    h: ncclParamHandle_t,
    out: *mut c_void,
    maxLen: c_int,
    len: *mut c_int,
) -> ncclResult_t {
    entry("ncclParamGet", || {
        let slot = slot_of(h)?;
        if out.is_null() || len.is_null() {
            return Err(Error::InvalidArgument(format!(
                "out ({out:p}) and len ({len:p}) must not be NULL"
            )));
        }
        let room = usize::try_from(maxLen)
            .ok()
            .filter(|&m| m > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("maxLen is {maxLen}: it must be at least 1"))
            })?;
        let name = name_of(slot);
        let s = to_c(&name, value_of(slot)?)?;
        let bytes = s.as_bytes_with_nul();
        if bytes.len() > room {
            put("len", len, 0)?;
            return Err(Error::InvalidArgument(format!(
                "{name}'s value takes {} bytes with its NUL; maxLen is {maxLen}",
                bytes.len()
            )));
        }
        // SAFETY: out is non-null and, by NCCL's contract, holds maxLen
        // writable bytes; bytes.len() <= maxLen; a caller's buffer cannot
        // overlap our CString.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len()) };
        put("len", len, bytes.len() as c_int)?;
        ok()
    })
}

/// The value of `key` as text and its length (without the NUL); the
/// pointer stays valid until this thread's next `ncclParamGetParameter`.
/// An unknown key gives NULL and 0, as NCCL.
#[no_mangle]
pub extern "C" fn ncclParamGetParameter(
    key: *const c_char,
    value: *mut *const c_char,
    valueLen: *mut c_int,
) -> ncclResult_t {
    entry("ncclParamGetParameter", || {
        logging();
        if value.is_null() || valueLen.is_null() {
            return Err(Error::InvalidArgument(format!(
                "value ({value:p}) and valueLen ({valueLen:p}) must not be NULL"
            )));
        }
        let found = key_arg(key).and_then(|k| find(&k));
        let slot = match found {
            Ok(s) => s,
            Err(e) => {
                put("value", value, std::ptr::null())?;
                put("valueLen", valueLen, 0)?;
                return Err(e);
            }
        };
        let s = to_c(&name_of(slot), value_of(slot)?)?;
        let n = s.as_bytes().len() as c_int;
        let p = PARAMETER_OUT.with(|b| {
            let mut b = b.borrow_mut();
            *b = s;
            b.as_ptr()
        });
        put("value", value, p)?;
        put("valueLen", valueLen, n)?;
        ok()
    })
}

/// Every key, as `oxccl info` lists them. The strings live as long as the
/// process; the table of pointers until this thread's next call.
#[no_mangle]
pub extern "C" fn ncclParamGetAllParameterKeys(
    table: *mut *mut *const c_char,
    tableLen: *mut c_int,
) -> ncclResult_t {
    entry("ncclParamGetAllParameterKeys", || {
        logging();
        if table.is_null() || tableLen.is_null() {
            return Err(Error::InvalidArgument(format!(
                "table ({table:p}) and tableLen ({tableLen:p}) must not be NULL"
            )));
        }
        let (p, n) = KEY_TABLE.with(|t| {
            let mut t = t.borrow_mut();
            t.clear();
            t.extend(SLOTS.iter().map(|s| s.name.as_ptr()));
            (t.as_mut_ptr(), t.len())
        });
        put("table", table, p)?;
        put("tableLen", tableLen, n as c_int)?;
        ok()
    })
}

/// Prints every setting to standard output, as NCCL prints its registry:
/// name, value, where the value came from, default, meaning.
#[no_mangle]
pub extern "C" fn ncclParamDumpAll() {
    // No result to return: a failure can only be logged.
    let _ = entry("ncclParamDumpAll", || {
        logging();
        let text = match Config::load() {
            Ok(cfg) => {
                let mut t = String::from("oxccl parameters (as `oxccl info` lists them)\n");
                for e in cfg.entries() {
                    let shown = |v: &str| {
                        if v.is_empty() {
                            "(unset)".to_string()
                        } else {
                            v.to_string()
                        }
                    };
                    t.push_str(&format!(
                        "{} = {} (from {}; default {})\n    {}\n",
                        e.def.env_name(),
                        shown(&e.value),
                        e.source,
                        shown(e.def.default),
                        e.def.doc.trim()
                    ));
                }
                t
            }
            Err(e) => format!("oxccl parameters: cannot resolve them: {e}\n"),
        };
        // Declared here, not at the top: cbindgen would put it in nccl.h.
        extern "C" {
            fn fflush(stream: *mut c_void) -> c_int;
        }
        // The caller's printf output so far comes first, as it would with
        // NCCL's printf.
        // SAFETY: fflush(NULL) flushes every C stdio stream; it takes no
        // pointer of ours.
        unsafe { fflush(std::ptr::null_mut()) };
        let mut so = std::io::stdout().lock();
        so.write_all(text.as_bytes())
            .and_then(|_| so.flush())
            .map_err(|e| Error::System(format!("writing to standard output: {e}")))?;
        ok()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn bind(key: &str) -> (ncclResult_t, ncclParamHandle_t) {
        let k = CString::new(key).unwrap();
        let mut h: ncclParamHandle_t = std::ptr::null_mut();
        (ncclParamBind(&mut h, k.as_ptr()), h)
    }

    fn resolved(key: &str) -> String {
        Config::load()
            .unwrap()
            .entries()
            .find(|e| e.def.env_name() == key)
            .unwrap()
            .value
            .clone()
    }

    #[test]
    fn integers_as_oxccl_reads_sizes() {
        assert_eq!(parse_int("X", "1M").unwrap(), 1 << 20);
        assert_eq!(parse_int("X", " -12 ").unwrap(), -12);
        assert_eq!(parse_int("X", "+3k").unwrap(), 3072);
        assert_eq!(
            parse_int("X", "18446744073709551615").unwrap(),
            u64::MAX as i128
        );
        for bad in ["", "lo", "1.5", "M", "-", "0x10", "1 2"] {
            let e = parse_int("NCCL_X", bad).unwrap_err();
            assert!(e.to_string().contains("NCCL_X"), "{bad:?}: {e}");
        }
        assert!(parse_int("X", "99999999999999999999")
            .unwrap_err()
            .to_string()
            .contains("64-bit"));
    }

    #[test]
    fn unknown_key_is_named_and_points_at_oxccl_info() {
        let (r, h) = bind("NCCL_NO_SUCH_THING");
        assert_eq!(r, ncclResult_t::ncclInvalidArgument);
        assert!(h.is_null());
        // SAFETY: the library's last-error buffer is NUL-terminated.
        let msg = unsafe { CStr::from_ptr(crate::guard::last_error()) }.to_string_lossy();
        assert!(
            msg.contains("NCCL_NO_SUCH_THING") && msg.contains("oxccl info"),
            "{msg}"
        );
        // NCCL's keys carry the prefix; the bare name is refused with a hint.
        let (r, _) = bind("CHUNK_SIZE");
        assert_eq!(r, ncclResult_t::ncclInvalidArgument);
    }

    #[test]
    fn widths_overflow_and_foreign_handles() {
        let (r, h) = bind("NCCL_CHUNK_SIZE");
        assert_eq!(r, ncclResult_t::ncclSuccess);
        let want = parse_int("NCCL_CHUNK_SIZE", &resolved("NCCL_CHUNK_SIZE")).unwrap();
        let mut v64 = 0i64;
        assert_eq!(ncclParamGetI64(h, &mut v64), ncclResult_t::ncclSuccess);
        assert_eq!(i128::from(v64), want);
        if want > 127 {
            let mut v8 = 0i8;
            assert_eq!(
                ncclParamGetI8(h, &mut v8),
                ncclResult_t::ncclInvalidArgument
            );
        }
        let bogus = 0x10 as ncclParamHandle_t;
        assert_eq!(
            ncclParamGetI64(bogus, &mut v64),
            ncclResult_t::ncclInvalidArgument
        );
        // Same key, same handle: owned by the library, never freed.
        assert_eq!(bind("NCCL_CHUNK_SIZE").1, h);
    }

    /// NCCL's promise for ncclParamGetStr: the string lives until the next
    /// ncclParamGetStr on the same thread. Binds, the other getters, the
    /// key-based calls and other threads' ncclParamGetStr leave it alone.
    #[test]
    fn string_outlives_binds_and_other_calls() {
        let (_, h) = bind("NCCL_CHUNK_SIZE");
        let mut p: *const c_char = std::ptr::null();
        assert_eq!(ncclParamGetStr(h, &mut p), ncclResult_t::ncclSuccess);
        let want = resolved("NCCL_CHUNK_SIZE");
        let mut table: *mut *const c_char = std::ptr::null_mut();
        let mut n = 0;
        assert_eq!(
            ncclParamGetAllParameterKeys(&mut table, &mut n),
            ncclResult_t::ncclSuccess
        );
        assert_eq!(n as usize, PARAMS.len());
        for i in 0..n as usize {
            // SAFETY: the table holds n pointers to NUL-terminated keys.
            let key = unsafe { CStr::from_ptr(*table.add(i)) };
            let (r, hk) = bind(key.to_str().unwrap());
            assert_eq!(r, ncclResult_t::ncclSuccess, "{key:?}");
            let mut x = 0u64;
            let _ = ncclParamGetU64(hk, &mut x);
            let mut v: *const c_char = std::ptr::null();
            let mut vl = 0;
            assert_eq!(
                ncclParamGetParameter(key.as_ptr(), &mut v, &mut vl),
                ncclResult_t::ncclSuccess
            );
            let mut buf = [0u8; 512];
            let mut len = 0;
            let _ = ncclParamGet(hk, buf.as_mut_ptr().cast(), buf.len() as c_int, &mut len);
        }
        std::thread::spawn(|| {
            let (_, h2) = bind("NCCL_TIMEOUT");
            let mut q: *const c_char = std::ptr::null();
            assert_eq!(ncclParamGetStr(h2, &mut q), ncclResult_t::ncclSuccess);
        })
        .join()
        .unwrap();
        // SAFETY: the promise under test: p is still this thread's string.
        let still = unsafe { CStr::from_ptr(p) };
        assert_eq!(still.to_str().unwrap(), want);
    }

    #[test]
    fn raw_copy_is_the_text_with_its_nul() {
        let (_, h) = bind("NCCL_CHUNK_SIZE");
        let want = resolved("NCCL_CHUNK_SIZE");
        let mut buf = [0xffu8; 64];
        let mut len = -1;
        assert_eq!(
            ncclParamGet(h, buf.as_mut_ptr().cast(), 64, &mut len),
            ncclResult_t::ncclSuccess
        );
        assert_eq!(len as usize, want.len() + 1);
        assert_eq!(&buf[..want.len()], want.as_bytes());
        assert_eq!(buf[want.len()], 0);
        let mut len = -1;
        assert_eq!(
            ncclParamGet(h, buf.as_mut_ptr().cast(), want.len() as c_int, &mut len),
            ncclResult_t::ncclInvalidArgument
        );
        assert_eq!(len, 0);
    }
}
