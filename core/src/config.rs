//! Every setting of the library, declared once with its default and its
//! meaning (UCC's way), resolved once per communicator and passed down.
//!
//! Precedence, highest first: the API (a communicator's config), the
//! environment (`NCCL_<KEY>`, read through the env plugin when one is in use:
//! [`var`]), oxccl's TOML file (`OXCCL_CONFIG`, its `[env]` table), the
//! configuration file (`NCCL_CONF_FILE`, else `~/.nccl.conf`, then
//! `/etc/nccl.conf`, in NCCL's `KEY=VALUE` form), the default. `oxccl info`
//! prints [`Config::entries`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where a resolved value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Api,
    Env,
    /// Read through the env plugin of this name (`NCCL_ENV_PLUGIN`).
    EnvPlugin(String),
    File(PathBuf),
    Default,
    /// Rank 0's value, taken at a communicator's creation where this
    /// rank's differed (a setting every rank must share).
    Rank0,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Api => write!(f, "api"),
            Source::Env => write!(f, "env"),
            Source::EnvPlugin(name) => write!(f, "env plugin {name}"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Default => write!(f, "default"),
            Source::Rank0 => write!(f, "rank 0"),
        }
    }
}

/// A value type a parameter can have.
pub trait ParamValue: Sized {
    fn parse(s: &str) -> std::result::Result<Self, String>;
}

impl ParamValue for String {
    fn parse(s: &str) -> std::result::Result<Self, String> {
        Ok(s.to_string())
    }
}

impl ParamValue for Option<String> {
    fn parse(s: &str) -> std::result::Result<Self, String> {
        Ok((!s.is_empty()).then(|| s.to_string()))
    }
}

impl ParamValue for u64 {
    fn parse(s: &str) -> std::result::Result<Self, String> {
        parse_size(s).ok_or_else(|| {
            format!("expected a non-negative integer (K/M/G suffixes allowed), got {s:?}")
        })
    }
}

impl ParamValue for usize {
    fn parse(s: &str) -> std::result::Result<Self, String> {
        u64::parse(s).map(|v| v as usize)
    }
}

impl ParamValue for f64 {
    fn parse(s: &str) -> std::result::Result<Self, String> {
        s.trim()
            .parse()
            .map_err(|_| format!("expected a number, got {s:?}"))
    }
}

impl ParamValue for Option<u64> {
    fn parse(s: &str) -> std::result::Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(None);
        }
        u64::parse(s).map(Some)
    }
}

impl ParamValue for Option<bool> {
    fn parse(s: &str) -> std::result::Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(None);
        }
        bool::parse(s).map(Some)
    }
}

impl ParamValue for bool {
    fn parse(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" | "" => Ok(false),
            _ => Err(format!("expected 0 or 1, got {s:?}")),
        }
    }
}

/// A count with an optional K/M/G suffix (powers of 1024).
pub(crate) fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

