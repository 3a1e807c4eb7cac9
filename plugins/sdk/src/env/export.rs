//! Exports a Rust [`EnvPlugin`] as NCCL's `ncclEnvPlugin_v1` and `_v2`
//! (NCCL 2.28 loads v1, 2.30 v2; oxccl either). The plugin lives in a
//! [`Slot`] (`crate::env::slot`) the macro declares in the plugin's crate,
//! which its abi_stable root module serves too.
#![allow(unsafe_code)]

pub use crate::env::slot::Slot;
#[cfg(doc)]
use crate::env::EnvPlugin;

/// Exports `$plugin` (an [`EnvPlugin`]) under NCCL's env symbols, and its
/// abi_stable root module ([`crate::env::stable::SYMBOL`]) that oxccl
/// prefers; both serve the one plugin of the library.
#[macro_export]
macro_rules! export_env_plugin {
    ($plugin:ty) => {
        static __OXCCL_ENV_SLOT: $crate::env::export::Slot<$plugin> =
            $crate::env::export::Slot::new();

        impl $crate::env::stable::EnvSlot for $plugin {
            fn slot() -> &'static $crate::env::export::Slot<Self> {
                &__OXCCL_ENV_SLOT
            }
        }

        /// The env plugin's abi_stable root module, which oxccl loads with
        /// the layout of every type checked (NCCL ignores it).
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static oxccl_env_root_module: $crate::abi_stable::library::LibHeader =
            $crate::env::stable::lib_header::<$plugin>();

        unsafe extern "C" fn __oxccl_env_init_v1(
            major: u8,
            minor: u8,
            patch: u8,
            suffix: *const ::std::os::raw::c_char,
        ) -> $crate::ffi::NcclResult {
            // SAFETY: NCCL's arguments (a C string or NULL), no logger.
            unsafe { __OXCCL_ENV_SLOT.init(major, minor, patch, suffix, None) }
        }
        unsafe extern "C" fn __oxccl_env_init_v2(
            major: u8,
            minor: u8,
            patch: u8,
            suffix: *const ::std::os::raw::c_char,
            log: $crate::ffi::Logger,
        ) -> $crate::ffi::NcclResult {
            // SAFETY: NCCL's arguments (a C string or NULL, its logger).
            unsafe { __OXCCL_ENV_SLOT.init(major, minor, patch, suffix, log) }
        }
        unsafe extern "C" fn __oxccl_env_finalize() -> $crate::ffi::NcclResult {
            __OXCCL_ENV_SLOT.finalize()
        }
        unsafe extern "C" fn __oxccl_env_get(
            name: *const ::std::os::raw::c_char,
        ) -> *const ::std::os::raw::c_char {
            // SAFETY: NCCL passes a C string (or NULL, refused inside).
            unsafe { __OXCCL_ENV_SLOT.get(name) }
        }

        /// NCCL's env plugin symbol, version 1 (NCCL 2.28).
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static ncclEnvPlugin_v1: $crate::env::export::Exported<$crate::env::abi::EnvV1> =
            $crate::env::export::Exported($crate::env::abi::EnvV1 {
                name: <$plugin as $crate::env::EnvPlugin>::NAME.as_ptr(),
                init: Some(__oxccl_env_init_v1),
                finalize: Some(__oxccl_env_finalize),
                get_env: Some(__oxccl_env_get),
            });
        /// NCCL's env plugin symbol, version 2 (NCCL 2.30).
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static ncclEnvPlugin_v2: $crate::env::export::Exported<$crate::env::abi::EnvV2> =
            $crate::env::export::Exported($crate::env::abi::EnvV2 {
                name: <$plugin as $crate::env::EnvPlugin>::NAME.as_ptr(),
                init: Some(__oxccl_env_init_v2),
                finalize: Some(__oxccl_env_finalize),
                get_env: Some(__oxccl_env_get),
            });
    };
}

/// An env vtable in a `static`.
#[repr(transparent)]
pub struct Exported<T>(pub T);

// SAFETY: the wrapped vtables hold pointers only to 'static C strings and
// functions, never mutated.
unsafe impl<T> Sync for Exported<T> {}
