//! Logging through `tracing`, configured by NCCL's variables.
//!
//! `NCCL_DEBUG` sets the level (VERSION and WARN → warn, INFO → info,
//! TRACE → trace); `NCCL_DEBUG_SUBSYS` picks subsystems (INIT, COLL, P2P,
//! NET, BOOTSTRAP, ENV, ALL; a leading `^` excludes). Subsystems map onto
//! targets `oxccl::<subsys>`. The library installs no subscriber by itself:
//! the CLI and the C ABI call [`init`].

use tracing_subscriber::filter::EnvFilter;

/// The tracing filter directive for NCCL_DEBUG / NCCL_DEBUG_SUBSYS values.
pub fn directive(debug: Option<&str>, subsys: Option<&str>) -> String {
    let level = match debug.map(|s| s.trim().to_ascii_uppercase()).as_deref() {
        None | Some("") => return "warn".into(),
        Some("VERSION") | Some("WARN") => "warn",
        Some("INFO") => "info",
        Some("ABORT") => "error",
        Some("TRACE") => "trace",
        Some(_) => "warn",
    };
    let subsys = subsys
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("INIT,BOOTSTRAP,ENV");
    let (exclude, list) = match subsys.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, subsys),
    };
    let names: Vec<String> = list
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    if names.iter().any(|n| n == "all") {
        return if exclude {
            "warn".into()
        } else {
            format!("warn,oxccl={level}")
        };
    }
    if exclude {
        let mut d = format!("warn,oxccl={level}");
        for n in names {
            d += &format!(",oxccl::{n}=warn");
        }
        d
    } else {
        let mut d = "warn".to_string();
        for n in names {
            d += &format!(",oxccl::{n}={level}");
        }
        d
    }
}

/// Installs a subscriber writing to stderr (or `NCCL_DEBUG_FILE`'s path is
/// not supported yet) from the environment. Does nothing if one exists.
pub fn init() {
    let cfg = crate::config::Config::load().ok();
    let d = directive(
        cfg.as_ref().and_then(|c| c.debug.as_deref()),
        cfg.as_ref().and_then(|c| c.debug_subsys.as_deref()),
    );
    let filter = EnvFilter::try_new(d).unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::directive;

    #[test]
    fn levels_and_subsystems() {
        assert_eq!(directive(None, None), "warn");
        assert_eq!(directive(Some("INFO"), Some("ALL")), "warn,oxccl=info");
        assert_eq!(
            directive(Some("INFO"), Some("NET,COLL")),
            "warn,oxccl::net=info,oxccl::coll=info"
        );
        assert_eq!(
            directive(Some("TRACE"), Some("^NET")),
            "warn,oxccl=trace,oxccl::net=warn"
        );
    }
}