/// One declared parameter, as `oxccl info` lists it.
#[derive(Debug, Clone, Copy)]
pub struct ParamDef {
    /// Key without prefix; the environment variable is `NCCL_<key>`.
    pub key: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

impl ParamDef {
    pub fn env_name(&self) -> String {
        format!("NCCL_{}", self.key)
    }
}

/// One resolved parameter.
#[derive(Debug, Clone)]
pub struct Entry {
    pub def: ParamDef,
    pub value: String,
    pub source: Source,
}

macro_rules! params {
    ($( $(#[doc = $doc:literal])* $field:ident : $ty:ty = $key:literal, $default:literal; )*) => {
        /// Every parameter oxccl reads.
        pub const PARAMS: &[ParamDef] = &[
            $( ParamDef { key: $key, default: $default, doc: concat!($($doc),*) }, )*
        ];

        /// The resolved settings of one communicator.
        #[derive(Debug, Clone)]
        pub struct Config {
            $( $(#[doc = $doc])* pub $field: $ty, )*
            entries: BTreeMap<&'static str, Entry>,
        }

        impl Config {
            fn from_raw(raw: &BTreeMap<&'static str, (String, Source)>) -> Result<Config> {
                let mut entries = BTreeMap::new();
                $(
                    let def = ParamDef { key: $key, default: $default, doc: concat!($($doc),*) };
                    let (value, source) = raw
                        .get($key)
                        .cloned()
                        .unwrap_or_else(|| ($default.to_string(), Source::Default));
                    let $field = <$ty as ParamValue>::parse(&value).map_err(|why| {
                        Error::InvalidArgument(format!(
                            "NCCL_{} (from {}): {}", $key, source, why
                        ))
                    })?;
                    entries.insert($key, Entry { def, value, source });
                )*
                Ok(Config { $( $field, )* entries })
            }
        }
    };
}

params! {
    /// host:port of the bootstrap root, replacing the address in the unique id.
    comm_id: Option<String> = "COMM_ID", "";
    /// Interfaces to use: prefix list, `^` to exclude, `=` for exact names.
    socket_ifname: Option<String> = "SOCKET_IFNAME", "";
    /// Address family of the interfaces: AF_INET, AF_INET6 or empty for either.
    socket_family: Option<String> = "SOCKET_FAMILY", "";
    /// Sockets per helper thread of the socket network (read by the network itself; unset: 2 on 8+ cores, else 1).
    nsocks_perthread: Option<String> = "NSOCKS_PERTHREAD", "";
    /// Helper threads per connection of the socket network (unset: 2 on 8+ cores, else 0: the caller's thread moves the data).
    socket_nthreads: Option<String> = "SOCKET_NTHREADS", "";
    /// File holding a 256-bit key as 64 hex digits (`oxccl keygen`): every bootstrap and socket-network connection is then authenticated with it and encrypted (Noise NNpsk0, AES-128-GCM records); peers without it are refused. Environment only. Unset: traffic in clear.
    socket_key_file: Option<String> = "SOCKET_KEY_FILE", "";
    /// Seconds an operation or the bootstrap may wait on a peer before failing with the ranks it waited for.
    timeout_s: f64 = "TIMEOUT", "300";
    /// Logging: VERSION, WARN, INFO, TRACE (NCCL's levels).
    debug: Option<String> = "DEBUG", "";
    /// Subsystems logged: INIT,COLL,P2P,NET,BOOTSTRAP,ENV,ALL; `^` excludes.
    debug_subsys: Option<String> = "DEBUG_SUBSYS", "";
    /// File the log goes to instead of stderr; %h is the host name, %p the process id, %% a percent sign.
    debug_file: Option<String> = "DEBUG_FILE", "";
    /// Algorithm for collectives: Ring or Tree (recursive doubling); empty lets the cost model choose.
    algo: Option<String> = "ALGO", "";
    /// Protocols the device path may use: LL and Simple (NCCL's list syntax, `^` excludes); unset: LL for operations of up to 4 KiB per rank where some peer is reached through host memory (network or shared memory), Simple otherwise. Rank 0's is taken.
    proto: Option<String> = "PROTO", "";
    /// Network plugin library: a name (`foo` loads libnccl-net-foo.so), a path, or `none`; unset tries libnccl-net.so.
    net_plugin: Option<String> = "NET_PLUGIN", "";
    /// Tuner plugin library: a name (`foo` loads libnccl-tuner-foo.so), a path, or `none`; unset tries libnccl-tuner.so, then the net plugin library.
    tuner_plugin: Option<String> = "TUNER_PLUGIN", "";
    /// Profiler plugin library: a name (`foo` loads libnccl-profiler-foo.so), a path, or `none`; unset tries libnccl-profiler.so.
    profiler_plugin: Option<String> = "PROFILER_PLUGIN", "";
    /// 1: GPUs never map each other's memory; the kernels reach peers of this host through shared host memory (or the network with SHM_DISABLE).
    p2p_disable: bool = "P2P_DISABLE", "0";
    /// Farthest PCIe path between a GPU and a NIC over which the network reads and writes GPU memory (GPUDirect): LOC, PIX, PXB, PHB or SYS; unset: PXB. Needs a plugin reporting CUDA pointer support.
    net_gdr_level: Option<String> = "NET_GDR_LEVEL", "";
    /// 0: GPUDirect never registers GPU memory as a dma-buf (regMrDmaBuf), even where the network reports NCCL_PTR_DMABUF and the GPU can export one.
    dmabuf_enable: bool = "DMABUF_ENABLE", "1";
    /// 1: no shared-memory transport: ranks of one host connect through the network. Set on either rank of a pair, it holds for the pair.
    shm_disable: bool = "SHM_DISABLE", "0";
    /// Bytes of a shared-memory connection's ring: 8 slots (NCCL_STEPS) of BUFFSIZE/8 bytes.
    buffsize: u64 = "BUFFSIZE", "4M";
    /// Network to use by name (e.g. Socket); empty takes the first that has devices.
    net: Option<String> = "NET", "";
    /// Smallest number of channels (parallel lanes per collective).
    min_nchannels: u64 = "MIN_NCHANNELS", "1";
    /// Largest number of channels.
    max_nchannels: u64 = "MAX_NCHANNELS", "2";
    /// Bytes of one pipelined slice on the network.
    chunk_size: u64 = "CHUNK_SIZE", "1M";
    /// Configuration file in KEY=VALUE form (replaces ~/.nccl.conf and /etc/nccl.conf).
    conf_file: Option<String> = "CONF_FILE", "";
    /// This host's identity when counting nodes (ranks with the same one are on one node); empty: host name and boot id.
    hostid: Option<String> = "HOSTID", "";
    /// 1: a communicator's splits share its network context (NCCL's splitShare); 0: each split makes its own. Replaces the config's split_share where set, as in NCCL; unset: the config's, else 0.
    comm_split_share_resources: Option<bool> = "COMM_SPLIT_SHARE_RESOURCES", "";
    /// Fewest CTAs (thread blocks, channels) a GPU communicator runs its collectives on: its channel count is raised to it (small operations still take fewer, as NCCL's). Replaces the config's minCTAs where set, as in NCCL. Unset: 1.
    min_ctas: Option<u64> = "MIN_CTAS", "";
    /// Most CTAs any launch of a GPU communicator takes, on every path (P2P, shared memory, network, ranks sharing a GPU). Replaces the config's maxCTAs where set, as in NCCL. Unset: 128, oxccl's channel limit (NCCL's is 64).
    max_ctas: Option<u64> = "MAX_CTAS", "";
    /// Threads per CTA of the device kernels: a multiple of 32 from 64 to 1024. Unset: 512.
    nthreads: Option<u64> = "NTHREADS", "";
    /// NCCL's thread-block cluster size for its kernels. oxccl's kernels share nothing between blocks and launch without clusters: a value is accepted and reported once in a WARN.
    cga_cluster_size: Option<u64> = "CGA_CLUSTER_SIZE", "";
    /// NCCL's CTA policy: DEFAULT, EFFICIENCY, ZERO (or 0, 1, 2; `|` joins them). oxccl runs every policy as DEFAULT and says so in a WARN for the others. Replaces the config's CTAPolicy where set.
    cta_policy: Option<String> = "CTA_POLICY", "";
    /// 1: a communicator's shrinks (NCCL_SHRINK_DEFAULT, not revoked) share its network context (NCCL's shrinkShare); 0: each makes its own. Replaces the config's shrink_share where set; unset: the config's, else 0.
    comm_shrink_share_resources: Option<bool> = "COMM_SHRINK_SHARE_RESOURCES", "";
}

impl Config {
    /// Resolves every parameter from the environment, the configuration file
    /// and the defaults.
    pub fn load() -> Result<Config> {
        Config::load_with(&[])
    }

    /// As [`Config::load`], with values given through the API on top.
    pub fn load_with(api: &[(&str, &str)]) -> Result<Config> {
        if let Some(e) = crate::plugin::env::setting_error() {
            return Err(e);
        }
        let mut raw: BTreeMap<&'static str, (String, Source)> = BTreeMap::new();
        if let Some((path, text)) = conf_file()? {
            for (key, value) in parse_conf(&text) {
                if let Some(def) = lookup(&key) {
                    raw.insert(def.key, (value, Source::File(path.clone())));
                }
            }
        }
        // Variables of other libraries (NCCL's own, read by NCCL through
        // the env plugin) are left to them.
        let toml =
            oxccl_plugin::env::load_config().map_err(|e| Error::InvalidArgument(e.to_string()))?;
        if let Some(f) = toml {
            for (name, value) in f.vars {
                if let Some(def) = name.strip_prefix("NCCL_").and_then(lookup) {
                    raw.insert(def.key, (value, Source::File(f.path.clone())));
                }
            }
        }
        let env_source = crate::plugin::env::source().map_or(Source::Env, Source::EnvPlugin);
        for def in PARAMS {
            if let Some(v) = var(&def.env_name()) {
                raw.insert(def.key, (v, env_source.clone()));
            }
        }
        for (key, value) in api {
            let key = key.strip_prefix("NCCL_").unwrap_or(key);
            let def = lookup(key).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown setting {key:?}: `oxccl info` lists every setting"
                ))
            })?;
            raw.insert(def.key, (value.to_string(), Source::Api));
        }
        Config::from_raw(&raw)
    }

    /// Every parameter with its resolved value and where it came from.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    pub fn source(&self, key: &str) -> Option<&Source> {
        self.entries.get(key).map(|e| &e.source)
    }

