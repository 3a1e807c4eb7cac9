//! NCCL's plugin C ABI: one frozen file per interface version (as NCCL
//! keeps `net_v8.h` …) and the scalars they share (`types`); each kind's
//! frozen files and export glue live in its own folder ([`crate::net`],
//! [`crate::profiler`], [`crate::tuner`], [`crate::env`]), re-exported here
//! under the paths plugins and the core already use.

/// The env plugin's frozen layouts, kept in the env's folder.
pub use crate::env::abi as env;
/// The net's frozen layouts, kept in the net's folder.
pub use crate::net::abi as net;
/// The profiler's frozen layouts, kept in the profiler's folder.
pub use crate::profiler::abi as profiler;
pub use crate::tuner::abi as tuner;
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
