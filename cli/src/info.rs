//! `oxccl info`: every setting with its value and source; for each plugin
//! type (env, net, tuner, profiler) what was searched, what was found, the ABI
//! version negotiated or why the library was refused; the networks linked
//! in with their devices, the interfaces found, and the node's topology
//! (GPUs, what joins each pair, NICs and their PCIe distance to each GPU).
//! `--settings-markdown` prints docs/settings.md from the settings table
//! instead.

use oxccl::config::Config;
use oxccl::topo::{NicKind, Topology};

#[derive(clap::Args, Debug, Default)]
pub struct InfoArgs {
    /// Print docs/settings.md (every setting, its default and meaning, by
    /// subject) from the table in core/src/config/mod.rs, and nothing else.
    #[arg(long)]
    pub settings_markdown: bool,
    /// Print, per collective and size (8 B .. 4 GiB), the algorithm,
    /// protocol and channels oxccl's cost model chooses on the cluster the
    /// flags below describe, beside what NCCL 2.31's tuning model chooses
    /// (our re-implementation of src/tuning/*.cc), and nothing else.
    /// Example: oxccl info --tune --nodes 128 --gpus-per-node 8 --nvlink-gbps 450 --net-gbps 50
    #[arg(long)]
    pub tune: bool,
    /// With --tune: nodes.
    #[arg(long, default_value_t = 16, requires = "tune")]
    pub nodes: usize,
    /// With --tune: GPUs (ranks) per node.
    #[arg(long, default_value_t = 8, requires = "tune")]
    pub gpus_per_node: usize,
    /// With --tune: NVLink GB/s (gigabytes) per GPU, one way.
    #[arg(long, default_value_t = 450.0, requires = "tune")]
    pub nvlink_gbps: f64,
    /// With --tune: network GB/s (gigabytes) per NIC, one way (400 Gb/s: 50).
    #[arg(long, default_value_t = 50.0, requires = "tune")]
    pub net_gbps: f64,
    /// With --tune: NICs per node (default: one per GPU).
    #[arg(long, requires = "tune")]
    pub nics_per_node: Option<usize>,
    /// With --tune: the latency the net plugin reports, microseconds
    /// (NCCL's IB plugin reports 0; oxccl then assumes 20).
    #[arg(long, default_value_t = 0.0, requires = "tune")]
    pub net_latency_us: f64,
    /// With --tune: the GPUs' compute capability major (8 Ampere, 9 Hopper, 10 Blackwell).
    #[arg(long, default_value_t = 9, requires = "tune")]
    pub sm: i32,
}