    /// Whether `key` was set anywhere rather than left at its default.
    pub fn is_set(&self, key: &str) -> bool {
        self.source(key).is_some_and(|s| *s != Source::Default)
    }

    /// Takes rank 0's NCCL_ALGO (None: unset there).
    pub fn adopt_algo(&mut self, name: Option<&str>) {
        self.algo = name.map(str::to_string);
        if let Some(e) = self.entries.get_mut("ALGO") {
            e.value = name.unwrap_or_default().to_string();
            e.source = if name.is_some() {
                Source::Rank0
            } else {
                Source::Default
            };
        }
    }

    /// Takes rank 0's value of a setting every rank must share: `value`,
    /// set by rank 0 (`set`) or its default there. Only the settings that
    /// shape every collective ([`SHAPING`]); false for any other key.
    pub fn adopt(&mut self, key: &str, value: u64, set: bool) -> bool {
        let field = match key {
            "CHUNK_SIZE" => &mut self.chunk_size,
            "MIN_NCHANNELS" => &mut self.min_nchannels,
            "MAX_NCHANNELS" => &mut self.max_nchannels,
            _ => return false,
        };
        *field = value;
        if let Some(e) = self.entries.get_mut(key) {
            e.value = value.to_string();
            e.source = if set { Source::Rank0 } else { Source::Default };
        }
        true
    }

    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.timeout_s.max(0.001))
    }
}

