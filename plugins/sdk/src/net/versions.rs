//! The net ABI versions, newest first: the one list from which the
//! loader's symbol table ([`super::load::SYMBOLS`]), the casts of a
//! symbol's address to its vtable ([`super::abi::LOADABLE`],
//! [`super::abi::collnet::COLL_LOADABLE`]) and the statics a plugin exports
//! ([`crate::export_net_plugin!`]) are all generated. A new version is one
//! line here, its frozen file in [`super::abi`] and its conversions there.

/// Calls the macro named by the first group with the tokens after it and
/// then one entry per version, newest first:
/// `[number, net symbol, collnet symbol, abi module, net vtable type,
/// collnet vtable type, export, NCCLs that load it]`, where `export` is
/// `newest` (exported as the glue's own vtable), `older` (exported through
/// its file's `exported` conversion) or `load` (loaded, not exported).
#[doc(hidden)]
#[macro_export]
macro_rules! net_versions {
    (($($callback:tt)*) $($before:tt)*) => {
        $($callback)*! {
            $($before)*
            [12, ncclNetPlugin_v12, ncclCollNetPlugin_v12, v12, NetV12, CollNetV12, newest, "NCCL 2.30"]
            [11, ncclNetPlugin_v11, ncclCollNetPlugin_v11, v11, NetV11, CollNetV11, older, "NCCL 2.28 and 2.30"]
            [10, ncclNetPlugin_v10, ncclCollNetPlugin_v10, v10, NetV10, CollNetV10, older, "NCCL 2.28 and 2.30"]
            [9, ncclNetPlugin_v9, ncclCollNetPlugin_v9, v9, NetV9, CollNetV9, older, "NCCL 2.24 onwards"]
            [8, ncclNetPlugin_v8, ncclCollNetPlugin_v8, v8, NetV8, CollNetV8, older, "NCCL 2.19 to 2.30"]
            [7, ncclNetPlugin_v7, ncclCollNetPlugin_v7, v7, NetV7, CollNetV7, load, "NCCL 2.28 and 2.30"]
            [6, ncclNetPlugin_v6, ncclCollNetPlugin_v6, v6, NetV6, CollNetV6, load, "NCCL 2.28 and 2.30"]
        }
    };
}

#[cfg(test)]
mod tests {
    use super::super::abi::*;

    macro_rules! symbols_match_the_frozen_files {
        ($([$n:literal, $sym:ident, $coll:ident, $m:ident, $ty:ident, $cty:ident,
            $export:ident, $nccl:literal])*) => {
            $(
                assert_eq!($m::SYMBOL, concat!(stringify!($sym), "\0").as_bytes(), "net v{}", $n);
                assert_eq!(
                    $m::COLLNET_SYMBOL,
                    concat!(stringify!($coll), "\0").as_bytes(),
                    "collnet v{}",
                    $n
                );
            )*
        };
    }

    #[test]
    fn each_version_names_the_symbols_of_its_frozen_file() {
        crate::net_versions!((symbols_match_the_frozen_files));
    }

    /// The loader's tables hold every listed version, newest first.
    #[test]
    fn the_loader_tables_follow_the_list() {
        let net: Vec<(&str, u32)> = LOADABLE.iter().map(|l| (l.symbol, l.version)).collect();
        let coll: Vec<u32> = collnet::COLL_LOADABLE.iter().map(|l| l.version).collect();
        let symbols: Vec<(&str, Option<u32>)> = crate::net::load::SYMBOLS.to_vec();
        assert_eq!(coll, [12, 11, 10, 9, 8, 7, 6]);
        assert_eq!(
            net.iter().map(|&(s, v)| (s, Some(v))).collect::<Vec<_>>(),
            symbols
        );
        assert_eq!(net[0], ("ncclNetPlugin_v12", 12));
        assert_eq!(net[6], ("ncclNetPlugin_v6", 6));
    }
}