pub fn main(args: &InfoArgs) -> Result<i32, String> {
    if args.settings_markdown {
        print!("{}", oxccl::config::markdown());
        return Ok(0);
    }
    if args.tune {
        if args.nodes == 0 || args.gpus_per_node == 0 {
            return Err("--nodes and --gpus-per-node must be at least 1".into());
        }
        if args.nvlink_gbps <= 0.0 || args.net_gbps <= 0.0 {
            return Err("--nvlink-gbps and --net-gbps must be above 0".into());
        }
        let c = crate::tune::Cluster {
            nodes: args.nodes,
            gpus_per_node: args.gpus_per_node,
            nvlink_gbps: args.nvlink_gbps,
            net_gbps: args.net_gbps,
            nics_per_node: args.nics_per_node.unwrap_or(args.gpus_per_node),
            net_latency_us: args.net_latency_us,
            sm: args.sm,
        };
        print!("{}", crate::tune::report(&c));
        return Ok(0);
    }
    let cfg = Config::load().map_err(|e| e.to_string())?;
    println!("oxccl {} (NCCL API 2.31.2)", env!("CARGO_PKG_VERSION"));
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
    println!("\n## Not implemented (NCCL documents them; oxccl warns where set and ignores them)");
    for r in oxccl::config::REFUSED {
        let set = cfg.refused_set().iter().find(|s| s.def.name == r.name);
        let state = set.map_or("(unset)".to_string(), |s| {
            format!("{} ({})", s.value, s.source)
        });
        println!("  {:<32} {:<20} {}", r.name, state, r.why);
    }
    println!("\n## Security (NCCL_SOCKET_KEY_FILE)");
    match oxccl::bootstrap::socket_key(&cfg) {
        Ok(key) => {
            for line in oxccl::bootstrap::protection_lines(key.is_some()) {
                println!("  {line}");
            }
        }
        Err(e) => println!("  error: {e} (a communicator would not start)"),
    }
    use oxccl::plugin::{env, net, profiler, tuner};
    println!("\n## Env plugin (NCCL_ENV_PLUGIN, read with getenv as NCCL does)");
    let r = env::report();
    if let Some(s) = &r.setting {
        println!("  NCCL_ENV_PLUGIN={s}");
    }
    show(&r.outcome, "ncclEnvPlugin_", "the process environment");
    if let Some(name) = &r.name {
        println!(
            "  name: {name}; every NCCL_ value above marked \"env plugin\" was read through it"
        );
    }
    println!(
        "  looks for: {}",
        std::iter::once(env::ROOT_SYMBOL)
            .chain(env::LOADABLE.iter().map(|l| l.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("\n## Net plugin (NCCL_NET_PLUGIN)");
    match net::load(cfg.net_plugin.as_deref()) {
        Ok((network, o)) => match o {
            net::Outcome::NotFound { searched } => not_found(&searched, "the built-in network"),
            net::Outcome::Loaded {
                library,
                version,
                searched,
            } => {
                loaded(&searched, &library, &format!("ncclNetPlugin_{version}"));
                // Through a context made for this look and finalized right
                // after (v11+): no communicator exists here.
                if let Some(network) = network {
                    match net::devices_line(&network) {
                        Ok(line) => println!("  devices: {line}"),
                        Err(e) => println!("  devices: unknown ({e}); a communicator would use the built-in network"),
                    }
                }
            }
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
    println!(
        "\n## CollNet plugin (beside the net plugin; NCCL_COLLNET_ENABLE={})",
        cfg.collnet_enable
    );
    match net::collnet::plugin() {
        Ok(c) => println!(
            "  loaded {} ({}): {} device(s), {} Mb/s, {} us; all_reduce{} on host memory across {}+ nodes takes it where enabled",
            c.name(),
            c.symbol(),
            c.devices(),
            c.speed_mbps,
            c.latency_us,
            match c.gathers {
                (true, true) => ", all_gather and reduce_scatter",
                (true, false) => " and all_gather",
                (false, true) => " and reduce_scatter",
                (false, false) => "",
            },
            cfg.collnet_node_threshold
        ),
        Err(why) => println!("  none: {why}"),
    }
    println!("  looks for: {}", net::collnet::symbols().join(", "));
    println!("\n## Tuner plugin (NCCL_TUNER_PLUGIN)");
    match tuner::load(cfg.tuner_plugin.as_deref(), net::opened_library()) {
        Ok((_, o)) => show(&o, "ncclTunerPlugin_", "the cost model alone"),
        Err(e) => println!("  error: {e}"),
    }
    println!(
        "  looks for: {}",
        std::iter::once(tuner::ROOT_SYMBOL)
            .chain(tuner::SYMBOLS.iter().map(|s| s.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("\n## Profiler plugin (NCCL_PROFILER_PLUGIN)");
    match profiler::load(cfg.profiler_plugin.as_deref()) {
        Ok((_, o)) => show(&o, "ncclProfiler_", "no profiler"),
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
    topology(&oxccl::topo::Topology::detect());
    Ok(0)
}

fn topology(t: &Topology) {
    println!("\n## Topology");
    println!("  GPUs: {}", t.gpus.len());
    for g in &t.gpus {
        let f = &g.facts;
        let bus = f
            .bus_id
            .map_or("(no PCI address)".into(), |b| b.to_string());
        let numa = g
            .pci
            .as_ref()
            .and_then(|p| p.numa)
            .map_or("-".into(), |n| n.to_string());
        let pcie = g
            .pci
            .as_ref()
            .and_then(|p| p.link)
            .map_or("-".into(), |l| format!("{} GT/s x{}", l.gts, l.width));
        let nvl = g.nvlinks.as_ref().map_or("-".into(), |n| {
            let peers: u32 = n.to_gpu.values().sum();
            format!("{peers} to GPUs, {} to switches", n.to_switch)
        });
        println!(
            "  GPU {} {:<24} {bus} sm_{}{} numa {numa} PCIe {pcie} NVLinks: {nvl}",
            f.ordinal, f.name, f.compute_capability.0, f.compute_capability.1
        );
    }
    if !t.pairs.is_empty() {
        println!("  GPU pairs (link; peer access; channels it asks for):");
    }
    for p in &t.pairs {
        let access = match p.p2p {
            Some(x) if x.access && x.atomics => "peer access, native atomics",
            Some(x) if x.access => "peer access",
            Some(_) => "no peer access",
            None => "peer access unknown",
        };
        let cc = t
            .gpus
            .iter()
            .find(|g| g.facts.ordinal == p.a)
            .map_or((9, 0), |g| g.facts.compute_capability);
        let ch =
            oxccl::topo::channels::channels(p.link, cc).map_or("default".into(), |n| n.to_string());
        println!("  GPU {} - GPU {}: {}; {access}; {ch}", p.a, p.b, p.link);
    }
    println!("  NICs:");
    for n in &t.nics {
        match &n.kind {
            NicKind::Pci { pci, speed_mbps } => {
                let speed = speed_mbps.map_or("speed unknown".into(), |s| format!("{s} Mb/s"));
                let numa = pci.numa.map_or("-".into(), |n| n.to_string());
                let paths: Vec<String> = (0..t.gpus.len())
                    .filter_map(|i| {
                        t.path_to(i, pci)
                            .map(|p| format!("GPU {} {p}", t.gpus[i].facts.ordinal))
                    })
                    .collect();
                println!(
                    "  {:<12} {} {speed} numa {numa}{}",
                    n.name,
                    pci.bus_id,
                    if paths.is_empty() {
                        String::new()
                    } else {
                        format!("; {}", paths.join(", "))
                    }
                );
            }
            NicKind::Virtual(kind) => println!("  {:<12} virtual ({kind})", n.name),
            NicKind::Other => println!("  {:<12} not on PCI", n.name),
        }
    }
    for d in &t.rdma {
        let bus = d.pci.as_ref().map_or("-".into(), |p| p.bus_id.to_string());
        let ports: Vec<String> = d
            .ports
            .iter()
            .map(|p| format!("port {} {} {} {}", p.port, p.state, p.rate, p.link_layer))
            .collect();
        println!("  {:<12} RDMA {bus}: {}", d.name, ports.join("; "));
    }
    for note in &t.notes {
        println!("  note: {note}");
    }
}

fn oxccl_plugin_list() -> Vec<String> {
    oxccl::net_summary()
}

/// What the search for one plugin found; `abi` prefixes the version.
fn show(o: &oxccl::plugin::net::Outcome, abi: &str, instead: &str) {
    use oxccl::plugin::net::Outcome;
    match o {
        Outcome::NotFound { searched } => not_found(searched, instead),
        Outcome::Loaded {
            library,
            version,
            searched,
        } => {
            // A root module names itself ("oxccl_tuner_root_module, ...").
            let how = if version.starts_with("oxccl_") {
                version.clone()
            } else {
                format!("{abi}{version}")
            };
            loaded(searched, library, &how)
        }
        Outcome::Refused {
            library,
            reason,
            searched,
        } => refused(searched, library, reason, instead),
    }
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
