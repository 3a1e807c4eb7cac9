//! The plugin of one library between `init` and `finalize`, which both of
//! its ABIs serve: NCCL's C symbols (`super::export`) and the
//! abi_stable root module (`super::stable`). NCCL's env ABI has no context
//! pointer, so the state is the library's; `getEnv`'s result must stay
//! valid until `finalize` or the next `getEnv` of the same name, so the
//! slot keeps the last value handed out per name.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use crate::env::{EnvPlugin, NcclVersion};
use crate::ffi::types::*;
use crate::logger::NcclLogger;
use crate::plugin_error::{PluginError, PluginResult};

struct State<T> {
    plugin: T,
    logger: NcclLogger,
    /// The last value handed out per name (see the module's comment).
    given: HashMap<String, CString>,
}

/// The plugin of one library, between `init` and `finalize`.
pub struct Slot<T> {
    state: Mutex<Option<State<T>>>,
}

impl<T: EnvPlugin> Default for Slot<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: EnvPlugin> Slot<T> {
    pub const fn new() -> Self {
        Slot {
            state: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<State<T>>> {
        // A panic inside the plugin was caught with the lock held; the
        // state is still whole (nothing is left half-written).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `init` of either version (v1 passes no logger).
    ///
    /// # Safety
    /// `suffix` is NULL or a C string; `log` a valid logger or none.
    pub unsafe fn init(
        &self,
        major: u8,
        minor: u8,
        patch: u8,
        suffix: *const c_char,
        log: Logger,
    ) -> NcclResult {
        let logger = NcclLogger::new(log, NCCL_ENV);
        let suffix: String = if suffix.is_null() {
            String::new()
        } else {
            // SAFETY: non-null: NCCL's C string, valid for the call.
            unsafe { CStr::from_ptr(suffix) }
                .to_string_lossy()
                .into_owned()
        };
        let nccl = NcclVersion {
            major,
            minor,
            patch,
            suffix,
        };
        match self.init_with(&nccl, logger) {
            Ok(()) => NCCL_SUCCESS,
            Err(e) => {
                logger.warn(&format!("env plugin init: {e}"));
                e.code()
            }
        }
    }

    /// `init` of any ABI, the C versions' and the root module's: a panic
    /// is an internal error.
    pub fn init_with(&self, nccl: &NcclVersion, logger: NcclLogger) -> PluginResult<()> {
        match catch_unwind(AssertUnwindSafe(|| T::init(nccl, logger))) {
            Ok(Ok(plugin)) => {
                *self.lock() = Some(State {
                    plugin,
                    logger,
                    given: HashMap::new(),
                });
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(PluginError::Internal(
                "panic inside the plugin (caught at the plugin boundary)".into(),
            )),
        }
    }

    /// `getEnv` returning an owned value (the root module's): `None` when
    /// unset, before `init`, after `finalize` or when the plugin panicked.
    pub fn get_owned(&self, name: &str) -> Option<String> {
        let mut guard = self.lock();
        let state = guard.as_mut()?;
        match catch_unwind(AssertUnwindSafe(|| state.plugin.get(name))) {
            Ok(v) => v,
            Err(_) => {
                let logger = state.logger;
                // Logged without the lock, as in `get`.
                drop(guard);
                logger.warn(&format!(
                    "env plugin getEnv({name}): panic inside the plugin (caught at the plugin boundary); reading it as unset"
                ));
                None
            }
        }
    }

    /// `finalize`: drops the plugin and every string handed out.
    pub fn finalize(&self) -> NcclResult {
        match catch_unwind(AssertUnwindSafe(|| self.lock().take())) {
            Ok(_) => NCCL_SUCCESS,
            Err(_) => NCCL_INTERNAL_ERROR,
        }
    }

    /// `getEnv`: NULL when unset, before `init` or after `finalize`.
    ///
    /// # Safety
    /// `name` is NULL or a C string.
    pub unsafe fn get(&self, name: *const c_char) -> *const c_char {
        if name.is_null() {
            return std::ptr::null();
        }
        // SAFETY: non-null: NCCL's C string, valid for the call.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let mut guard = self.lock();
        let Some(state) = guard.as_mut() else {
            return std::ptr::null();
        };
        let value = catch_unwind(AssertUnwindSafe(|| state.plugin.get(&name)));
        let Ok(value) = value else {
            let logger = state.logger;
            // Logged without the lock: NCCL's logger may read a variable
            // (NCCL_DEBUG) through this plugin on its first call.
            drop(guard);
            logger.warn(&format!(
                "env plugin getEnv({name}): panic inside the plugin (caught at the C boundary); reading it as unset"
            ));
            return std::ptr::null();
        };
        let Some(value) = value else {
            state.given.remove(&name);
            return std::ptr::null();
        };
        // A C string ends at its first NUL; so would NCCL's reading of it.
        let value = value.split('\0').next().unwrap_or_default().to_string();
        let c = CString::new(value).unwrap_or_default();
        // The CString's buffer does not move when the map does; it lives
        // until this name is asked again or the plugin is finalized.
        let p = c.as_ptr();
        state.given.insert(name, c);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed {
        n: u32,
    }
    impl EnvPlugin for Fixed {
        const NAME: &'static CStr = c"fixed-env";
        fn init(nccl: &NcclVersion, _: NcclLogger) -> PluginResult<Self> {
            if nccl.major == 0 {
                return Err(PluginError::InvalidUsage("refuses NCCL 0".into()));
            }
            Ok(Fixed { n: 0 })
        }
        fn get(&mut self, name: &str) -> Option<String> {
            self.n += 1;
            match name {
                "NCCL_A" => Some(format!("a{}", self.n)),
                "NCCL_PANIC" => panic!("asked for NCCL_PANIC"),
                _ => None,
            }
        }
    }

    fn get(slot: &Slot<Fixed>, name: &CStr) -> Option<String> {
        // SAFETY: a C string.
        let p = unsafe { slot.get(name.as_ptr()) };
        // SAFETY: non-null results are the slot's live C strings.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string())
    }

    #[test]
    fn values_live_until_the_same_name_is_asked_again() {
        let slot = Slot::<Fixed>::new();
        assert_eq!(get(&slot, c"NCCL_A"), None, "before init");
        // SAFETY: a C string, no logger.
        let r = unsafe { slot.init(2, 30, 7, c"+x".as_ptr(), None) };
        assert_eq!(r, NCCL_SUCCESS);
        // SAFETY: a C string.
        let first = unsafe { slot.get(c"NCCL_A".as_ptr()) };
        assert_eq!(get(&slot, c"NCCL_B"), None);
        // Another name leaves the first value in place.
        // SAFETY: still valid: NCCL_A was not asked again.
        assert_eq!(unsafe { CStr::from_ptr(first) }, c"a1");
        assert_eq!(get(&slot, c"NCCL_A").as_deref(), Some("a3"));
        assert_eq!(get(&slot, c"NCCL_PANIC"), None, "a panic reads as unset");
        assert_eq!(slot.finalize(), NCCL_SUCCESS);
        assert_eq!(get(&slot, c"NCCL_A"), None, "after finalize");
    }

    #[test]
    fn init_error_is_its_code() {
        let slot = Slot::<Fixed>::new();
        // SAFETY: NULL suffix is accepted; no logger.
        let r = unsafe { slot.init(0, 0, 0, std::ptr::null(), None) };
        assert_eq!(r, NCCL_INVALID_USAGE);
        assert_eq!(get(&slot, c"NCCL_A"), None);
    }
}
