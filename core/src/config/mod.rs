//! Every setting of the library, declared once with its default, what it
//! accepts, its meaning and who reads it (UCC's way), in the one table
//! below ([`SETTINGS`]); `oxccl info` lists them with their values and
//! `oxccl info --settings-markdown` prints docs/settings.md from it.
//!
//! Three kinds of rows:
//! - `NCCL_` settings of the core, resolved once per communicator into
//!   [`Config`] and passed down. Precedence, highest first: the API (a
//!   communicator's config), the environment (`NCCL_<KEY>`, read through the
//!   env plugin when one is in use: [`var`]), oxccl's TOML file
//!   (`OXCCL_CONFIG`, its `[env]` table), the configuration file
//!   (`NCCL_CONF_FILE`, else `~/.nccl.conf`, then `/etc/nccl.conf`, in
//!   NCCL's `KEY=VALUE` form), the default.
//! - `OXCCL_` settings the core (or the C API, or the CLI) reads from the
//!   process environment only, through [`ox`]; every [`Config::load`] checks
//!   them all, so a bad value fails a communicator's creation.
//! - Settings of crates that cannot link the core (the plugins, the
//!   network-interface and key crates): declared here for the docs and
//!   `oxccl info`, read and checked strictly where they are used.
//!
//! A value that does not parse, or is out of range, is an
//! [`Error::InvalidArgument`] naming the variable and what it accepts; never
//! a silent default. A blank value means unset. [`TOOL_VARIABLES`] lists the
//! variables tests and tools read, which are not settings.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

mod values;
pub(crate) use values::parse_size;
use values::*;
pub use values::{
    ce_coll_mode, cta_policy, protocols, AutoOr, CeCollMode, Check, ParamValue, StampLevels,
    MAX_BUFFSIZE, MAX_TIMEOUT_S, MIN_BUFFSIZE,
};

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

/// How a setting is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// By the core into [`Config`], per communicator, with NCCL's precedence.
    Config,
    /// From the process environment through [`ox`]; checked by every
    /// [`Config::load`].
    Env,
    /// From the process environment by a crate that cannot link the core,
    /// which checks it itself.
    Own,
}

/// What a setting is about: one section of docs/settings.md each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    Bootstrap,
    Logging,
    Collectives,
    Transports,
    Plugins,
    SocketNet,
    IbNet,
    HostPath,
    DevicePath,
    SharedGpu,
    Tuner,
    Profiler,
    Cli,
}

impl Subject {
    pub const ALL: [Subject; 13] = [
        Subject::Bootstrap,
        Subject::Logging,
        Subject::Collectives,
        Subject::Transports,
        Subject::Plugins,
        Subject::SocketNet,
        Subject::IbNet,
        Subject::HostPath,
        Subject::DevicePath,
        Subject::SharedGpu,
        Subject::Tuner,
        Subject::Profiler,
        Subject::Cli,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Subject::Bootstrap => "Bootstrap, sockets and time limits",
            Subject::Logging => "Logging",
            Subject::Collectives => "Algorithms, protocols and channels",
            Subject::Transports => "Transports between ranks",
            Subject::Plugins => "Plugins and configuration files",
            Subject::SocketNet => "Socket network (oxccl-net-socket)",
            Subject::IbNet => "InfiniBand and RoCE network (oxccl-net-ib)",
            Subject::HostPath => "Host memory: the direct path",
            Subject::DevicePath => "GPU memory: the device path",
            Subject::SharedGpu => "Ranks sharing a GPU",
            Subject::Tuner => "Tuner plugin (oxccl-tuner)",
            Subject::Profiler => "Profiler plugin (oxccl-profiler)",
            Subject::Cli => "The oxccl command",
        }
    }
}

/// An NCCL_ variable oxccl does not implement ([`REFUSED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The environment variable.
    pub name: &'static str,
    /// Why oxccl does not implement it.
    pub why: &'static str,
}

/// A refused variable found set, as [`Config::load`] found it.
#[derive(Debug, Clone, PartialEq)]
pub struct RefusedSet {
    pub def: &'static Refused,
    pub value: String,
    pub source: Source,
}

/// Writes `line` as a WARN unless one about `name` was written already in
/// this process; whether it wrote it.
pub fn warn_once(name: &'static str, line: &str) -> bool {
    use std::sync::{Mutex, OnceLock};
    static WARNED: OnceLock<Mutex<std::collections::BTreeSet<&'static str>>> = OnceLock::new();
    let fresh = WARNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name);
    if fresh {
        tracing::warn!(target: "oxccl::init|env", "{line}");
    }
    fresh
}

/// The refused variable named `name` (the whole variable name).
pub fn refused(name: &str) -> Option<&'static Refused> {
    REFUSED.iter().find(|r| r.name == name)
}

/// One declared setting.
#[derive(Debug, Clone, Copy)]
pub struct ParamDef {
    /// The key [`Config`] knows it by: without `NCCL_` for the NCCL_
    /// settings of the core, else the whole name.
    pub key: &'static str,
    /// The environment variable.
    pub name: &'static str,
    /// The value when unset (`""`: unset, the doc says what that means).
    pub default: &'static str,
    pub doc: &'static str,
    /// What a value must be.
    pub expects: &'static str,
    pub read: Read,
    /// The crates that read it.
    pub by: &'static str,
    pub subject: Subject,
}

impl ParamDef {
    pub fn env_name(&self) -> String {
        self.name.to_string()
    }
}

/// One resolved setting.
#[derive(Debug, Clone)]
pub struct Entry {
    pub def: ParamDef,
    pub value: String,
    pub source: Source,
}

const fn pick(over: &[&'static str], default: &'static str) -> &'static str {
    if over.is_empty() {
        default
    } else {
        over[0]
    }
}

/// Parses `value` of `def` (`source`: where it came from, for the message)
/// with its type's parser and its checks.
fn resolve<T: ParamValue>(
    def: &ParamDef,
    value: &str,
    source: &Source,
    checks: &[&Check<T>],
) -> Result<T> {
    let fail = |why: Option<String>| {
        let why = why.map(|w| format!("{w}; ")).unwrap_or_default();
        Error::InvalidArgument(format!(
            "{}={value:?} (from {source}): {why}expected {}",
            def.name, def.expects
        ))
    };
    let v = T::parse(value).ok_or_else(|| fail(None))?;
    for c in checks {
        (c.test)(&v).map_err(|why| fail(Some(why)))?;
    }
    Ok(v)
}

/// The value of an `OXCCL_` setting from `get` (the process environment, or
/// a test's); where unset or blank, `unset` parsed: the row's default, not
/// the value it shows (`""`, None, for a row whose default lives with its
/// reader, as DeviceConfig's), and the shown default as its text.
fn from_env<T: ParamValue>(
    def: &ParamDef,
    unset: &str,
    get: &dyn Fn(&str) -> std::result::Result<String, std::env::VarError>,
    checks: &[&Check<T>],
) -> Result<(T, String, Source)> {
    match get(def.name) {
        Ok(v) if !v.trim().is_empty() => {
            resolve(def, &v, &Source::Env, checks).map(|t| (t, v, Source::Env))
        }
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::InvalidArgument(format!(
            "{}={v:?} (from env): not UTF-8; expected {}",
            def.name, def.expects
        ))),
        _ => resolve(def, unset, &Source::Default, checks)
            .map(|t| (t, def.default.to_string(), Source::Default)),
    }
}

