//! The tuner ABI versions, newest first: the one list from which both the
//! loader's symbol table, vtable and cast ([`super::load`]) and the statics
//! a plugin exports ([`crate::export_tuner_plugin!`]) are generated. A new
//! version is one line here, its frozen file in [`super::abi`] and its
//! arms on each side.

/// Calls the macro named by the first group with the tokens after it and
/// then one entry per version, newest first:
/// `[number, symbol, abi module, vtable type, loader variant, export fn]`.
#[doc(hidden)]
#[macro_export]
macro_rules! tuner_versions {
    (($($callback:tt)*) $($before:tt)*) => {
        $($callback)*! {
            $($before)*
            [6, ncclTunerPlugin_v6, v6, TunerV6, V6, vtable_v6]
            [5, ncclTunerPlugin_v5, v5, TunerV5, V5, vtable_v5]
            [4, ncclTunerPlugin_v4, v4, TunerV4, V4, vtable_v4]
            [3, ncclTunerPlugin_v3, v3, TunerV3, V3, vtable_v3]
            [2, ncclTunerPlugin_v2, v2, TunerV2, V2, vtable_v2]
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
                "tuner v{}",
                $n
            );)*
        };
    }

    #[test]
    fn each_version_names_the_symbol_of_its_frozen_file() {
        crate::tuner_versions!((symbols_match_the_frozen_files));
    }
}
