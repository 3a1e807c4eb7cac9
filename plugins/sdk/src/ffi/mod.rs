//! NCCL's plugin C ABI: one frozen file per interface version (as NCCL
//! keeps `net_v8.h` …; `net/`, `tuner/`, `profiler/`, `env`), the scalars they
//! share (`types`), and the glue that exports a Rust [`crate::Net`] through
//! it (`export`), so the same plugin loads into NCCL and oxccl.

pub mod env;
pub mod export;
pub mod export_env;
pub mod export_tuner;
pub mod net;
/// The profiler's frozen layouts, kept in the profiler's folder.
pub use crate::profiler::abi as profiler;
pub mod tuner;
pub mod types;

pub use types::*;

/// Asserts a `#[repr(C)]` type's size, alignment and field offsets, as
/// measured from NCCL's headers; a nested path (`detail.coll.func`) is the
/// offset from the start of the outer struct, as `offsetof` gives it for a
/// member of an anonymous union.
#[cfg(test)]
macro_rules! assert_layout {
    ($t:ty, $size:expr, $align:expr $(, $($field:ident).+ @ $off:expr)* $(,)?) => {{
        assert_eq!(std::mem::size_of::<$t>(), $size, "size of {}", stringify!($t));
        assert_eq!(std::mem::align_of::<$t>(), $align, "align of {}", stringify!($t));
        $(assert_eq!(
            std::mem::offset_of!($t, $($field).+),
            $off,
            "{}.{}",
            stringify!($t),
            stringify!($($field).+)
        );)*
    }};
}
#[cfg(test)]
pub(crate) use assert_layout;
