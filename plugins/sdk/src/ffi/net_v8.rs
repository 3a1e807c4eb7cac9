//! `ncclNet_v8_t`, under the path the export glue and the core's adapter use.
pub use super::net::v8::*;
