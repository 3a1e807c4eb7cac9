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

/// NCCL_DEBUG_FILE's name with NCCL's substitutions: %h host name, %p
/// process id, %% a percent sign (other % sequences are kept as written).
fn debug_file_name(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// Installs a subscriber writing to stderr, or to `NCCL_DEBUG_FILE`, from
/// the environment. Does nothing if one exists.
pub fn init() {
    let cfg = crate::config::Config::load().ok();
    let d = directive(
        cfg.as_ref().and_then(|c| c.debug.as_deref()),
        cfg.as_ref().and_then(|c| c.debug_subsys.as_deref()),
    );
    let filter = EnvFilter::try_new(d).unwrap_or_else(|_| EnvFilter::new("warn"));
    let file = cfg.as_ref().and_then(|c| c.debug_file.as_deref()).map(|p| {
        let name = debug_file_name(p, &host_name(), std::process::id());
        (std::fs::File::create(&name), name)
    });
    match file {
        Some((Ok(f), _)) => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .try_init();
        }
        other => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .try_init();
            // NCCL falls back to stderr too; saying so names the setting.
            if let Some((Err(e), name)) = other {
                tracing::warn!(target: "oxccl::init", "NCCL_DEBUG_FILE={name}: cannot create it ({e}); logging to stderr");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{debug_file_name, directive};

    #[test]
    fn debug_file_substitutions() {
        assert_eq!(
            debug_file_name("/tmp/nccl.%h.%p.log", "node7", 42),
            "/tmp/nccl.node7.42.log"
        );
        assert_eq!(debug_file_name("a%%b%x%", "h", 1), "a%b%x%");
    }

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
