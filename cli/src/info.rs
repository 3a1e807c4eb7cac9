//! `oxccl info`: every setting with its value and source; for each plugin
//! type (net, tuner, profiler) what was searched, what was found, the ABI
//! version negotiated or why the library was refused; the networks linked
//! in with their devices, and the interfaces found.

use oxccl::config::Config;

pub fn main() -> Result<i32, String> {
    let cfg = Config::load().map_err(|e| e.to_string())?;
    println!("oxccl {} (NCCL API 2.28)", env!("CARGO_PKG_VERSION"));
    println!("\n## Settings (value, source)");
    for e in cfg.entries() {
        let v = if e.value.is_empty() {
            "(unset)"
        } else {
            &e.value
        };
        println!(
            "  {:<28} {:<20} {:<10} {}",
            e.def.env_name(),
            v,
            e.source.to_string(),
            e.def.doc
        );
    }
    use oxccl::plugin::{net, profiler, tuner};
    println!("\n## Net plugin (NCCL_NET_PLUGIN)");
    match net::load(cfg.net_plugin.as_deref()) {
        Ok((_, o)) => match o {
            net::Outcome::NotFound { searched } => not_found(&searched, "the built-in network"),
            net::Outcome::Loaded {
                library,
                version,
                searched,
            } => loaded(&searched, &library, &format!("ncclNetPlugin_{version}")),
            net::Outcome::Refused {
                library,
                reason,
                searched,
            } => refused(&searched, &library, &reason, "the built-in network"),
        },
        Err(e) => println!("  error: {e}"),
    }
    println!(
        "  looks for: {}",
        net::SYMBOLS
            .iter()
            .map(|s| s.0)
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (name, abi) in net::builtin_abis() {
        println!("  built-in {name}: called through {abi}");
    }
    println!("\n## Tuner plugin (NCCL_TUNER_PLUGIN)");
    match tuner::load(cfg.tuner_plugin.as_deref(), net::opened_library()) {
        Ok((_, o)) => match o {
            tuner::Outcome::NotFound { searched } => not_found(&searched, "the cost model alone"),
            tuner::Outcome::Loaded {
                library,
                version,
                searched,
            } => loaded(&searched, &library, &format!("ncclTunerPlugin_{version}")),
            tuner::Outcome::Refused {
                library,
                reason,
                searched,
            } => refused(&searched, &library, &reason, "the cost model alone"),
        },
        Err(e) => println!("  error: {e}"),
    }
    println!(
        "  looks for: {}",
        tuner::SYMBOLS
            .iter()
            .map(|s| s.0)
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("\n## Profiler plugin (NCCL_PROFILER_PLUGIN)");
    match profiler::load(cfg.profiler_plugin.as_deref()) {
        Ok((_, o)) => match o {
            profiler::Outcome::NotFound { searched } => not_found(&searched, "no profiler"),
            profiler::Outcome::Loaded {
                library,
                version,
                searched,
            } => loaded(&searched, &library, &format!("ncclProfiler_{version}")),
            profiler::Outcome::Refused {
                library,
                reason,
                searched,
            } => refused(&searched, &library, &reason, "no profiler"),
        },
        Err(e) => println!("  error: {e}"),
    }
    println!(
        "  looks for: {}",
        profiler::SYMBOLS
            .iter()
            .map(|s| s.0)
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("\n## Networks linked in");
    for b in oxccl_plugin_list() {
        println!("  {b}");
    }
    println!("\n## Interfaces");
    match oxccl_netif::list() {
        Ok(all) => {
            for i in all {
                println!("  {:<10} {}/{}", i.name, i.addr, i.prefix_len);
            }
        }
        Err(e) => println!("  {e}"),
    }
    Ok(0)
}

fn oxccl_plugin_list() -> Vec<String> {
    oxccl::net_summary()
}

fn searched(list: &[String]) {
    println!(
        "  searched: {}",
        if list.is_empty() {
            "nothing (disabled by none)".to_string()
        } else {
            list.join(", ")
        }
    );
}

fn not_found(list: &[String], instead: &str) {
    searched(list);
    if list.is_empty() {
        println!("  found: nothing (disabled); using {instead}");
    } else {
        println!("  found: none (not on the library search path); using {instead}");
    }
}

fn loaded(list: &[String], library: &str, version: &str) {
    searched(list);
    println!("  found: {library}");
    println!("  ABI version: {version}");
}

fn refused(list: &[String], library: &str, reason: &str, instead: &str) {
    searched(list);
    println!("  found: {library}");
    println!("  refused: {reason}; using {instead}");
}
