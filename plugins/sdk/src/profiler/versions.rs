//! The profiler ABI versions, newest first: the one list from which both
//! the loader's symbol table and cast ([`super::load`]) and the statics a
//! plugin exports ([`crate::export_profiler_plugin!`]) are generated. A new
//! version is one line here, its frozen file in [`super::abi`] and its
//! adapters on each side.

/// Calls the macro named by the first group with the tokens after it and
/// then one entry per version, newest first:
/// `[number, symbol, abi module, vtable type, loader variant, export fn]`.
#[doc(hidden)]
#[macro_export]
macro_rules! profiler_versions {
    (($($callback:tt)*) $($before:tt)*) => {
        $($callback)*! {
            $($before)*
            [7, ncclProfiler_v7, v7, ProfilerV7, V7, vtable_v7]
            [6, ncclProfiler_v6, v6, ProfilerV6, V6, vtable_v6]
            [5, ncclProfiler_v5, v5, ProfilerV5, V5, vtable_v5]
            [4, ncclProfiler_v4, v4, ProfilerV4, V4, vtable_v4]
            [3, ncclProfiler_v3, v3, ProfilerV3, V3, vtable_v3]
            [2, ncclProfiler_v2, v2, ProfilerV2, V2, vtable_v2]
            [1, ncclProfiler_v1, v1, ProfilerV1, V1, vtable_v1]
        }
    };
}

#[cfg(test)]
mod tests {
    use super::super::abi::*;

    macro_rules! symbols_match_the_frozen_files {
        ($([$n:literal, $sym:ident, $m:ident, $ty:ident, $var:ident, $f:ident])*) => {
            $(assert_eq!(
                $m::SYMBOL,
                concat!(stringify!($sym), "\0").as_bytes(),
                "profiler v{}",
                $n
            );)*
        };
    }

    #[test]
    fn each_version_names_the_symbol_of_its_frozen_file() {
        crate::profiler_versions!((symbols_match_the_frozen_files));
    }
}