macro_rules! settings {
    (
        config {
            $( $(#[doc = $cdoc:literal])*
               $cfield:ident : $cty:ty = $ckey:literal, $cdefault:literal in $csubject:ident
               $(, check $ccheck:expr)? $(, expects $cexp:literal)? $(, by $cby:literal)? ; )*
        }
        env {
            $( $(#[doc = $edoc:literal])*
               $efield:ident : $ety:ty = $ename:literal, $edefault:literal in $esubject:ident
               $(, shown $eshown:literal)? $(, check $echeck:expr)? $(, expects $eexp:literal)?
               $(, by $eby:literal)? ; )*
        }
        own {
            $( $(#[doc = $odoc:literal])*
               $oname:literal = $odefault:literal in $osubject:ident,
               expects $oexpects:literal, by $oby:literal ; )*
        }
        refused {
            $( $rname:literal = $rwhy:literal ; )*
        }
    ) => {
        /// The NCCL_ variables NCCL documents that oxccl does not implement,
        /// each with why; one set anywhere is named in a WARN once per
        /// process when a communicator is made ([`Config::warn_refused`]).
        pub const REFUSED: &[Refused] = &[ $( Refused { name: $rname, why: $rwhy }, )* ];

        /// Every setting: the core's NCCL_ ones ([`PARAMS`]), then the
        /// OXCCL_ ones read through [`ox`], then those read by crates that
        /// cannot link the core.
        pub const SETTINGS: &[ParamDef] = &[
            $( ParamDef {
                key: $ckey,
                name: concat!("NCCL_", $ckey),
                default: $cdefault,
                doc: concat!($($cdoc),*),
                expects: pick(&[$($cexp,)? $($ccheck.expects,)?], <$cty as ParamValue>::EXPECTS),
                read: Read::Config,
                by: pick(&[$($cby)?], "oxccl"),
                subject: Subject::$csubject,
            }, )*
            $( ParamDef {
                key: $ename,
                name: $ename,
                default: pick(&[$($eshown)?], $edefault),
                doc: concat!($($edoc),*),
                expects: pick(&[$($eexp,)? $($echeck.expects,)?], <$ety as ParamValue>::EXPECTS),
                read: Read::Env,
                by: pick(&[$($eby)?], "oxccl"),
                subject: Subject::$esubject,
            }, )*
            $( ParamDef {
                key: $oname,
                name: $oname,
                default: $odefault,
                doc: concat!($($odoc),*),
                expects: $oexpects,
                read: Read::Own,
                by: $oby,
                subject: Subject::$osubject,
            }, )*
        ];

        /// The NCCL_ settings of the core, resolved into [`Config`] (and
        /// NCCL's parameter API in the C API).
        pub const PARAMS: &[ParamDef] = SETTINGS.split_at([$($ckey),*].len()).0;

        /// The resolved settings of one communicator.
        #[derive(Debug, Clone)]
        pub struct Config {
            $( $(#[doc = $cdoc])* pub $cfield: $cty, )*
            entries: BTreeMap<&'static str, Entry>,
            /// The OXCCL_ settings, as [`Config::load`] found them.
            env: Vec<Entry>,
            /// The refused variables ([`REFUSED`]) set somewhere, with
            /// their values and where they were found.
            refused: Vec<RefusedSet>,
        }

        impl Config {
            fn from_raw(raw: &BTreeMap<&'static str, (String, Source)>) -> Result<Config> {
                let mut entries = BTreeMap::new();
                $(
                    let def = *lookup($ckey).expect("declared");
                    let (value, source) = raw
                        .get($ckey)
                        .cloned()
                        .unwrap_or_else(|| ($cdefault.to_string(), Source::Default));
                    let $cfield = resolve::<$cty>(&def, &value, &source, &[$(&$ccheck)?])?;
                    entries.insert($ckey, Entry { def, value, source });
                )*
                Ok(Config { $( $cfield, )* entries, env: Vec::new(), refused: Vec::new() })
            }
        }

        /// The OXCCL_ settings read by the core, the C API and the CLI, each
        /// from the process environment (never the env plugin or a file),
        /// its default where unset or blank, and an
        /// [`Error::InvalidArgument`] naming it where its value does not
        /// parse.
        pub mod ox {
            use super::*;

            $(
                $(#[doc = $edoc])*
                pub fn $efield() -> Result<$ety> {
                    read::$efield(&|k| std::env::var(k)).map(|(v, _, _)| v)
                }
            )*

            /// Each setting from a given environment (tests), with its
            /// text and source.
            pub(super) mod read {
                use super::super::*;
                pub type Get<'a> = &'a dyn Fn(&str) -> std::result::Result<String, std::env::VarError>;
                $(
                    pub fn $efield(get: Get<'_>) -> Result<($ety, String, Source)> {
                        from_env::<$ety>(
                            setting($ename).expect("declared"),
                            $edefault,
                            get,
                            &[$(&$echeck)?],
                        )
                    }
                )*
            }

            /// Every one of them, checked, as `oxccl info` lists them.
            pub(super) fn entries(get: read::Get<'_>) -> Result<Vec<Entry>> {
                let mut all = Vec::new();
                $(
                    let (_, value, source) = read::$efield(get)?;
                    all.push(Entry { def: *setting($ename).expect("declared"), value, source });
                )*
                Ok(all)
            }
        }
    };
}

settings! {
    config {
        /// host:port of the bootstrap root, replacing the address in the unique id.
        comm_id: Option<String> = "COMM_ID", "" in Bootstrap, expects "host:port";
        /// Interfaces to use: prefix list, `^` to exclude, `=` for exact names.
        socket_ifname: Option<String> = "SOCKET_IFNAME", "" in Bootstrap,
            expects "interface names or prefixes, comma-separated, with ^ (exclude) or = (exact) in front",
            by "oxccl, oxccl-net-socket, oxccl-net-ib (through oxccl-netif)";
        /// Address family of the interfaces: AF_INET, AF_INET6 or empty for either.
        socket_family: Option<String> = "SOCKET_FAMILY", "" in Bootstrap, check FAMILY,
            by "oxccl, oxccl-net-socket, oxccl-net-ib (through oxccl-netif)";
        /// Sockets per helper thread of the socket network (read by the network itself, from the process environment; unset: 2 on 8+ cores, else 1).
        nsocks_perthread: Option<u64> = "NSOCKS_PERTHREAD", "" in SocketNet, check NSOCKS, by "oxccl-net-socket";
        /// Helper threads per connection of the socket network (read by the network itself, from the process environment; unset: 2 on 8+ cores, 4 there with NCCL_SOCKET_KEY_FILE, else 0: the caller's thread moves the data).
        socket_nthreads: Option<u64> = "SOCKET_NTHREADS", "" in SocketNet, check SOCKET_THREADS, by "oxccl-net-socket";
        /// File holding a 256-bit key as 64 hex digits (`oxccl keygen`): every bootstrap and socket-network connection is then authenticated with it and encrypted (Noise NNpsk0, AES-128-GCM records); peers without it are refused. Environment only. Unset: traffic in clear.
        socket_key_file: Option<String> = "SOCKET_KEY_FILE", "" in Bootstrap,
            expects "a path to a file of 64 hex digits",
            by "oxccl, oxccl-net-socket (through oxccl-secure)";
        /// Retries of a socket connect that was refused, timed out or found its peer unreachable, NCCL's way: the n-th retry waits n x NCCL_SOCKET_RETRY_SLEEP_MSEC, so NCCL's defaults (34 and 100) retry for about 60 s. Used by the bootstrap's connection to the root and by the socket network's connects, where this or NCCL_SOCKET_RETRY_SLEEP_MSEC is set (the other then takes NCCL's default); both unset: oxccl's own retries, until NCCL_TIMEOUT for the bootstrap (10 ms doubling to 500 ms), for 10 s every 10 ms for the socket network. The bootstrap's waits still end at NCCL_TIMEOUT.
        socket_retry_cnt: Option<u64> = "SOCKET_RETRY_CNT", "" in Bootstrap, check RETRY_CNT,
            by "oxccl, oxccl-net-socket (through oxccl-netif)";
        /// Milliseconds before the first retry of a socket connect; the n-th waits n times it (see NCCL_SOCKET_RETRY_CNT). NCCL's default where only NCCL_SOCKET_RETRY_CNT is set: 100.
        socket_retry_sleep_msec: Option<u64> = "SOCKET_RETRY_SLEEP_MSEC", "" in Bootstrap, check RETRY_SLEEP,
            by "oxccl, oxccl-net-socket (through oxccl-netif)";
        /// Seconds an operation or the bootstrap may wait on a peer before failing with the ranks it waited for; where set, also the kernels' wait (OXCCL_DEV_TIMEOUT_S). oxccl's own (NCCL waits without a bound): at least 1 ms, at most 365 days, beyond which a wait is no bound at all.
        timeout_s: f64 = "TIMEOUT", "300" in Bootstrap, check TIMEOUT;
        /// Logging: VERSION, WARN, INFO, TRACE (NCCL's levels).
        debug: Option<String> = "DEBUG", "" in Logging,
            expects "VERSION, WARN, INFO or TRACE (as in NCCL, any other value logs warnings only)";
        /// Subsystems logged: INIT,COLL,P2P,NET,BOOTSTRAP,ENV,ALL; `^` excludes.
        debug_subsys: Option<String> = "DEBUG_SUBSYS", "" in Logging,
            expects "a comma-separated list of subsystems, ^ in front to exclude them";
        /// File the log goes to instead of stderr; %h is the host name, %p the process id, %% a percent sign.
        debug_file: Option<String> = "DEBUG_FILE", "" in Logging, expects "a file name, with %h, %p, %%";
        /// 1: threads NCCL names take NCCL's names, for tools that look for them: a GPU communicator's proxy thread is `NCCL Progress<dev>`, the bootstrap root `NCCL BootstrapR`. 0: oxccl's own names (`oxccl-proxy-<rank>`, `oxccl-bootstrap-root`); NCCL leaves its threads unnamed there. The socket network's helper threads keep `oxccl-net-sock`.
        set_thread_name: bool = "SET_THREAD_NAME", "0" in Logging;
        /// The time at the head of log lines, NCCL's way: a strftime format in local time (TZ), `_` written as a space, and `%1f` to `%9f` (once) for that many digits of the second's fraction. Unset: `[%F %T] ` ([YYYY-MM-DD HH:MM:SS]). As in NCCL, set but empty prints no time.
        debug_timestamp_format: Option<String> = "DEBUG_TIMESTAMP_FORMAT", "" in Logging, check STAMP_FORMAT;
        /// Which levels' lines begin with the time: VERSION, WARN, INFO, ABORT, TRACE or ALL, comma-separated, `^` in front for every level but those (oxccl writes no VERSION or ABORT lines). Unset: WARN. As in NCCL, set but empty: none.
        debug_timestamp_levels: Option<String> = "DEBUG_TIMESTAMP_LEVELS", "" in Logging, check STAMP_LEVELS;
        /// Algorithms for collectives, in NCCL's form: a comma-separated list of Ring, Tree, PAT, Collnet, CollnetChain, CollnetDirect, NVLS, NVLSTree (and oxccl's RecDoubling), `^` first to exclude them, `func:list` entries separated by `;` for one function (the first entry may name none). oxccl holds a communicator to one algorithm at most: a value that leaves one of its own (Ring; Tree, with recursive doubling; PAT) holds it there, one that only excludes what oxccl lacks (`^NVLS`) holds nothing, and any other is named in a WARN and holds nothing. Rank 0's is taken. Unset: the cost model chooses.
        algo: Option<String> = "ALGO", "" in Collectives, expects "NCCL's algorithm list (Ring, Tree, PAT, NVLS, ...; ^ excludes; func:list;...)";
        /// Protocols the device path may use: LL and Simple (NCCL's list syntax, `^` excludes); unset: LL for operations of up to 4 KiB per rank where some peer is reached through host memory (network or shared memory), Simple otherwise. Rank 0's is taken. Checked when any communicator is made, on host memory too.
        proto: Option<String> = "PROTO", "" in Collectives, check PROTO;
        /// Network plugin library: a name (`foo` loads libnccl-net-foo.so), a path, or `none`; unset tries libnccl-net.so.
        net_plugin: Option<String> = "NET_PLUGIN", "" in Plugins, expects "a library name, a path, or none";
        /// Tuner plugin library: a name (`foo` loads libnccl-tuner-foo.so), a path, or `none`; unset tries libnccl-tuner.so, then the net plugin library.
        tuner_plugin: Option<String> = "TUNER_PLUGIN", "" in Plugins, expects "a library name, a path, or none";
        /// Profiler plugin library: a name (`foo` loads libnccl-profiler-foo.so), a path, or `none`; unset tries libnccl-profiler.so.
        profiler_plugin: Option<String> = "PROFILER_PLUGIN", "" in Plugins, expects "a library name, a path, or none";
        /// 1: GPUs never map each other's memory; the kernels reach peers of this host through shared host memory (or the network with SHM_DISABLE).
        p2p_disable: bool = "P2P_DISABLE", "0" in Transports;
        /// Farthest PCIe path between a GPU and a NIC over which the network reads and writes GPU memory (GPUDirect): LOC, PIX, PXB, PHB or SYS; unset: PXB. Needs a plugin reporting CUDA pointer support.
        net_gdr_level: Option<String> = "NET_GDR_LEVEL", "" in Transports, expects "LOC, PIX, PXB, PHB, SYS or 0-4";
        /// 0: GPUDirect never registers GPU memory as a dma-buf (regMrDmaBuf), even where the network reports NCCL_PTR_DMABUF and the GPU can export one.
        dmabuf_enable: bool = "DMABUF_ENABLE", "1" in Transports;
        /// 1: no shared-memory transport: ranks of one host connect through the network. Set on either rank of a pair, it holds for the pair.
        shm_disable: bool = "SHM_DISABLE", "0" in Transports;
        /// Bytes of a connection's ring through host memory (shared memory or the network): 8 slots (NCCL_STEPS) of BUFFSIZE/8 bytes. NCCL takes any value; oxccl refuses below 64K, where each slot's own costs dominate (at 1 byte the slots were 64 bytes and an 8 MiB reduce_scatter took seconds), and above 512M, which the device path's 64 MiB slots would cut.
        buffsize: u64 = "BUFFSIZE", "4M" in Collectives, check BUFFSIZE;
        /// Network to use by name (e.g. Socket); empty takes the first that has devices.
        net: Option<String> = "NET", "" in Transports, expects "a network's name";
        /// Smallest number of channels (parallel lanes per collective).
        min_nchannels: u64 = "MIN_NCHANNELS", "1" in Collectives;
        /// Largest number of channels.
        max_nchannels: u64 = "MAX_NCHANNELS", "2" in Collectives;
        /// Bytes of one pipelined slice on the network.
        chunk_size: u64 = "CHUNK_SIZE", "1M" in Collectives;
        /// Configuration file in KEY=VALUE form (replaces ~/.nccl.conf and /etc/nccl.conf); read from the process environment only, as NCCL does.
        conf_file: Option<String> = "CONF_FILE", "" in Plugins, expects "a path";
        /// This host's identity when counting nodes (ranks with the same one are on one node); empty: host name and boot id.
        hostid: Option<String> = "HOSTID", "" in Bootstrap;
        /// 1: a communicator's splits share its network context (NCCL's splitShare); 0: each split makes its own. Replaces the config's split_share where set, as in NCCL; unset: the config's, else 0.
        comm_split_share_resources: Option<bool> = "COMM_SPLIT_SHARE_RESOURCES", "" in Transports;
        /// Fewest CTAs (thread blocks, channels) a GPU communicator runs its collectives on: its channel count is raised to it (small operations still take fewer, as NCCL's). Replaces the config's minCTAs where set, as in NCCL; values above 128, oxccl's channel limit, mean 128. Unset: 1.
        min_ctas: Option<u64> = "MIN_CTAS", "" in DevicePath, check CTAS;
        /// Most CTAs any launch of a GPU communicator takes, on every path (P2P, shared memory, network, ranks sharing a GPU, one rank). Replaces the config's maxCTAs where set, as in NCCL; values above 128 mean 128. Unset: 128 (NCCL's limit is 64); the default count is NCCL's (24 for two H200 on NV18, 2 through host memory).
        max_ctas: Option<u64> = "MAX_CTAS", "" in DevicePath, check CTAS;
        /// Threads per CTA of the device kernels. Unset: 1024 (or OXCCL_DEV_THREADS), twice NCCL's 512: the SM is the budget, and at NCCL's CTA count 1024 threads keep more loads in flight.
        nthreads: Option<u64> = "NTHREADS", "" in DevicePath, check NTHREADS;
        /// CTAs per thread-block cluster of the device kernels' launches on Hopper and later (compute capability 9.0+), as NCCL: a cluster runs within one GPC and clusters are spread over the GPCs, so that a collective's CTAs share the GPU's crossbar evenly. 0 or 1: no clusters; above 8 means 8; a launch whose CTA count it does not divide runs in clusters of one. Replaces the config's cgaClusterSize where set. Unset: 4, NCCL's.
        cga_cluster_size: Option<u64> = "CGA_CLUSTER_SIZE", "" in DevicePath;
        /// NCCL's CTA policy. ZERO runs all_gather and all_to_all on the copy engine (no SM) where the output lies in a symmetric window (see OXCCL_CE_COLL); otherwise every policy runs as DEFAULT (NCCL's CTA count within minCTAs and maxCTAs) and the others are named in a WARN. Replaces the config's CTAPolicy where set.
        cta_policy: Option<String> = "CTA_POLICY", "" in DevicePath, check CTA_POLICY;
        /// 1: a communicator's shrinks (NCCL_SHRINK_DEFAULT, not revoked) share its network context (NCCL's shrinkShare); 0: each makes its own. Replaces the config's shrink_share where set; unset: the config's, else 0.
        comm_shrink_share_resources: Option<bool> = "COMM_SHRINK_SHARE_RESOURCES", "" in Transports;
        /// NCCL's topology file (XML, the format NCCL_TOPO_DUMP_FILE writes) read before detection, as NCCL reads it: what it says of CPUs, PCIe switches, GPUs, NVLinks and NICs wins, and detection adds what it leaves out. P2P between GPUs, GPUDirect (NCCL_NET_GDR_LEVEL against the paths it gives), the NICs of each GPU and the channel count follow it. Unset: /var/run/nvidia-topologyd/virtualTopology.xml where that exists.
        topo_file: Option<String> = "TOPO_FILE", "" in Transports, expects "a path to an XML file in NCCL's topology format";
        /// File the node's topology is written to at a communicator's creation (rank 0 of it), in NCCL's XML format: detection fused with NCCL_TOPO_FILE.
        topo_dump_file: Option<String> = "TOPO_DUMP_FILE", "" in Transports, expects "a path to a file, created or replaced";
        /// Farthest path between two GPUs of one host over which they map each other's memory (P2P); farther pairs go through shared host memory. LOC (never), NVL (NVLink only), PIX, PXB, PHB or SYS, or NCCL's integers 0-5 (0 LOC, 1 PIX, 2 PXB, 3 PHB, 4-5 SYS). Unset: PXB, or SYS on AMD x86 nodes of at most two GPUs, as NCCL; pairs whose path is unknown keep P2P unless this is set. NCCL_P2P_DISABLE=1 wins over it.
        p2p_level: Option<String> = "P2P_LEVEL", "" in Transports, check P2P_LEVEL;
        /// 0: the network never reads GPU memory on sends: send slots stay in host memory while receives still use GPUDirect; 1: it does wherever GPUDirect is on (NCCL_NET_GDR_LEVEL). Unset: on from compute capability 8.0 (and below it only with an NVLink to another GPU), as NCCL.
        net_gdr_read: Option<bool> = "NET_GDR_READ", "" in Transports;
        /// Whether the two ends of a network connection may use NICs of different rails (indices): 0 never (the receiver listens on the sender's NIC index), 1 each end on its own GPU's nearest NIC, 2 one rail where the receiver's GPU has the sender's NIC among its nearest, else each its own.
        cross_nic: u64 = "CROSS_NIC", "2" in Transports, check CROSS_NIC;
        /// How many of its nearest NICs a GPU's channels take in turn: AUTO shares the nearest NICs out among the GPUs nearest to them, MAX:N takes at most N, ALL takes every nearest NIC whatever other GPUs use. Unset: AUTO.
        netdevs_policy: Option<String> = "NETDEVS_POLICY", "" in Transports, check NETDEVS_POLICY;
        /// 1: all_reduce on host memory across nodes may run through the CollNet plugin exported beside the net plugin (ncclCollNetPlugin_v6..v12): a reduce inside each node to its first rank, an all_reduce of those ranks in the collnet, a broadcast inside each node (NCCL's CollNet chain), where the plugin reports devices and supports the type and operation, and the cost model predicts it faster; all_gather and reduce_scatter likewise where the plugin offers iallgather and ireducescatter (v8+) and the nodes have as many ranks each. Every rank's must agree; 0 (the default): never. GPU communicators do not use it yet.
        collnet_enable: u64 = "COLLNET_ENABLE", "0" in Collectives, check COLLNET_ENABLE;
        /// Fewest nodes a communicator must span for CollNet to be used (NCCL's default, 2).
        collnet_node_threshold: u64 = "COLLNET_NODE_THRESHOLD", "2" in Collectives, check COLLNET_NODES;
        /// 1: GPU communicators skip their per-call pointer checks (each buffer's CUDA memory type and allocation extent, a driver query or two per buffer): a buffer the GPU cannot reach then faults the kernel, and the CUDA context with it, instead of failing the call with InvalidArgument. The checks that guard the process's own memory stay: counts, datatypes, operations, roots, and a host-memory communicator's buffers. NCCL 2.31 no longer reads it (deprecated in 2.2.12).
        checks_disable: bool = "CHECKS_DISABLE", "0" in Collectives;
        /// NCCL's launch mode for a process driving several GPUs. PARALLEL (NCCL's default) launches each GPU's kernel on its own stream, which is what oxccl does; GROUP (NCCL's cooperative launch across the GPUs, deprecated in NCCL 2.9) is accepted and named in a WARN: oxccl still launches each GPU's kernel on its own.
        launch_mode: Option<String> = "LAUNCH_MODE", "" in DevicePath, check LAUNCH_MODE;
        /// NCCL's 1 (its default) connects peers at their first operation, 0 at creation. oxccl connects as its paths do whatever the value: a GPU communicator connects every peer at creation (its device window is set up then), a host-memory communicator each peer at its first operation with it; a value that asks for the other (1 on a GPU, 0 on host memory) is named in a WARN.
        runtime_connect: Option<bool> = "RUNTIME_CONNECT", "" in Transports;
        /// 1 (NCCL's default): the buffers of a GPU collective or send captured into a CUDA graph count as registered (their device memory checked at capture), so that peers that are threads of this process read them where they lie for the graph's life, as with ncclCommRegister; the application keeps them allocated while the graph may run, as NCCL asks. 0: captured operations use registered buffers only.
        graph_register: bool = "GRAPH_REGISTER", "1" in DevicePath;
        /// 1 (NCCL's default): ncclCommRegister registers device buffers with a GPU communicator, so that its peers that are threads of this process over P2P read them where they lie instead of through step slots (send/recv, all_gather, broadcast, the all_reduce ring's all-gather half); other processes' and network peers still take the step slots. 0: ncclCommRegister registers nothing and hands back a NULL handle, as NCCL's.
        local_register: bool = "LOCAL_REGISTER", "1" in DevicePath;
        /// 0 (NCCL's default): a GPU communicator's proxy thread, which drives its transfers through the network and shared memory, runs on the CPUs local to its GPU (sysfs's local_cpulist of its PCI device) that the process also inherited, as NCCL binds its threads; where the two share none, it keeps the inherited set. 1: on the GPU's CPUs alone, ignoring the inherited set (the kernel still holds a thread within its cpuset), as NCCL's 1. Host-memory communicators bind nothing.
        ignore_cpu_affinity: bool = "IGNORE_CPU_AFFINITY", "0" in Transports;
        /// 1: communicators made through the C API are blocking, 0: non-blocking, replacing the config's `blocking` field (and the default, blocking, where no config is given), as in NCCL. Unset: the config's. Rust's `CommConfig::blocking` is the program's own choice.
        comm_blocking: Option<bool> = "COMM_BLOCKING", "" in Bootstrap, by "oxccl-capi";
        /// 1 (NCCL's default): each process answers NCCL's RAS client protocol (`ncclras`, `oxccl ras`) with the job's ranks, their state and the collectives in flight, gathered from the other processes when asked (docs/faults.md, "A live view: oxccl ras"); 0: no RAS thread and no listening sockets.
        ras_enable: bool = "RAS_ENABLE", "1" in Bootstrap;
        /// host:port (IPv6 in brackets) where every process of the job listens for RAS clients, sharing the port (SO_REUSEPORT), as NCCL's; give each job on a host its own port. A process takes the RAS settings of its first communicator.
        ras_addr: String = "RAS_ADDR", "localhost:28028" in Bootstrap, expects "host:port";
        /// Multiplies the RAS timeouts: the wait for each process's answer to a query (5 s unless the client sets TIMEOUT) and the time in one operation after which a rank is called stuck (OXCCL_RAS_STUCK_S).
        ras_timeout_factor: f64 = "RAS_TIMEOUT_FACTOR", "1" in Bootstrap, check RAS_FACTOR;
    }
    env {
        /// 1: communicators made through the C API run on host memory even where GPUs exist (NCCL has no such mode); 0: on the GPU the CUDA runtime would use, host memory only where there is none.
        host_memory: bool = "OXCCL_HOST_MEMORY", "0" in Transports, by "oxccl-capi";
        /// 0: host-memory collectives between processes of one host never read each other's buffers directly (process_vm_readv), only through the shared-memory rings. Any rank's 0 turns it off for all.
        host_direct: bool = "OXCCL_HOST_DIRECT", "1" in HostPath;
        /// Smallest collective (bytes) the direct path takes, broadcast's and reduce's included; unset: 512K, or everything above the inline size where the host has fewer cores than ranks (broadcast and reduce: 512K). Rank 0's is taken.
        host_direct_min: Option<u64> = "OXCCL_HOST_DIRECT_MIN", "" in HostPath;
        /// Threads each rank copies with on the direct path; unset: the host's cores shared among its ranks, at most 8, fewer for small calls.
        host_direct_threads: Option<u64> = "OXCCL_HOST_DIRECT_THREADS", "" in HostPath, check THREADS;
        /// Bytes per slice of a direct all_reduce (0: whole parts; less than one reduction chunk is raised to it); unset: 1M slices once the ranks' inputs outgrow four times the last-level cache, whole parts below. Rank 0's is taken.
        host_direct_slice: Option<u64> = "OXCCL_HOST_DIRECT_SLICE", "" in HostPath;
        /// 1: the direct path's reads go through a thread's scratch with streaming stores; 0: never; unset: once the ranks' buffers outgrow half the last-level cache, on 4 ranks or more with 8 threads or more.
        host_direct_stream: Option<bool> = "OXCCL_HOST_DIRECT_STREAM", "" in HostPath;
        /// Largest point-to-point message (bytes) the direct path carries; larger ones take the rings. Unset: every message where a rank has 2 threads or more, else up to 1M. Rank 0's is taken.
        host_direct_p2p_max: Option<u64> = "OXCCL_HOST_DIRECT_P2P_MAX", "" in HostPath;
        /// Channels of a window (the most thread blocks a collective uses), for tuning: a count fixes it (still within NCCL_MAX_CTAS); `auto`, the default, takes NCCL's count: the link's between the ranks' GPUs (24 for two H200 on NV18), 2 for windows with peers through host memory, within the communicator's CTA bounds.
        dev_channels: Option<AutoOr> = "OXCCL_DEV_CHANNELS", "" in DevicePath, shown "auto";
        /// Threads per block: a multiple of 32 from 64 to 1024.
        dev_threads: Option<u64> = "OXCCL_DEV_THREADS", "" in DevicePath, shown "1024";
        /// FIFO slots per connection and channel, 1 to 64 (windows with peers through host memory: 8, NCCL_STEPS).
        dev_slots: Option<u64> = "OXCCL_DEV_SLOTS", "" in DevicePath, shown "8";
        /// Bytes per FIFO slot, the most one slice carries: a multiple of 16 up to 64M (windows with peers through host memory: NCCL_BUFFSIZE / 8).
        dev_slot_bytes: Option<u64> = "OXCCL_DEV_SLOT_BYTES", "" in DevicePath, shown "256K";
        /// Slices each step of a channel moves before the next step moves: 1, or at most half the slots (windows with peers through host memory: half the slots).
        dev_group: Option<u64> = "OXCCL_DEV_GROUP", "" in DevicePath, shown "1";
        /// A channel is added per this many bytes of data, so that small operations use few blocks.
        dev_channel_bytes: Option<u64> = "OXCCL_DEV_CHANNEL_BYTES", "" in DevicePath, shown "32K";
        /// Smallest slice (bytes) worth a FIFO round (flags, fences), unless the data is smaller.
        dev_min_slice_bytes: Option<u64> = "OXCCL_DEV_MIN_SLICE_BYTES", "" in DevicePath, shown "64K";
        /// Seconds a kernel waits for a peer before it traps, so that a dead peer ends in an error rather than a hung GPU; unset: NCCL_TIMEOUT where that is set, else 120.
        dev_timeout_s: Option<u64> = "OXCCL_DEV_TIMEOUT_S", "" in DevicePath, shown "120", check DEV_TIMEOUT;
        /// Operations of at most this many bytes per rank take the LL protocol where the window has an LL FIFO (NCCL_PROTO: 0 with Simple alone, every size with LL alone; rank 0's is taken).
        dev_ll_bytes: Option<u64> = "OXCCL_DEV_LL_BYTES", "" in DevicePath, shown "4K";
        /// Bytes per slot of the LL FIFO of windows with peers through host memory (16-byte lines, half of them data): 0 (none) or a multiple of 16 from 32 to 1M.
        dev_ll_slot_bytes: Option<u64> = "OXCCL_DEV_LL_SLOT_BYTES", "" in DevicePath, shown "8K";
        /// Directory of compiled kernels, or `none` for no cache; unset: $XDG_CACHE_HOME/oxccl/kernels, else ~/.cache/oxccl/kernels.
        cache_dir: Option<String> = "OXCCL_CACHE_DIR", "" in DevicePath, expects "a directory, or none";
        /// Where all ranks share one GPU from several processes: `leader` runs each collective as one launch of rank 0's over every rank's buffers, `kernels` runs every rank's ring kernels; unset: leader, but kernels under MPS (whose kernels run together) unless the ranks are threads of one process.
        shared_gpu: Option<String> = "OXCCL_SHARED_GPU", "" in SharedGpu, check SHARED_GPU;
        /// Send/recv between processes sharing a GPU: `pull` (each receiver pulls with its own kernel), `leader` (rank 0's stream carries its own messages, the others pull), `server` (a thread of rank 0 also copies the others' messages; refused under CUDA_DEVICE_MAX_CONNECTIONS=1); unset: leader. Rank 0's is taken.
        shared_p2p: Option<String> = "OXCCL_SHARED_P2P", "" in SharedGpu, check SHARED_P2P;
        /// Microseconds rank 0's send waits for the receiver to ask for a message before letting it pull.
        shared_push_wait_us: u64 = "OXCCL_SHARED_PUSH_WAIT_US", "200" in SharedGpu;
        /// 0: where ranks of several processes share GPUs, collectives run on every rank's ring kernels instead of in steps (a reduce on each GPU, one rank per GPU among GPUs, a broadcast on each GPU).
        hier: bool = "OXCCL_HIER", "1" in SharedGpu;
        /// Copy-engine all_gather and all_to_all (no SM) where the output lies in a window registered with NCCL_WIN_COLL_SYMMETRIC and no group is open: `auto` where the CTA policy (NCCL_CTA_POLICY, the config's CTAPolicy) is ZERO, as NCCL chooses; `1` whenever the buffers allow; `0` never. Every rank must set it alike.
        ce_coll: Option<String> = "OXCCL_CE_COLL", "" in DevicePath, shown "auto", check CE_COLL;
        /// 1: a thread of each GPU communicator watches its launched collectives (an event recorded behind every group): after 100 ms without progress it asks the peers what they called, and it compares finished work with the next rank's calls, naming mismatched counts instead of waiting until NCCL_TIMEOUT (or never, where the kernels end regardless). Off by default: the event recorded behind every group cost small collectives 4-6 us on the H200.
        device_watch: bool = "OXCCL_DEVICE_WATCH", "0" in DevicePath;
        /// 0: `oxccl perf`'s host buffers come from the heap instead of transparent huge pages (2 MiB and larger buffers).
        perf_hugepages: bool = "OXCCL_PERF_HUGEPAGES", "1" in Cli, by "oxccl-cli";
        /// Seconds a rank may spend in one collective before the RAS report calls it stuck and names the operation (scaled by NCCL_RAS_TIMEOUT_FACTOR).
        ras_stuck_s: f64 = "OXCCL_RAS_STUCK_S", "5" in Bootstrap, check RAS_FACTOR;
    }
    own {
        /// The environment plugin library: a name (`foo` loads libnccl-env-foo.so), a path, or `none`. Read with getenv before any plugin, as NCCL does.
        "NCCL_ENV_PLUGIN" = "" in Plugins, expects "a library name, a path, or none", by "oxccl";
        /// Which of a plugin's two ABIs oxccl loads: `auto` takes the abi_stable root module that a plugin built with oxccl-plugin exports (the layout of every type checked at load; one built against a different SDK is refused, naming the type and both versions), else NCCL's C symbols; `c` takes NCCL's C symbols only, as NCCL does. Tuner and env plugins (net and profiler plugins load through their C symbols); read with getenv, from the process environment only.
        "OXCCL_PLUGIN_ABI" = "auto" in Plugins, expects "auto or c", by "oxccl (through oxccl-plugin)";
        /// oxccl's TOML configuration file; its `[env]` table gives NCCL_ settings below the environment and above NCCL_CONF_FILE, and our env plugin serves it to NCCL. Environment only.
        "OXCCL_CONFIG" = "" in Plugins, expects "a path to a TOML file",
            by "oxccl, oxccl-env (through oxccl-plugin)";
        /// 1: the IB network offers no device.
        "NCCL_IB_DISABLE" = "0" in IbNet, expects "0 or 1", by "oxccl-net-ib";
        /// HCAs and ports to use: `mlx5_0:1,mlx5_1`, `^` to exclude, `=` for exact names; unset: every active port.
        "NCCL_IB_HCA" = "" in IbNet, expects "a list of HCA[:port], with ^ or = in front", by "oxccl-net-ib";
        /// GID index of RoCE ports; -1 or unset: chosen per port (RoCE v2, IPv4 first).
        "NCCL_IB_GID_INDEX" = "-1" in IbNet, expects "a whole number from -1 to 255", by "oxccl-net-ib";
        /// Traffic class of RoCE packets.
        "NCCL_IB_TC" = "0" in IbNet, expects "a whole number from -1 to 255", by "oxccl-net-ib";
        /// InfiniBand service level.
        "NCCL_IB_SL" = "0" in IbNet, expects "a whole number from -1 to 15", by "oxccl-net-ib";
        /// ACK timeout: 4.096 us x 2^value.
        "NCCL_IB_TIMEOUT" = "20" in IbNet, expects "a whole number from 1 to 31", by "oxccl-net-ib";
        /// Retransmissions before a send fails.
        "NCCL_IB_RETRY_CNT" = "7" in IbNet, expects "a whole number from 0 to 7", by "oxccl-net-ib";
        /// QPs one connection spreads its requests over.
        "NCCL_IB_QPS_PER_CONNECTION" = "1" in IbNet, expects "a whole number from 1 to 16", by "oxccl-net-ib";
        /// 0: ports of one NIC are separate devices.
        "NCCL_IB_MERGE_NICS" = "1" in IbNet, expects "0 or 1", by "oxccl-net-ib";
        /// Partition key index.
        "NCCL_IB_PKEY" = "0" in IbNet, expects "a whole number from 0 to 65535", by "oxccl-net-ib";
        /// 1: receives into GPU memory are not flushed.
        "NCCL_GDR_FLUSH_DISABLE" = "0" in IbNet, expects "0 or 1", by "oxccl-net-ib";
        /// Seconds connect and accept wait for the peer's side of the set-up before failing (NCCL has no bound of its own there).
        "OXCCL_IB_CONNECT_TIMEOUT" = "60" in IbNet, expects "a whole number from 1 to 3600", by "oxccl-net-ib";
        /// The tuner's rules file; unset: NCCL_TUNER_CONFIG_FILE, else no rules (the cost model decides).
        "OXCCL_TUNER_CONFIG" = "" in Tuner, expects "a path to a TOML rules file", by "oxccl-tuner";
        /// The tuner's rules file where OXCCL_TUNER_CONFIG is unset (NCCL's example tuner's name for it).
        "NCCL_TUNER_CONFIG_FILE" = "" in Tuner, expects "a path to a TOML rules file", by "oxccl-tuner";
        /// Events recorded, as NCCL_PROFILE_* bits (decimal or 0x hex); 7: groups, collectives and send/recv.
        "NCCL_PROFILE_EVENT_MASK" = "7" in Profiler, expects "a number, decimal or 0x hex", by "oxccl-profiler";
        /// Directory of the Chrome traces, `oxccl-trace-<host>-<pid>-rank<r>.json`; unset: NCCL_PROFILE_DUMP_FILE, else the current directory.
        "OXCCL_PROFILER_DIR" = "" in Profiler, expects "a directory", by "oxccl-profiler";
        /// Traces go to `<prefix>-<rank>.json`, as NCCL's example profiler's (where OXCCL_PROFILER_DIR is unset).
        "NCCL_PROFILE_DUMP_FILE" = "" in Profiler, expects "a path prefix", by "oxccl-profiler";
    }
    refused {
        "NCCL_SOCKET_MAGIC" = "the socket network's connections open with oxccl's own fixed magic and introduction, and are authenticated with NCCL_SOCKET_KEY_FILE where set; the magic cannot be changed";
        "NCCL_SOCKET_POLL_TIMEOUT_MSEC" = "the bootstrap waits in blocking socket calls bounded by NCCL_TIMEOUT rather than spinning on them, so there is no poll interval to set";
        "NCCL_OOB_NET_ENABLE" = "the bootstrap's exchanges run over TCP sockets only (NCCL_SOCKET_IFNAME), never through the net plugin";
        "NCCL_OOB_NET_IFNAME" = "the bootstrap's exchanges run over TCP sockets only (NCCL_SOCKET_IFNAME), never through the net plugin";
        "NCCL_UID_STAGGER_THRESHOLD" = "the bootstrap does not stagger the ranks' connections to the root";
        "NCCL_UID_STAGGER_RATE" = "the bootstrap does not stagger the ranks' connections to the root";
        "NCCL_IB_ADDR_FAMILY" = "an IB knob that oxccl-net-ib does not have: where NCCL_IB_GID_INDEX is unset it picks the GID itself (RoCE v2, IPv4 first)";
        "NCCL_IB_ADDR_RANGE" = "an IB knob that oxccl-net-ib does not have: where NCCL_IB_GID_INDEX is unset it picks the GID itself (RoCE v2, IPv4 first)";
        "NCCL_IB_ROCE_VERSION_NUM" = "an IB knob that oxccl-net-ib does not have: where NCCL_IB_GID_INDEX is unset it picks the GID itself (RoCE v2, IPv4 first)";
        "NCCL_IB_PKEY_VALUE" = "an IB knob that oxccl-net-ib does not have: it takes the partition key by index (NCCL_IB_PKEY) only";
        "NCCL_IB_FIFO_TC" = "an IB knob that oxccl-net-ib does not have: its control messages go with NCCL_IB_TC like its data";
        "NCCL_IB_RETURN_ASYNC_EVENTS" = "an IB knob that oxccl-net-ib does not have";
        "NCCL_IB_AR_THRESHOLD" = "an IB knob that oxccl-net-ib does not have: no adaptive-routing mode";
        "NCCL_IB_ADAPTIVE_ROUTING" = "an IB knob that oxccl-net-ib does not have: no adaptive-routing mode";
        "NCCL_IB_OOO_RQ" = "an IB knob that oxccl-net-ib does not have: its receives complete in order";
        "NCCL_IB_SPLIT_DATA_ON_QPS" = "an IB knob that oxccl-net-ib does not have: it has one way of spreading messages over NCCL_IB_QPS_PER_CONNECTION queue pairs";
        "NCCL_IB_CUDA_SUPPORT" = "removed from NCCL in 2.4.0; NCCL_NET_GDR_LEVEL replaces it";
        "NCCL_IB_PCI_RELAXED_ORDERING" = "an IB knob that oxccl-net-ib does not have: it registers memory without relaxed ordering";
        "NCCL_IB_ECE_ENABLE" = "an IB knob that oxccl-net-ib does not have: no Enhanced Connection Establishment";
        "NCCL_NET_MERGE_POLICY" = "oxccl-net-ib merges only the ports of one NIC (NCCL_IB_MERGE_NICS), never several NICs into one";
        "NCCL_IGNORE_COLLNET_MISMATCH" = "CollNet setup fails on every rank when the ranks disagree (NCCL_COLLNET_ENABLE, plugin, devices); there is no mode that goes on without it";
        "NCCL_NVLS_ENABLE" = "no NVLS: NVLink SHARP needs NVLink multicast, which is forbidden on the machines oxccl is built and measured on, and oxccl has no NVLS algorithm";
        "NCCL_MNNVL_ENABLE" = "no multi-node NVLink: oxccl reaches other hosts through the net plugin only";
        "NCCL_MNNVL_UUID" = "no multi-node NVLink: oxccl reaches other hosts through the net plugin only";
        "NCCL_MNNVL_CLIQUE_ID" = "no multi-node NVLink: oxccl reaches other hosts through the net plugin only";
        "NCCL_SYM_GIN_KERNELS_ENABLE" = "no symmetric-memory kernels and no GPU-initiated networking (GIN)";
        "NCCL_RMA_EAGER_INIT" = "no one-sided RMA: windows and signals are stubs";
        "NCCL_WIN_ENABLE" = "no window registration: ncclCommWindowRegister is a stub";
        "NCCL_LEGACY_CUDA_REGISTER" = "registered buffers are read in place by peers of the same process only: other processes do not map them through CUDA IPC yet";
        "NCCL_NVB_DISABLE" = "oxccl never routes between GPUs of a host through an intermediate GPU";
        "NCCL_PXN_DISABLE" = "no PXN: oxccl never sends through a NIC of another GPU";
        "NCCL_P2P_PXN_LEVEL" = "no PXN: oxccl never sends through a NIC of another GPU";
        "NCCL_PXN_C2C" = "no PXN: oxccl never sends through a NIC of another GPU";
        "NCCL_NET_SHARED_COMMS" = "no PXN, whose connections this shares";
        "NCCL_NET_SHARED_BUFFERS" = "each network connection has its own buffers (NCCL_BUFFSIZE); no shared pool";
        "NCCL_NET_GDR_C2C" = "no C2C (Grace) topology: GPUDirect over the network follows NCCL_NET_GDR_LEVEL alone";
        "NCCL_P2P_DIRECT_DISABLE" = "no switch of oxccl's for direct access to user buffers between GPUs of one process";
        "NCCL_IGNORE_NET_MISMATCH" = "oxccl does not compare network device counts across ranks";
        "NCCL_IPC_USE_ABSTRACT_SOCKET" = "CUDA IPC handles travel through the bootstrap, not Unix domain sockets";
        "NCCL_MULTI_RANK_GPU_ENABLE" = "oxccl always lets ranks share a GPU (OXCCL_SHARED_GPU picks how); this neither enables nor forbids it";
        "NCCL_P2P_NET_CHUNKSIZE" = "send/recv through the network slice by the connection's slots (NCCL_BUFFSIZE / 8), as collectives do; no size of their own";
        "NCCL_P2P_LL_THRESHOLD" = "no LL limit of send/recv's own (OXCCL_DEV_LL_BYTES sets the device path's)";
        "NCCL_ALLOC_P2P_NET_LL_BUFFERS" = "no LL buffers of send/recv's own on network connections";
        "NCCL_CUMEM_ENABLE" = "not switchable: ncclMemAlloc always takes the CUDA virtual memory API where the GPU has it (cuMemAlloc otherwise), and oxccl's own buffers are cuMemAlloc memory shared through CUDA IPC";
        "NCCL_CUMEM_HOST_ENABLE" = "oxccl's host memory is POSIX shared memory; the cuMem host path is not built";
        "NCCL_GDRCOPY_ENABLE" = "oxccl does not use GDRCopy";
        "NCCL_GDRCOPY_FIFO_ENABLE" = "oxccl does not use GDRCopy";
        "NCCL_GDRCOPY_SYNC_ENABLE" = "oxccl does not use GDRCopy";
        "NCCL_GDRCOPY_FLUSH_ENABLE" = "oxccl does not use GDRCopy";
        "NCCL_MEM_SYNC_DOMAIN" = "oxccl's kernels launch without a memory sync domain attribute";
        "NCCL_SET_STACK_SIZE" = "oxccl's kernels (compiled with NVRTC) set no stack size";
        "NCCL_GRAPH_MIXING_SUPPORT" = "not implemented: oxccl's launches are ordered on the caller's stream, captured or not; NCCL's switch over graph mixing has no counterpart";
        "NCCL_GRAPH_STREAM_ORDERING" = "not implemented: oxccl adds no serialisation of its own between captured launches, so there is none to turn off";
        "NCCL_LAUNCH_ORDER_IMPLICIT" = "oxccl does not order launches of different communicators on one GPU by host program order";
        "NCCL_LAUNCH_RACE_FATAL" = "oxccl does not order launches of different communicators on one GPU by host program order, so it has no race to catch";
        "NCCL_CHECK_POINTERS" = "no pointer-checking mode: oxccl checks arguments one way (NCCL_CHECKS_DISABLE turns those checks off)";
        "NCCL_CHECK_MODE" = "no DEBUG_LOCAL or DEBUG_GLOBAL mode: oxccl checks arguments one way (NCCL_CHECKS_DISABLE turns those checks off)";
        "NCCL_SINGLE_RING_THRESHOLD" = "removed from NCCL in 2.3; the cost model (or a tuner plugin) chooses the channels";
        "NCCL_LL_THRESHOLD" = "removed from NCCL in 2.5; the cost model (or NCCL_PROTO, OXCCL_DEV_LL_BYTES) chooses the protocol";
        "NCCL_TREE_THRESHOLD" = "removed from NCCL in 2.5; the cost model (or NCCL_ALGO, a tuner plugin) chooses the algorithm";
    }
}

/// The declared setting named `name` (the whole variable name).
pub fn setting(name: &str) -> Option<&'static ParamDef> {
    SETTINGS.iter().find(|d| d.name == name)
}

/// Whether the OXCCL_ setting `name` is set (not blank) in the process
/// environment; its value is checked by [`ox`].
pub fn env_is_set(name: &str) -> bool {
    debug_assert!(setting(name).is_some(), "{name} is not declared");
    std::env::var_os(name).is_some_and(|v| !v.to_string_lossy().trim().is_empty())
}

/// The command that prints docs/settings.md.
pub const MARKDOWN_COMMAND: &str =
    "cargo run -p oxccl-cli -- info --settings-markdown > docs/settings.md";

/// docs/settings.md: every setting by subject, with its default, what it
/// accepts and who reads it, and where values come from (`oxccl info
/// --settings-markdown` prints it).
pub fn markdown() -> String {
    let mut m = String::new();
    let mut line = |s: &str| {
        m.push_str(s);
        m.push('\n');
    };
    line("# Settings");
    line("");
    line(&format!(
        "<!-- Generated from the table in core/src/config/mod.rs by `{MARKDOWN_COMMAND}`; do not edit by hand (cli/tests/settings_doc.rs fails where this file differs). -->"
    ));
    line("");
    line("Every environment variable oxccl reads, by subject: its default, what it accepts, which crate reads it and what it does. `oxccl info` shows the value each resolves to on this machine and where it came from. Variables that only tests and tools read are listed at the end.");
    line("");
    line("## Where values come from");
    line("");
    line("- `NCCL_` settings read by the core (`oxccl`), highest first:");
    line("  1. the API: a communicator's config (`ncclConfig_t` in C, `CommConfig` in Rust);");
    line("  2. the environment, read through the env plugin when one is loaded (`NCCL_ENV_PLUGIN`), as NCCL reads it;");
    line("  3. oxccl's TOML file named by `OXCCL_CONFIG`, its `[env]` table;");
    line("  4. NCCL's configuration file: `NCCL_CONF_FILE`, else `~/.nccl.conf`, else `/etc/nccl.conf` (`KEY=VALUE` lines, `#` starts a comment);");
    line("  5. the default.");
    line("- `NCCL_ENV_PLUGIN`, `NCCL_CONF_FILE` and `OXCCL_CONFIG` come from the process environment only (read before any plugin or file), and `NCCL_SOCKET_KEY_FILE` must (the socket network reads only the environment, and both ends of a connection need the key).");
    line("- `OXCCL_` settings come from the process environment only: never from the env plugin or a file.");
    line("- Settings read by a plugin or another crate that does not link the core (\"read by\" names it) come from the environment of the process that loads it.");
    line("- A blank value means unset. A value that does not parse or is out of range is an error naming the variable and what it accepts: the core's refuse to create the communicator (`ncclInvalidArgument`), a plugin's fail its initialisation. Never a silent default.");
    line("- Where a setting says \"rank 0's is taken\", every rank takes rank 0's value (ranks that differ would cut their data differently), and a rank that differs says so in its log.");
    for subject in Subject::ALL {
        line("");
        line(&format!("## {}", subject.title()));
        for d in SETTINGS.iter().filter(|d| d.subject == subject) {
            let default = if d.default.is_empty() {
                "unset".to_string()
            } else {
                format!("`{}`", d.default)
            };
            let by = match d.read {
                Read::Config => format!("{} (per communicator)", d.by),
                Read::Env | Read::Own => d.by.to_string(),
            };
            line("");
            line(&format!("### `{}`", d.name));
            line("");
            line(d.doc.trim());
            line("");
            line(&format!(
                "Default {default}; accepts {}; read by {by}.",
                d.expects
            ));
        }
    }
    line("");
    line("## Not implemented");
    line("");
    line("Variables NCCL 2.31.2 documents that oxccl does not implement, each with why. One that is set (in the environment, through the env plugin, or in a configuration file) is named in a WARN with its reason, once per process, when a communicator is made; nothing else is done with it. `oxccl info` lists them.");
    line("");
    for r in REFUSED {
        line(&format!("- `{}`: {}.", r.name, r.why));
    }
    line("");
    line("## Variables of tests and tools (not settings)");
    line("");
    line("Read by oxccl's tests, its tools and the launchers of `oxccl perf` and `oxccl recover`, never by the library:");
    line("");
    for (name, why) in TOOL_VARIABLES {
        line(&format!("- `{name}`: {why}."));
    }
    m
}

/// Variables that tests, tools and oxccl's own launchers read: not settings
/// of the library, each with why it exists.
pub const TOOL_VARIABLES: &[(&str, &str)] = &[
    ("OXCCL_RANK", "set by `oxccl perf --ranks N` and `oxccl recover` for each rank they start: its rank"),
    ("OXCCL_NRANKS", "set by the same launchers: the number of ranks"),
    ("OXCCL_UNIQUE_ID", "set by the same launchers: the communicator's unique id in hex"),
    ("OXCCL_RECOVER_MARK", "set by `oxccl recover` for its ranks: the file the victim writes the time of its signal to"),
    ("OXCCL_TEST_CHILD", "marks a test's own child process (tests/src, capi/tests/bad_settings.rs)"),
    ("OXCCL_NETNS_CHILD", "marks a multi-host test's child inside a network namespace"),
    ("OXCCL_FAKE_VERBS_CHILD", "marks net-ib's fake-verbs test child"),
    ("OXCCL_NET_IB_DLOPEN_CHILD", "marks net-ib's dlopen test child"),
    ("OXCCL_NVTX_TEST_CHILD", "marks the profiler's NVTX test child"),
    ("OXCCL_TEST_IPC_PORT", "marks the CUDA IPC test's child and gives it the parent's port"),
    ("OXCCL_TEST_MARK", "a multi-host test's progress file"),
    ("OXCCL_TEST_SHRINK", "which shrink a multi-host test's child runs"),
    ("OXCCL_NCCLRAS", "an ncclras built by tools/build_ncclras.sh, which tests/tests/ras.rs then runs beside `oxccl ras`"),
    ("OXCCL_TEST_RANK", "the C API test programs' rank"),
    ("OXCCL_TEST_NRANKS", "the C API test programs' number of ranks"),
    ("OXCCL_TEST_SEED", "the C API test programs' random seed"),
    ("OXCCL_FIXTURES", "set at build time by tests/build.rs: the directory of the C fixtures"),
    ("OXCCL_NCCL_SRC", "an NCCL source tree or git dir the third-party tests build from"),
    ("OXCCL_OFI_SRC", "an aws-ofi-nccl source tree or git dir its test builds from"),
    ("OXCCL_FASTSOCKET_SRC", "a nccl-fastsocket source tree or git dir its test builds from"),
    ("NCCL_SRC", "passed to third-party plugins' builds: the NCCL headers they compile against"),
    ("OXCCL_BLESS_HEADER", "1: the header test rewrites capi/include/nccl.h instead of comparing"),
    ("OXCCL_KEEP_TRACES", "set: profiler tests keep their traces to open in a viewer"),
    ("OXCCL_BIN", "the `oxccl` binary GPU tests run where they run on another machine than they were built on"),
    ("OXCCL_EXPECT_NVLINK", "NVLinks the topology test expects between two GPUs"),
    ("OXCCL_NVTX_LOG", "the file the stand-in NVTX tool of the profiler's tests logs to"),
    ("OXCCL_TEST_WIN_ID", "marks the window test's child and gives it the communicator's unique id in hex"),
];

/// Quoted names that are not variables oxccl reads, each with why it is
/// quoted. A name ending in `_` is a prefix (of names built with format!).
pub const NOT_VARIABLES: &[(&str, &str)] = &[
    (
        "NCCL_PTR_HOST",
        "NCCL's pointer-support flag, named in messages",
    ),
    (
        "NCCL_PTR_DMABUF",
        "NCCL's pointer-support flag, named in messages",
    ),
    (
        "NCCL_INSPECTOR_ENABLE",
        "NCCL's inspector plugin's, set in its test",
    ),
    (
        "NCCL_INSPECTOR_DUMP_DIR",
        "NCCL's inspector plugin's, set in its test",
    ),
    (
        "NCCL_INSPECTOR_DUMP_VERBOSE",
        "NCCL's inspector plugin's, set in its test",
    ),
    (
        "NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES",
        "NCCL's inspector plugin's, set in its test",
    ),
    (
        "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS",
        "NCCL's inspector plugin's, set in its test",
    ),
    (
        "NCCL_PROFILE_PROXY_CTRL_POOL_SIZE",
        "NCCL's example profiler's, set in its test",
    ),
    (
        "NCCL_PROFILE_",
        "NCCL_PROFILE_<EVENT>_POOL_SIZE: NCCL's example profiler's, set in its test",
    ),
    ("NCCL_A", "made up by the env plugin's tests"),
    ("NCCL_B", "made up by the env plugin's tests"),
    ("NCCL_PANIC", "made up by the env plugin's tests"),
    ("NCCL_X", "made up by tests of bad values"),
    ("NCCL_NO_SUCH_THING", "made up by the parameter API's tests"),
    ("NCCL_NOT_SET_ANYWHERE", "made up by the env plugin's tests"),
    (
        "NCCL_NO_SUCH_PARAM",
        "made up by the C tests of the parameter API",
    ),
    (
        "NCCL_CONFIG_INITIALIZER",
        "nccl.h's macro, named in a C test's expected message",
    ),
    ("OXCCL_MAX_RANKS", "a macro of the CUDA source"),
    ("OXCCL_MAX_STEPS", "a macro of the CUDA source"),
    ("OXCCL_FLAG_BYTES", "a macro of the CUDA source"),
    ("OXCCL_OP", "a macro of the CUDA source"),
    (
        "NCCL_COLLCONFIG_INITIALIZER",
        "nccl.h's macro for ncclCollConfig_t, used by a C test",
    ),
    (
        "NCCL_COMM_PROPERTIES_INITIALIZER",
        "nccl_device's macro for ncclCommProperties_t, used by a C test",
    ),
    (
        "NCCL_WIN_COLL_SYMMETRIC",
        "nccl.h's window registration flag, used by a C test",
    ),
];

impl Config {
    /// Resolves every NCCL_ setting of the core from the environment, the
    /// configuration files and the defaults, and checks every OXCCL_ one
    /// ([`ox`]).
    pub fn load() -> Result<Config> {
        Config::load_with(&[])
    }

    /// As [`Config::load`], with values given through the API on top.
    pub fn load_with(api: &[(&str, &str)]) -> Result<Config> {
        if let Some(e) = env_reader().and_then(|r| (r.setting_error)()) {
            return Err(e);
        }
        let mut raw: BTreeMap<&'static str, (String, Source)> = BTreeMap::new();
        // Refused variables set anywhere, by name; a higher source replaces
        // a lower one, as for settings.
        let mut refused_set: BTreeMap<&'static str, RefusedSet> = BTreeMap::new();
        let mut note_refused = |name: &str, value: String, source: Source| {
            if let Some(def) = refused(name).filter(|_| !value.trim().is_empty()) {
                refused_set.insert(def.name, RefusedSet { def, value, source });
            }
        };
        if let Some((path, text)) = conf_file()? {
            for (key, value) in parse_conf(&text) {
                if let Some(def) = lookup(&key) {
                    raw.insert(def.key, (value, Source::File(path.clone())));
                } else {
                    note_refused(&format!("NCCL_{key}"), value, Source::File(path.clone()));
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
                } else {
                    note_refused(&name, value, Source::File(f.path.clone()));
                }
            }
        }
        let env_source = env_reader()
            .and_then(|r| (r.source)())
            .map_or(Source::Env, Source::EnvPlugin);
        for def in PARAMS {
            if let Some(v) = var(&def.env_name()) {
                raw.insert(def.key, (v, env_source.clone()));
            }
        }
        for r in REFUSED {
            if let Some(v) = var(r.name) {
                note_refused(r.name, v, env_source.clone());
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
        let mut cfg = Config::from_raw(&raw)?;
        cfg.env = ox::entries(&|k| std::env::var(k))?;
        cfg.refused = refused_set.into_values().collect();
        Ok(cfg)
    }

    /// The refused variables ([`REFUSED`]) set in the environment or a
    /// configuration file, with their values and sources.
    pub fn refused_set(&self) -> &[RefusedSet] {
        &self.refused
    }

    /// Names each refused variable that is set in one WARN with why oxccl
    /// does not implement it, and each setting whose value asks for what
    /// oxccl does not do ([`Config::unhonoured`]), once per process (every
    /// communicator's creation calls this); returns the names warned about
    /// now.
    pub fn warn_refused(&self) -> Vec<&'static str> {
        let mut now = Vec::new();
        for r in &self.refused {
            let line = format!(
                "{}={} (from {}) is not implemented by oxccl and is ignored: {}",
                r.def.name, r.value, r.source, r.def.why
            );
            if warn_once(r.def.name, &line) {
                now.push(r.def.name);
            }
        }
        for (name, line) in self.unhonoured() {
            if warn_once(name, &line) {
                now.push(name);
            }
        }
        now
    }

    /// The settings set to a value oxccl accepts but does not act on, each
    /// with the line that says so.
    pub fn unhonoured(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let mut set = |key: &str, on: bool, why: &str| {
            if let Some(e) = self.entries.get(key).filter(|_| on && self.is_set(key)) {
                out.push((
                    e.def.name,
                    format!("{}={} (from {}): {why}", e.def.name, e.value, e.source),
                ));
            }
        };
        let group = self
            .launch_mode
            .as_deref()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("GROUP"));
        set("LAUNCH_MODE", group, "oxccl has no cooperative launch across GPUs (NCCL deprecated it in 2.9); each GPU's kernel is launched on its own stream, as PARALLEL");
        out
    }

    /// What a communicator on a GPU (`on_gpu`) or on host memory does with
    /// NCCL_RUNTIME_CONNECT where its value asks for what that path does
    /// not do: the line of the WARN that says so.
    pub fn runtime_connect_note(&self, on_gpu: bool) -> Option<String> {
        let src = self.source("RUNTIME_CONNECT")?;
        match (self.runtime_connect?, on_gpu) {
            (true, true) => Some(format!("NCCL_RUNTIME_CONNECT=1 (from {src}): a GPU communicator connects every peer at creation, where its device window is set up; connecting at first use is not implemented")),
            (false, false) => Some(format!("NCCL_RUNTIME_CONNECT=0 (from {src}): a host-memory communicator connects each peer at its first operation with it; connecting at creation is not implemented")),
            _ => None,
        }
    }

    /// Every setting the core reads with its resolved value and where it
    /// came from: the NCCL_ ones, then the OXCCL_ ones.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values().chain(&self.env)
    }

    /// Where the setting `key` came from: a key of [`PARAMS`] (no `NCCL_`)
    /// or an OXCCL_ variable's name.
    pub fn source(&self, key: &str) -> Option<&Source> {
        self.entries
            .get(key)
            .or_else(|| self.env.iter().find(|e| e.def.key == key))
            .map(|e| &e.source)
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

    /// NCCL's connect retries where NCCL_SOCKET_RETRY_CNT or
    /// NCCL_SOCKET_RETRY_SLEEP_MSEC is set (NCCL's default for the other);
    /// `None`: both unset, oxccl's own retries.
    pub fn socket_retry(&self) -> Option<oxccl_netif::Retry> {
        use oxccl_netif::retry::{NCCL_RETRY_CNT, NCCL_RETRY_SLEEP_MSEC};
        if self.socket_retry_cnt.is_none() && self.socket_retry_sleep_msec.is_none() {
            return None;
        }
        Some(oxccl_netif::Retry {
            // Checked at load: at most 100000.
            count: self
                .socket_retry_cnt
                .map_or(NCCL_RETRY_CNT, |c| u32::try_from(c).unwrap_or(u32::MAX)),
            sleep: std::time::Duration::from_millis(
                self.socket_retry_sleep_msec
                    .unwrap_or(NCCL_RETRY_SLEEP_MSEC),
            ),
        })
    }

    /// NCCL_TIMEOUT, within the range its check holds it to (so that no
    /// conversion overflows).
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.timeout_s)
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
    match env_reader() {
        Some(r) => (r.var)(name),
        None => std::env::var(name).ok(),
    }
}

/// How `NCCL_` settings are read from the environment: the env plugin's
/// loader ([`crate::plugin::env`]) registers one with `inventory`, so that
/// this table, a floor below the plugins, does not import them. Without one,
/// values come from the process environment.
pub struct EnvReader {
    /// The value of a variable: the plugin's answer when one is in use.
    pub var: fn(&str) -> Option<String>,
    /// The plugin's name while values come through it.
    pub source: fn() -> Option<String>,
    /// The error every read of the configuration fails with (an explicit
    /// `NCCL_ENV_PLUGIN` that names no library).
    pub setting_error: fn() -> Option<Error>,
}

oxccl_plugin::inventory::collect!(EnvReader);

fn env_reader() -> Option<&'static EnvReader> {
    oxccl_plugin::inventory::iter::<EnvReader>
        .into_iter()
        .next()
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

    /// The topology settings refuse what NCCL would not recognise (NCCL
    /// falls back silently on some; the user learns nothing there), and
    /// take what it does.
    #[test]
    fn topology_settings_are_strict() {
        for (k, bad, expects) in [
            ("NCCL_P2P_LEVEL", "near", "LOC, NVL"),
            ("NCCL_P2P_LEVEL", "NET", "LOC, NVL"),
            ("NCCL_CROSS_NIC", "3", "0, 1 or 2"),
            ("NCCL_NETDEVS_POLICY", "MAX:0", "MAX:N"),
            ("NCCL_NETDEVS_POLICY", "some", "MAX:N"),
            ("NCCL_NET_GDR_READ", "2", "0 or 1"),
        ] {
            let e = Config::load_with(&[(k, bad)]).unwrap_err().to_string();
            assert!(e.contains(k) && e.contains(expects), "{k}={bad}: {e}");
        }
        let c = Config::load_with(&[
            ("NCCL_P2P_LEVEL", "2"),
            ("NCCL_CROSS_NIC", "0"),
            ("NCCL_NETDEVS_POLICY", "max:2"),
            ("NCCL_NET_GDR_READ", "0"),
            ("NCCL_TOPO_FILE", "/etc/topo.xml"),
        ])
        .unwrap();
        assert_eq!(c.p2p_level.as_deref(), Some("2"));
        assert_eq!(c.cross_nic, 0);
        assert_eq!(c.netdevs_policy.as_deref(), Some("max:2"));
        assert_eq!(c.net_gdr_read, Some(false));
        assert_eq!(c.topo_file.as_deref(), Some("/etc/topo.xml"));
        assert_eq!(Config::load_with(&[]).unwrap().cross_nic, 2);
    }

    /// NCCL_TIMEOUT=inf or 1e30 overflowed Duration (a panic in the CLI,
    /// "internal error" from the C API); 0, -5 and NaN meant 1 ms. Each is
    /// refused now, naming the variable and the range, from the
    /// environment's path (from_raw) and from the API alike.
    #[test]
    fn nccl_timeout_out_of_range_is_refused() {
        for bad in [
            "inf", "1e30", "0", "-5", "NaN", "-inf", "0.0001", "31536001",
        ] {
            let mut raw = BTreeMap::new();
            raw.insert("TIMEOUT", (bad.to_string(), Source::Env));
            let e = Config::from_raw(&raw).unwrap_err();
            let m = e.to_string();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e:?}");
            assert!(
                m.contains(&format!("NCCL_TIMEOUT={bad:?}")) && m.contains("0.001 to 31536000"),
                "{bad}: {m}"
            );
            let e = Config::load_with(&[("NCCL_TIMEOUT", bad)]).unwrap_err();
            assert!(e.to_string().contains("NCCL_TIMEOUT"), "{bad}: {e}");
        }
        for good in ["0.001", "2.5", "300", "31536000"] {
            let c = Config::load_with(&[("TIMEOUT", good)]).unwrap();
            assert_eq!(c.timeout().as_secs_f64(), good.parse::<f64>().unwrap());
        }
    }

    /// Garbage in any OXCCL_ setting the core, the C API or the CLI reads
    /// was ignored or defaulted; now each is InvalidArgument naming the
    /// variable and what it accepts, from every Config::load. Every such
    /// setting has a case here (OXCCL_CACHE_DIR takes any text: its case
    /// is a value that is not UTF-8).
    #[test]
    fn every_oxccl_setting_refuses_garbage_naming_it() {
        use std::env::VarError;
        let bad = [
            ("OXCCL_HOST_MEMORY", "yes please"),
            ("OXCCL_HOST_DIRECT", "maybe"),
            ("OXCCL_HOST_DIRECT", "2"),
            ("OXCCL_HOST_DIRECT_MIN", "1Q"),
            ("OXCCL_HOST_DIRECT_MIN", "-1"),
            ("OXCCL_HOST_DIRECT_THREADS", "0"),
            ("OXCCL_HOST_DIRECT_THREADS", "257"),
            ("OXCCL_HOST_DIRECT_THREADS", "four"),
            ("OXCCL_HOST_DIRECT_SLICE", "big"),
            ("OXCCL_HOST_DIRECT_STREAM", "2"),
            ("OXCCL_HOST_DIRECT_P2P_MAX", "1.5M"),
            ("OXCCL_DEV_CHANNELS", "many"),
            ("OXCCL_DEV_THREADS", "x"),
            ("OXCCL_RAS_STUCK_S", "soon"),
            ("OXCCL_DEV_SLOTS", "8 slots"),
            ("OXCCL_DEV_SLOT_BYTES", "256KB"),
            ("OXCCL_DEV_GROUP", "-2"),
            ("OXCCL_DEV_CHANNEL_BYTES", "32k!"),
            ("OXCCL_DEV_MIN_SLICE_BYTES", "1e6"),
            ("OXCCL_DEV_TIMEOUT_S", "0"),
            ("OXCCL_DEV_TIMEOUT_S", "99999999999"),
            ("OXCCL_DEV_LL_BYTES", "4 KiB"),
            ("OXCCL_DEV_LL_SLOT_BYTES", "eight"),
            ("OXCCL_SHARED_GPU", "gpu"),
            ("OXCCL_SHARED_P2P", "push"),
            ("OXCCL_SHARED_PUSH_WAIT_US", "soon"),
            ("OXCCL_HIER", "2"),
            ("OXCCL_PERF_HUGEPAGES", "huge"),
            ("OXCCL_CE_COLL", "sometimes"),
            ("OXCCL_DEVICE_WATCH", "maybe"),
        ];
        for (name, value) in bad {
            let get = |k: &str| {
                if k == name {
                    Ok(value.to_string())
                } else {
                    Err(VarError::NotPresent)
                }
            };
            let e = ox::entries(&get).unwrap_err();
            let m = e.to_string();
            assert!(
                matches!(e, Error::InvalidArgument(_)),
                "{name}={value}: {e:?}"
            );
            let expects = setting(name).unwrap().expects;
            assert!(
                m.contains(&format!("{name}={value:?} (from env)")) && m.contains(expects),
                "{name}={value}: {m}"
            );
        }
        let not_utf8 = |k: &str| {
            if k == "OXCCL_CACHE_DIR" {
                Err(VarError::NotUnicode(std::ffi::OsString::from("x")))
            } else {
                Err(VarError::NotPresent)
            }
        };
        let e = ox::entries(&not_utf8).unwrap_err().to_string();
        assert!(
            e.contains("OXCCL_CACHE_DIR") && e.contains("not UTF-8"),
            "{e}"
        );
        for d in SETTINGS.iter().filter(|d| d.read == Read::Env) {
            assert!(
                d.name == "OXCCL_CACHE_DIR" || bad.iter().any(|(n, _)| *n == d.name),
                "{} has no bad value here",
                d.name
            );
        }
        // Unset, blank and good values.
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
                    .ok_or(VarError::NotPresent)
            }
        };
        let unset = ox::entries(&env(&[])).unwrap();
        assert!(unset.iter().all(|e| e.source == Source::Default));
        // A row that shows its reader's default reads as unset (None), so
        // that the reader's own default and its "unset" rules stand.
        let none = env(&[]);
        assert_eq!(ox::read::dev_group(&none).unwrap().0, None);
        assert_eq!(ox::read::dev_channels(&none).unwrap().0, None);
        assert_eq!(ox::read::dev_timeout_s(&none).unwrap().0, None);
        assert!(ox::read::hier(&none).unwrap().0, "a plain default parses");
        let good = env(&[
            ("OXCCL_HOST_DIRECT", " "),
            ("OXCCL_HOST_DIRECT_SLICE", "1M"),
            ("OXCCL_HOST_DIRECT_THREADS", "256"),
            ("OXCCL_HOST_DIRECT_STREAM", "0"),
            ("OXCCL_DEV_CHANNELS", "auto"),
            ("OXCCL_SHARED_P2P", "server"),
        ]);
        assert!(
            ox::read::host_direct(&good).unwrap().0,
            "blank: the default"
        );
        assert_eq!(ox::read::host_direct_slice(&good).unwrap().0, Some(1 << 20));
        assert_eq!(ox::read::host_direct_threads(&good).unwrap().0, Some(256));
        assert_eq!(ox::read::host_direct_stream(&good).unwrap().0, Some(false));
        assert_eq!(ox::read::dev_channels(&good).unwrap().0, Some(AutoOr::Auto));
        let all = ox::entries(&good).unwrap();
        let slice = all.iter().find(|e| e.def.name == "OXCCL_HOST_DIRECT_SLICE");
        assert_eq!(
            slice.map(|e| (&*e.value, &e.source)),
            Some(("1M", &Source::Env))
        );
    }

    /// NCCL_PROTO was parsed by the device path alone: garbage passed on
    /// host memory. NCCL_BUFFSIZE=1 gave 64-byte slots.
    #[test]
    fn nccl_proto_and_buffsize_are_checked_at_load() {
        for (key, bad, says) in [
            ("PROTO", "fast", "\"fast\" is no protocol"),
            ("PROTO", "^LL,Simple", "leaves neither"),
            ("PROTO", "LL128", "leaves neither"),
            ("BUFFSIZE", "1", "from 64K to 512M"),
            ("BUFFSIZE", "65535", "from 64K to 512M"),
            ("BUFFSIZE", "1G", "from 64K to 512M"),
            ("BUFFSIZE", "4MB", "from 64K to 512M"),
        ] {
            let mut raw = BTreeMap::new();
            raw.insert(key, (bad.to_string(), Source::Env));
            let e = Config::from_raw(&raw).unwrap_err();
            let m = e.to_string();
            assert!(matches!(e, Error::InvalidArgument(_)), "{key}={bad}: {e:?}");
            assert!(
                m.contains(&format!("NCCL_{key}={bad:?}")) && m.contains(says),
                "{key}={bad}: {m}"
            );
        }
        for (key, good) in [
            ("PROTO", "Simple"),
            ("PROTO", "^LL128"),
            ("PROTO", ""),
            ("BUFFSIZE", "64K"),
            ("BUFFSIZE", "512M"),
        ] {
            Config::load_with(&[(key, good)]).unwrap_or_else(|e| panic!("{key}={good}: {e}"));
        }
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

    /// Every `"NCCL_...` and `"OXCCL_...` string in the workspace's Rust
    /// and C sources (every crate, its tests, examples and build scripts,
    /// the fuzz targets, the C fixtures) names a declared setting, a
    /// variable of [`TOOL_VARIABLES`] or a name of [`NOT_VARIABLES`]. A
    /// name ending in `_` is a prefix: one followed by `{` (a name built
    /// with format!, as `format!("NCCL_PROFILE_{p}_POOL_SIZE")`) must be
    /// listed itself, any other must begin some declared or listed name;
    /// bare `NCCL_` and `OXCCL_` (the table's own `concat!` and `format!`)
    /// pass. Each listed name must still occur somewhere, and no name may be
    /// both declared and listed.
    #[test]
    fn every_variable_named_in_the_workspace_is_declared() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let listed: Vec<&str> = TOOL_VARIABLES
            .iter()
            .chain(NOT_VARIABLES)
            .map(|(n, _)| *n)
            .collect();
        let known = |n: &str| setting(n).is_some() || refused(n).is_some() || listed.contains(&n);
        let mut undeclared = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut files = 0;
        visit(&root, &mut |path, text| {
            files += 1;
            for quote in ["\"NCCL_", "\"OXCCL_"] {
                for (i, _) in text.match_indices(quote) {
                    let name: String = text[i + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                        .collect();
                    let next = text[i + 1 + name.len()..].chars().next();
                    seen.insert(name.clone());
                    let ok = match name.as_str() {
                        "NCCL_" | "OXCCL_" => true,
                        n if n.ends_with('_') && next == Some('{') => listed.contains(&n),
                        n if n.ends_with('_') => {
                            known(n)
                                || SETTINGS.iter().any(|d| d.name.starts_with(n))
                                || REFUSED.iter().any(|r| r.name.starts_with(n))
                                || listed.iter().any(|l| l.starts_with(n))
                        }
                        n => known(n),
                    };
                    if !ok {
                        let line = text[..i].lines().count().max(1);
                        let at = path.strip_prefix(&root).unwrap_or(path);
                        undeclared.push(format!("{name} ({}:{line})", at.display()));
                    }
                }
            }
        });
        assert!(
            files > 200,
            "only {files} files found under {}",
            root.display()
        );
        assert!(
            undeclared.is_empty(),
            "not in the table of core/src/config/mod.rs, TOOL_VARIABLES or NOT_VARIABLES: {undeclared:#?}"
        );
        let stale: Vec<&&str> = listed.iter().filter(|n| !seen.contains(**n)).collect();
        assert!(stale.is_empty(), "listed but named nowhere: {stale:?}");
        let both: Vec<&&str> = listed
            .iter()
            .filter(|n| setting(n).is_some() || refused(n).is_some())
            .collect();
        assert!(
            both.is_empty(),
            "declared (or refused) and listed: {both:?}"
        );
    }

    /// Every NCCL_ variable NCCL 2.31.2 documents (the checked-in list of
    /// names, config/nccl_2_31_names.txt) is in the settings table or in
    /// the refused list, never both; every refused one is such a name and
    /// says why; none is refused twice.
    #[test]
    fn nccl_2_31_names_are_declared_or_refused() {
        let text = include_str!("nccl_2_31_names.txt");
        let mut lines = text.lines();
        let header = lines.next().unwrap_or_default();
        assert!(
            header.starts_with('#') && header.contains("2.31.2"),
            "{header}"
        );
        let names: Vec<&str> = lines.map(str::trim).filter(|l| !l.is_empty()).collect();
        assert_eq!(names.len(), 120, "NCCL 2.31.2 documents 120 variables");
        let neither: Vec<&&str> = names
            .iter()
            .filter(|n| setting(n).is_none() && refused(n).is_none())
            .collect();
        assert!(
            neither.is_empty(),
            "documented by NCCL 2.31.2 but neither in the settings table of core/src/config/mod.rs nor refused there (with why): {neither:?}"
        );
        let both: Vec<&&str> = names
            .iter()
            .filter(|n| setting(n).is_some() && refused(n).is_some())
            .collect();
        assert!(both.is_empty(), "both declared and refused: {both:?}");
        for (i, r) in REFUSED.iter().enumerate() {
            assert!(
                names.contains(&r.name),
                "{} is refused but NCCL 2.31.2 does not document it",
                r.name
            );
            assert!(r.why.len() > 10, "{}: say why", r.name);
            assert!(
                !REFUSED[..i].iter().any(|o| o.name == r.name),
                "{} is refused twice",
                r.name
            );
        }
    }

    /// NCCL_GRAPH_REGISTER, NCCL_LOCAL_REGISTER and NCCL_LAUNCH_MODE take
    /// NCCL's values strictly; set to what oxccl does not do (launch
    /// cooperatively), it is named in a WARN once, and defaults say
    /// nothing. NCCL_RUNTIME_CONNECT is named where it asks a
    /// path for what it does not do.
    #[test]
    fn settings_accepted_but_not_acted_on_say_so() {
        let c = Config::load_with(&[
            ("GRAPH_REGISTER", "1"),
            ("LOCAL_REGISTER", "0"),
            ("LAUNCH_MODE", "group"),
        ])
        .unwrap();
        let named: Vec<&str> = c.unhonoured().iter().map(|(n, _)| *n).collect();
        // Registration is built: both registration settings act.
        assert_eq!(named, ["NCCL_LAUNCH_MODE"]);
        assert!(c.graph_register && !c.local_register);
        let (now, lines) = crate::log::capture_lines(|| c.warn_refused());
        assert!(now.contains(&"NCCL_LAUNCH_MODE"), "{now:?}");
        assert!(!now.contains(&"NCCL_GRAPH_REGISTER"), "{now:?}");
        assert!(
            lines.contains("NCCL WARN NCCL_LAUNCH_MODE=group (from api)"),
            "{lines}"
        );
        let quiet = Config::load_with(&[("LAUNCH_MODE", "PARALLEL")]).unwrap();
        assert!(quiet.unhonoured().is_empty());
        for (key, bad) in [
            ("LAUNCH_MODE", "fast"),
            ("GRAPH_REGISTER", "2"),
            ("LOCAL_REGISTER", "on please"),
            ("RUNTIME_CONNECT", "lazy"),
            ("CHECKS_DISABLE", "x"),
            ("COMM_BLOCKING", "-1"),
        ] {
            let e = Config::load_with(&[(key, bad)]).unwrap_err().to_string();
            assert!(e.contains(&format!("NCCL_{key}={bad:?}")), "{e}");
        }
        let lazy = Config::load_with(&[("RUNTIME_CONNECT", "1")]).unwrap();
        assert!(lazy
            .runtime_connect_note(true)
            .unwrap()
            .contains("at creation"));
        assert_eq!(lazy.runtime_connect_note(false), None);
        let eager = Config::load_with(&[("RUNTIME_CONNECT", "0")]).unwrap();
        assert_eq!(eager.runtime_connect_note(true), None);
        assert!(eager
            .runtime_connect_note(false)
            .unwrap()
            .contains("first operation"));
    }

    /// A refused variable set in the environment is found by the load, and
    /// named in one WARN with its reason, once per process.
    #[test]
    fn a_refused_variable_set_is_warned_about_once() {
        // No other test of this crate names this variable; one that loads
        // a Config meanwhile finds it set, which changes nothing there.
        std::env::set_var("NCCL_IB_CUDA_SUPPORT", "1");
        let c = Config::load().unwrap();
        std::env::remove_var("NCCL_IB_CUDA_SUPPORT");
        let found = c
            .refused_set()
            .iter()
            .find(|r| r.def.name == "NCCL_IB_CUDA_SUPPORT")
            .expect("found");
        assert_eq!((&*found.value, &found.source), ("1", &Source::Env));
        let (now, lines) = crate::log::capture_lines(|| c.warn_refused());
        assert!(now.contains(&"NCCL_IB_CUDA_SUPPORT"), "{now:?}");
        assert!(
            lines.contains("NCCL WARN NCCL_IB_CUDA_SUPPORT=1 (from env) is not implemented by oxccl and is ignored: removed from NCCL in 2.4.0; NCCL_NET_GDR_LEVEL replaces it"),
            "{lines}"
        );
        let (again, lines) = crate::log::capture_lines(|| c.warn_refused());
        assert!(!again.contains(&"NCCL_IB_CUDA_SUPPORT"), "warned twice");
        assert!(!lines.contains("NCCL_IB_CUDA_SUPPORT"), "{lines}");
    }

    /// Calls `f` with each Rust and C source under `dir` and its text,
    /// skipping build outputs, git's files, docs and tools/ (scripts).
    fn visit(dir: &Path, f: &mut dyn FnMut(&Path, &str)) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            if p.is_dir() {
                let skip = name.starts_with("target")
                    || name.starts_with('.')
                    || ["docs", "tools", "node_modules"].contains(&&*name);
                if !skip {
                    visit(&p, f);
                }
            } else if p.extension().is_some_and(|x| x == "rs" || x == "c") {
                if let Ok(text) = std::fs::read_to_string(&p) {
                    f(&p, &text);
                }
            }
        }
    }
}