/// The settings that shape every collective's messages and channels (keys
/// without `NCCL_`): ranks that differ cut the data into different
/// messages (a truncation error) or wait for channels the others never
/// connect (until NCCL_TIMEOUT), so every rank takes rank 0's
/// ([`Config::adopt`]).
pub const SHAPING: [&str; 3] = ["CHUNK_SIZE", "MIN_NCHANNELS", "MAX_NCHANNELS"];

/// The value of an `NCCL_*` variable as NCCL reads it (`ncclGetEnv`):
/// through the env plugin when one is in use, else from the process
/// environment. Every `NCCL_*` value oxccl reads comes through here, but
/// for `NCCL_CONF_FILE` and `NCCL_ENV_PLUGIN` (NCCL reads those two with
/// `getenv`, before the plugin).
pub fn var(name: &str) -> Option<String> {
    crate::plugin::env::var(name)
}

fn lookup(key: &str) -> Option<&'static ParamDef> {
    PARAMS.iter().find(|d| d.key == key)
}

/// NCCL's configuration file: the one NCCL_CONF_FILE names, else the first of
/// ~/.nccl.conf and /etc/nccl.conf that exists.
fn conf_file() -> Result<Option<(PathBuf, String)>> {
    if let Ok(p) = std::env::var("NCCL_CONF_FILE") {
        let path = PathBuf::from(p);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::InvalidArgument(format!(
                "NCCL_CONF_FILE={}: cannot read it: {e}",
                path.display()
            ))
        })?;
        return Ok(Some((path, text)));
    }
    let home = std::env::var_os("HOME").map(|h| Path::new(&h).join(".nccl.conf"));
    for path in home.into_iter().chain([PathBuf::from("/etc/nccl.conf")]) {
        if let Ok(text) = std::fs::read_to_string(&path) {
            return Ok(Some((path, text)));
        }
    }
    Ok(None)
}

