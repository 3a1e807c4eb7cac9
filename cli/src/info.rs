//! `oxccl info`: every setting with its value and source, the networks
//! linked in with their devices, and the interfaces found.

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
    println!("\n## Net plugin library (NCCL_NET_PLUGIN)");
    let tried = oxccl::plugin::net::candidates(cfg.net_plugin.as_deref());
    println!(
        "  searched: {}",
        if tried.is_empty() {
            "nothing (none)".to_string()
        } else {
            tried.join(", ")
        }
    );
    match oxccl::plugin::net::load(cfg.net_plugin.as_deref()) {
        Ok((_, outcome)) => println!("  result: {outcome:?}"),
        Err(e) => println!("  result: {e}"),
    }
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