/// Lines of `KEY=VALUE`; `#` starts a comment; keys may carry the NCCL_ prefix.
pub(crate) fn parse_conf(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let k = k.trim();
            (
                k.strip_prefix("NCCL_").unwrap_or(k).to_string(),
                v.trim().to_string(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adopting_rank_0s_value_takes_whether_it_was_set_too() {
        let mut c = Config::load_with(&[("MAX_NCHANNELS", "8")]).unwrap();
        assert!(c.is_set("MAX_NCHANNELS"));
        assert!(c.adopt("MAX_NCHANNELS", 2, false));
        assert_eq!(c.max_nchannels, 2);
        assert!(!c.is_set("MAX_NCHANNELS"));
        assert!(c.adopt("CHUNK_SIZE", 4096, true));
        assert_eq!(c.chunk_size, 4096);
        assert_eq!(c.source("CHUNK_SIZE"), Some(&Source::Rank0));
        assert!(!c.adopt("TIMEOUT", 1, true));
    }

    #[test]
    fn defaults_parse() {
        let raw = BTreeMap::new();
        let c = Config::from_raw(&raw).unwrap();
        assert_eq!(c.chunk_size, 1 << 20);
        assert_eq!(c.source("CHUNK_SIZE"), Some(&Source::Default));
        assert_eq!(c.entries().count(), PARAMS.len());
    }

    #[test]
    fn bad_value_names_the_variable() {
        let mut raw = BTreeMap::new();
        raw.insert("TIMEOUT", ("soon".to_string(), Source::Env));
        let e = Config::from_raw(&raw).unwrap_err();
        assert!(e.to_string().contains("NCCL_TIMEOUT"), "{e}");
    }

    #[test]
    fn api_overrides_and_unknown_key_is_named() {
        let c = Config::load_with(&[("NCCL_ALGO", "Ring")]).unwrap();
        assert_eq!(c.algo.as_deref(), Some("Ring"));
        assert_eq!(c.source("ALGO"), Some(&Source::Api));
        let e = Config::load_with(&[("NO_SUCH_KEY", "1")]).unwrap_err();
        assert!(e.to_string().contains("NO_SUCH_KEY"));
    }

    #[test]
    fn conf_lines() {
        let v = parse_conf("# c\nNCCL_DEBUG=INFO\n SOCKET_IFNAME = eth # x\n\nbad\n");
        assert_eq!(
            v,
            vec![
                ("DEBUG".into(), "INFO".into()),
                ("SOCKET_IFNAME".into(), "eth".into())
            ]
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4M"), Some(4 << 20));
        assert_eq!(parse_size("12"), Some(12));
        assert_eq!(parse_size("x"), None);
    }

    /// Every NCCL_ variable named in the core's sources is declared above.
    #[test]
    fn every_variable_read_is_declared() {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut undeclared = Vec::new();
        visit(Path::new(src), &mut |text| {
            for (i, _) in text.match_indices("\"NCCL_") {
                let name: String = text[i + 6..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                    .collect();
                // Read with getenv, as NCCL does, not as settings.
                let raw_env = ["CONF_FILE", "ENV_PLUGIN"];
                if !name.is_empty() && lookup(&name).is_none() && !raw_env.contains(&name.as_str())
                {
                    undeclared.push(name);
                }
            }
        });
        assert!(undeclared.is_empty(), "undeclared: {undeclared:?}");
    }

    fn visit(dir: &Path, f: &mut dyn FnMut(&str)) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                visit(&p, f);
            } else if p.extension().is_some_and(|x| x == "rs") {
                f(&std::fs::read_to_string(&p).unwrap());
            }
        }
    }
}
