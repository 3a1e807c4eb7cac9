//! Communicators: creation (blocking or not), split, teardown, and the
//! operations of the Rust API.

mod collnet;
mod core;
mod device_watch;
mod elastic;
mod hier;
mod ident;
mod kernel_events;
mod network;
mod on_device;
mod topology;
mod tuning;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use oxccl_plugin::{Net, NetError};
use tracing::{info, warn};

use crate::bootstrap::{get_unique_id, Bootstrap, UniqueId};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::plugin::net::Network;

pub(crate) use self::core::Core;
pub use elastic::ShrinkMode;
use network::comm_net;
pub use network::net_summary;

/// NCCL_SPLIT_NOCOLOR: the rank joins no new communicator.
pub const SPLIT_NOCOLOR: i32 = -1;

/// Options of a new communicator (NCCL's `ncclConfig_t`).
#[derive(Debug, Clone)]
pub struct CommConfig {
    /// When false, creation returns at once and [`Comm::async_error`]
    /// reports [`InitState::InProgress`] until it completes.
    pub blocking: bool,
    /// Settings by key (`NCCL_` prefix optional), above the environment.
    pub settings: Vec<(String, String)>,
    /// The GPU this rank runs on: its operations then take device memory
    /// and the caller's CUDA stream. `None`: host memory.
    pub device: Option<usize>,
    /// NCCL's `splitShare`: the splits of this communicator share its
    /// network context instead of making their own. `None` is NCCL's
    /// undefined value (no sharing); `NCCL_COMM_SPLIT_SHARE_RESOURCES`,
    /// where set, overrides either, as in NCCL.
    pub split_share: Option<bool>,
    /// NCCL's `shrinkShare`: as `split_share`, for the communicators
    /// [`Comm::shrink`] makes with [`ShrinkMode::Default`] from a
    /// communicator that is not revoked; `NCCL_COMM_SHRINK_SHARE_RESOURCES`
    /// overrides it.
    pub shrink_share: Option<bool>,
    /// NCCL's `commName`: named in this communicator's log lines and
    /// handed to the profiler plugin's `init`.
    pub name: Option<String>,
    /// NCCL's `trafficClass`: handed to the net plugin with the
    /// communicator's context (net v11+); `None` leaves it to the plugin.
    pub traffic_class: Option<i32>,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            blocking: true,
            settings: Vec::new(),
            device: None,
            split_share: None,
            shrink_share: None,
            name: None,
            traffic_class: None,
        }
    }
}

impl CommConfig {
    /// A configuration with one more setting.
    pub fn with(mut self, key: &str, value: &str) -> CommConfig {
        self.settings.push((key.to_string(), value.to_string()));
        self
    }

    fn resolve(&self) -> Result<Config> {
        let pairs: Vec<(&str, &str)> = self
            .settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Config::load_with(&pairs)
    }

    /// Whether the splits of a communicator made with this configuration
    /// share its network context. NCCL's `envConfigOverride` lets the
    /// variable replace the config's `splitShare`, and an unset one is 0.
    fn shares_with_splits(&self, cfg: &Config) -> bool {
        shares(
            cfg.comm_split_share_resources,
            self.split_share,
            "split_share",
            "NCCL_COMM_SPLIT_SHARE_RESOURCES",
        )
    }

    /// As [`CommConfig::shares_with_splits`], for shrinks.
    fn shares_with_shrinks(&self, cfg: &Config) -> bool {
        shares(
            cfg.comm_shrink_share_resources,
            self.shrink_share,
            "shrink_share",
            "NCCL_COMM_SHRINK_SHARE_RESOURCES",
        )
    }
}

/// The variable where set (logged when it overrides the config), else the
/// config's choice, else no sharing.
fn shares(var: Option<bool>, asked: Option<bool>, field: &str, name: &str) -> bool {
    match (var, asked) {
        (Some(var), Some(asked)) if var != asked => {
            info!(target: "oxccl::env", "config {field}={asked} reset to {name}={}", u8::from(var));
            var
        }
        (Some(var), _) => var,
        (None, asked) => asked.unwrap_or(false),
    }
}

/// What a split takes from a parent that shares its resources with its
/// splits (NCCL's `ncclNetInitFromParent`).
struct FromParent {
    /// The parent's network with its context.
    net: Arc<dyn Net>,
    /// The parent's NCCL_NET, which the split's must not contradict.
    net_setting: Option<String>,
}

/// A communicator made from another one (split, shrink).
struct Child<'a> {
    /// Ranks of the parent, in their order in the child.
    members: &'a [usize],
    /// The parent's count of splits and shrinks before this one.
    split_no: u64,
    hash: u64,
    /// The child takes the parent's network context.
    share: bool,
    /// The id travels while failure notices of other ranks stand (shrink).
    despite_failures: bool,
}

/// `config` for a communicator made from `core`'s (split, shrink, grow):
/// on the same GPU unless it names one, and with the parent's resolved
/// settings below its own.
fn child_config(core: &Core, config: &CommConfig) -> CommConfig {
    let mut cfg = config.clone();
    if cfg.device.is_none() {
        cfg.device = core.device.as_ref().and_then(|d| d.ordinal());
    }
    let parent: Vec<(String, String)> = core
        .cfg
        .entries()
        // OXCCL_ settings come from the environment alone, read again.
        .filter(|e| e.def.read == crate::config::Read::Config)
        .filter(|e| e.source != crate::config::Source::Default)
        .map(|e| (e.def.key.to_string(), e.value.clone()))
        .collect();
    cfg.settings = parent.into_iter().chain(cfg.settings).collect();
    cfg
}

fn bytes_to_id(bytes: &[u8]) -> Result<UniqueId> {
    let mut id = UniqueId([0; 128]);
    if bytes.len() != id.0.len() {
        return Err(Error::Internal(format!(
            "received a {}-byte unique id for a new communicator",
            bytes.len()
        )));
    }
    id.0.copy_from_slice(bytes);
    Ok(id)
}

/// Memory a communicator holds (NCCL's `ncclCommMemStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemStats {
    /// GPU memory allocated for this communicator: the device path's
    /// window, the shared-GPU path's flag words, and with GPUDirect the
    /// net peers' step slots. Counts what a suspend released, as NCCL's
    /// `ncclStatGpuMemTotal` does. 0 on host memory; the pinned host
    /// areas of peers reached through shared memory or the network are
    /// not counted.
    pub device_bytes: u64,
    /// The part of `device_bytes` a suspend releases (NCCL's
    /// `ncclStatGpuMemSuspend`, the same before and after the suspend):
    /// the window and the flag words. The rest (GPUDirect slots, as
    /// NCCL's net transport buffers) is kept.
    pub suspendable_bytes: u64,
    /// GPU memory held now: `device_bytes`, less `suspendable_bytes`
    /// while suspended (oxccl's own figure; NCCL has no stat for it).
    pub held_bytes: u64,
    /// Whether the communicator is suspended ([`Comm::suspend`]).
    pub suspended: bool,
}

/// Where a communicator's asynchronous work stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitState {
    Ready,
    InProgress,
}

/// What revoked a communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RevokedBy {
    /// The application (`ncclCommRevoke`): finalize is refused, as NCCL says.
    Call,
    /// A shrink that left it failed: its operations all ended (in errors)
    /// and its lost ranks cannot meet, so a finalize has nothing to flush
    /// and no one to synchronise with (PyTorch finalizes it when
    /// shrink_group drops the old group).
    Shrink,
}

enum Status {
    Initializing,
    Ready(Arc<Core>),
    /// Creation failed (no core), or an operation did: operations are
    /// refused with the error, and the core stays for revoke, shrink and
    /// destroy.
    Failed(Error, Option<Arc<Core>>),
    /// Revoked (NCCL's `ncclCommRevoke`): operations are refused; destroy,
    /// split and shrink work.
    Revoked(Arc<Core>, RevokedBy),
    Destroyed(&'static str),
}

struct Shared {
    rank: usize,
    nranks: usize,
    /// The config's `blocking`: whether revoke waits for the operations it
    /// ends.
    blocking: bool,
    status: Mutex<Status>,
    ready: Condvar,
    /// The communicators collectives run on in steps where ranks of
    /// several processes share a GPU in a job of several GPUs (see `hier`).
    hier: Mutex<hier::State>,
    /// The CollNet path of all-reduces on host memory (see `collnet`).
    collnet: Mutex<Option<Arc<collnet::CollPath>>>,
    /// What RAS reports of this rank (`None`: NCCL_RAS_ENABLE=0).
    ras: Option<Arc<crate::ras::CommRecord>>,
}

/// A communicator: one rank's membership in a group of ranks. Cloning
/// gives another handle to the same communicator.
#[derive(Clone)]
pub struct Comm {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Comm(rank {} of {})",
            self.shared.rank, self.shared.nranks
        )
    }
}

/// Work of a floor above the communicator (memory windows) when it ends,
/// registered with `inventory` so that this module does not import that
/// floor: the function gets the communicator and whether it was aborted.
pub(crate) struct AtEnd(pub fn(&Comm, bool));

oxccl_plugin::inventory::collect!(AtEnd);

impl Comm {
    /// Creates a unique id for a new communicator and starts its root here
    /// (NCCL's `ncclGetUniqueId`).
    pub fn unique_id() -> Result<UniqueId> {
        get_unique_id(&Config::load()?)
    }

    /// Joins the communicator `id` as `rank` of `nranks` (NCCL's
    /// `ncclCommInitRankConfig`).
    pub fn init_rank(
        nranks: usize,
        id: UniqueId,
        rank: usize,
        config: &CommConfig,
    ) -> Result<Comm> {
        Comm::init_rank_hashed(nranks, vec![id], rank, config, ident::comm_hash(&id), None)
    }

    /// Joins through the roots of several ids (NCCL's
    /// `ncclCommInitRankScalable`; every rank passes the same ids in the
    /// same order): the ranks are spread over the roots, each rank says
    /// hello to its own, and the communicator is the one a single root
    /// would have made. Its hash is the first id's, as NCCL's.
    pub fn init_rank_scalable(
        nranks: usize,
        ids: &[UniqueId],
        rank: usize,
        config: &CommConfig,
    ) -> Result<Comm> {
        let Some(first) = ids.first() else {
            return Err(Error::InvalidArgument(
                "nId is 0: at least one unique id is needed".into(),
            ));
        };
        if ids.len() > nranks {
            return Err(Error::InvalidArgument(format!(
                "nId is {}, more unique ids than the {nranks} ranks (at most one root per rank)",
                ids.len()
            )));
        }
        let hash = ident::comm_hash(first);
        Comm::init_rank_hashed(nranks, ids.to_vec(), rank, config, hash, None)
    }

    /// As [`Comm::init_rank`], with the communicator's hash given (a split
    /// derives it from its parent's, as NCCL does), and the parent's network
    /// (with its context) for a split that shares it.
    fn init_rank_hashed(
        nranks: usize,
        ids: Vec<UniqueId>,
        rank: usize,
        config: &CommConfig,
        comm_hash: u64,
        parent: Option<FromParent>,
    ) -> Result<Comm> {
        if nranks == 0 {
            return Err(Error::InvalidArgument(
                "nranks is 0: a communicator needs at least one rank".into(),
            ));
        }
        if rank >= nranks {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is out of range: nranks is {nranks}"
            )));
        }
        let cfg = config.resolve()?;
        cfg.warn_refused();
        let split_share = config.shares_with_splits(&cfg);
        let shrink_share = config.shares_with_shrinks(&cfg);
        let shared = Arc::new(Shared {
            rank,
            nranks,
            blocking: config.blocking,
            status: Mutex::new(Status::Initializing),
            ready: Condvar::new(),
            hier: hier::new_state(),
            collnet: collnet::new_state(),
            ras: crate::ras::CommRecord::new(
                cfg.ras_enable,
                comm_hash,
                rank,
                nranks,
                config.device,
            ),
        });
        let comm = Comm {
            shared: shared.clone(),
        };
        let asked = config.clone();
        let work = move || {
            let ras = shared.ras.clone();
            let r = Comm::build(
                nranks,
                &ids,
                rank,
                cfg,
                &asked,
                comm_hash,
                parent,
                ras.as_ref(),
            )
            .and_then(|mut core| {
                core.split_share = split_share;
                core.shrink_share = shrink_share;
                core.ras = ras.clone();
                let core = Arc::new(core);
                core.start_watch()?;
                // Before anyone can use it, so that every rank's first
                // operation already agrees on the layout's splits.
                let split = hier::made(&core, rank)?;
                *shared.hier.lock().unwrap_or_else(|p| p.into_inner()) = split;
                let cn = collnet::made(&core, rank)?;
                *shared.collnet.lock().unwrap_or_else(|p| p.into_inner()) = cn;
                Ok(core)
            });
            if let Some(rec) = &shared.ras {
                match &r {
                    Ok(_) => rec.set_state(crate::ras::State::Running),
                    Err(e) => rec.set_error(&e.to_string()),
                }
            }
            let mut st = shared.status.lock().unwrap_or_else(|p| p.into_inner());
            if let Status::Initializing = *st {
                *st = match r {
                    Ok(core) => Status::Ready(core),
                    Err(e) => Status::Failed(e, None),
                };
            }
            shared.ready.notify_all();
        };
        if config.blocking {
            work();
            comm.core().map(|_| comm)
        } else {
            std::thread::Builder::new()
                .name(format!("oxccl-init-{rank}"))
                .spawn(work)
                .map_err(|e| Error::System(format!("cannot start the init thread: {e}")))?;
            Ok(comm)
        }
    }

    #[allow(clippy::too_many_arguments)] // one rank's whole creation
    fn build(
        nranks: usize,
        ids: &[UniqueId],
        rank: usize,
        cfg: Config,
        asked: &CommConfig,
        comm_hash: u64,
        parent: Option<FromParent>,
        ras: Option<&Arc<crate::ras::CommRecord>>,
    ) -> Result<Core> {
        let (device, name) = (asked.device, &asked.name);
        if let Some(line) = cfg.runtime_connect_note(device.is_some()) {
            crate::config::warn_once("NCCL_RUNTIME_CONNECT", &line);
        }
        // The network is the process's; its context (v11+) is this
        // communicator's, made with the commHash every rank of it shares,
        // or the parent's for a split that shares it (NCCL's
        // ncclNetInitFromParent), finalized once both are gone.
        let (net, net_how) = match parent {
            Some(p) => {
                let parents = p.net_setting.as_deref().unwrap_or(p.net.name());
                if let Some(want) = cfg.net.as_deref() {
                    if !want.eq_ignore_ascii_case(parents) {
                        return Err(Error::InvalidUsage(format!(
                            "NCCL_NET={want:?} for a split that shares its parent's network context, whose network is {parents:?} (the parent was made with split_share or NCCL_COMM_SPLIT_SHARE_RESOURCES=1): leave NET unset in the split's config, or make the parent without split_share"
                        )));
                    }
                }
                (p.net, "shared with its parent communicator".to_string())
            }
            None => comm_net(&cfg, comm_hash, asked.traffic_class)?,
        };
        let bootstrap = Bootstrap::init_scalable(ids, rank, nranks, &cfg)?;
        // This process's RAS service, on the bootstrap's interface.
        let ras_id = ras
            .and_then(|_| crate::ras::service::start(&cfg, bootstrap.listen_addr().ip()))
            .map_or(String::new(), |id| id.to_string());
        let mut cfg = cfg;
        let (terms, threads) = crate::exec::host_direct::Terms::from_env(nranks)?;
        let peers = ident::exchange(
            &bootstrap,
            ident::Facts {
                host: ident::host_hash(&cfg),
                p2p_disable: cfg.p2p_disable,
                shm_disable: cfg.shm_disable,
                device,
                shm_dev: ident::shm_dev(),
                net_link: core::net_link(net.as_ref()),
                // The tuner as the core will load it: NCCL_TUNER_PLUGIN, a
                // default name or the net plugin's library.
                tuned: crate::plugin::tuner::shared(cfg.tuner_plugin.as_deref())?.is_some(),
                algo: ident::algo_code(&cfg),
                shaping: ident::shaping(&cfg),
                direct: terms.encode(),
                net: net.name().to_string(),
                net_how,
                ras: ras_id,
            },
        )?;
        if let Some(rec) = ras {
            rec.set_map(crate::ras::map_of(&peers.ras, &peers.devices));
        }
        let mut differ = ident::adopt_shaping(&mut cfg, peers.shaping, peers.algo);
        let first = crate::exec::host_direct::Terms::decode(&peers.direct)
            .ok_or_else(|| Error::Remote("rank 0 sent malformed direct-path terms".into()))?;
        if device.is_none() {
            differ.extend(terms.differences(&first));
        }
        if !differ.is_empty() {
            warn!(target: "oxccl::init",
                "Settings that must be the same on every rank differ here; this rank takes rank 0's: {}", differ.join("; "));
        }
        let nnodes = peers.nnodes;
        let locality = crate::transport::Locality {
            rank,
            hosts: peers.hosts.clone(),
            shm_devs: peers.shm_devs.clone(),
            shm_disabled: peers.shm_disabled.clone(),
            devices: peers.devices.clone(),
        };
        let dc = match device {
            Some(d) => Some(on_device::open(
                &bootstrap, &peers, d, &cfg, &net, &locality,
            )?),
            None => None,
        };
        if let Some(d) = device {
            crate::log::set_device(d);
        }
        // NCCL's closing line of a communicator's creation, which scripts
        // wait for, with where oxccl runs it.
        let on = device.map_or("host memory".to_string(), |d| format!("GPU {d}"));
        let named = name
            .as_deref()
            .map_or(String::new(), |n| format!(" commName {n}"));
        info!(target: "oxccl::init",
            "ncclCommInitRank comm {comm_hash:#018x}{named} rank {rank} nranks {nranks} cudaDev {} nNodes {nnodes} - Init COMPLETE (on {on}, network {})",
            device.map_or(-1, |d| d as i64), net.name());
        let direct = match device {
            None => core::setup_direct(&bootstrap, &locality, first, threads)?,
            Some(_) => None,
        };
        Core::new(
            cfg,
            bootstrap,
            net,
            dc,
            core::Agreed {
                ident: core::Ident { comm_hash, nnodes },
                inter: peers.net_link,
                tuned: peers.tuned,
                name: name.clone(),
            },
            locality,
            direct,
        )
    }

    /// Creates `n` communicators of one process, one per rank, each
    /// initialised on its own thread (NCCL's `ncclCommInitAll`).
    pub fn init_all(n: usize, config: &CommConfig) -> Result<Vec<Comm>> {
        Comm::init_all_on(n, None, config)
    }

    /// As [`Comm::init_all`], rank `i` on GPU `devices[i]` (NCCL's
    /// `ncclCommInitAll` with a device list).
    pub fn init_all_devices(devices: &[usize], config: &CommConfig) -> Result<Vec<Comm>> {
        Comm::init_all_on(devices.len(), Some(devices), config)
    }

    fn init_all_on(n: usize, devices: Option<&[usize]>, config: &CommConfig) -> Result<Vec<Comm>> {
        if n == 0 {
            return Err(Error::InvalidArgument("ndev is 0".into()));
        }
        let id = get_unique_id(&config.resolve()?)?;
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let c = config.clone();
                let device = devices.map(|d| d[r]).or(c.device);
                std::thread::spawn(move || {
                    Comm::init_rank(
                        n,
                        id,
                        r,
                        &CommConfig {
                            blocking: true,
                            device,
                            ..c
                        },
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| Error::Internal("an init thread panicked".into()))?
            })
            .collect()
    }

    /// The ready core, or why there is none.
    pub(crate) fn core(&self) -> Result<Arc<Core>> {
        match &*self.shared.status.lock().unwrap_or_else(|p| p.into_inner()) {
            Status::Ready(c) => Ok(c.clone()),
            Status::Initializing => Err(Error::InvalidUsage(
                "the communicator is still initializing (non-blocking init): poll async_error() until it is ready".into(),
            )),
            Status::Failed(e, _) => Err(e.clone()),
            Status::Revoked(..) => Err(Error::InvalidUsage(
                "the communicator was revoked (ncclCommRevoke): only destroy, split and shrink are allowed on it".into(),
            )),
            Status::Destroyed(how) => Err(Error::InvalidUsage(format!("the communicator was {how}: create a new one"))),
        }
    }

    /// The core of a communicator that has one: ready, failed after
    /// creation, or revoked (for what asks about it rather than runs on it).
    fn any_core(&self) -> Result<Arc<Core>> {
        match &*self.shared.status.lock().unwrap_or_else(|p| p.into_inner()) {
            Status::Failed(_, Some(c)) | Status::Revoked(c, _) => return Ok(c.clone()),
            _ => {}
        }
        self.core()
    }

    /// Whether the communicator was created blocking (its config's
    /// `blocking`): a revoke then waits for the operations it ends.
    pub fn blocking(&self) -> bool {
        self.shared.blocking
    }

    /// Waits until a non-blocking creation finishes.
    pub fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
        let (st, _) = self
            .shared
            .ready
            .wait_timeout_while(st, timeout, |s| matches!(s, Status::Initializing))
            .unwrap_or_else(|p| p.into_inner());
        drop(st);
        self.core().map(|_| ())
    }

    /// NCCL's `ncclCommGetAsyncError`: in progress, ready, or the error
    /// that ended the communicator.
    pub fn async_error(&self) -> Result<InitState> {
        match &*self.shared.status.lock().unwrap_or_else(|p| p.into_inner()) {
            Status::Initializing => Ok(InitState::InProgress),
            Status::Ready(c) => match c.async_failure() {
                Some(e) => Err(e),
                None => Ok(InitState::Ready),
            },
            Status::Failed(e, _) => Err(e.clone()),
            Status::Revoked(c, _) => Ok(if c.quiescent() {
                c.settle_revoke();
                InitState::Ready
            } else {
                InitState::InProgress
            }),
            Status::Destroyed(how) => {
                Err(Error::InvalidUsage(format!("the communicator was {how}")))
            }
        }
    }

    /// The network this communicator's connections go through.
    pub fn net_name(&self) -> Result<String> {
        Ok(self.any_core()?.net.name().to_string())
    }

    /// How this rank reaches `peer`: shared memory for a peer on this host
    /// (unless either rank set NCCL_SHM_DISABLE), else the network.
    pub fn transport(&self, peer: usize) -> Result<crate::transport::Transport> {
        if peer >= self.count() {
            return Err(Error::InvalidArgument(format!(
                "peer {peer} is out of range: nranks is {}",
                self.count()
            )));
        }
        Ok(self.any_core()?.transport(peer))
    }

    /// Whether this communicator's splits share its network context (its
    /// config's `split_share`, or `NCCL_COMM_SPLIT_SHARE_RESOURCES`).
    pub fn split_share(&self) -> Result<bool> {
        Ok(self.any_core()?.split_share)
    }

    /// Whether this communicator's shrinks share its network context (its
    /// config's `shrink_share`, or `NCCL_COMM_SHRINK_SHARE_RESOURCES`).
    pub fn shrink_share(&self) -> Result<bool> {
        Ok(self.any_core()?.shrink_share)
    }

    /// NCCL's `commHash` of this communicator: the same on every rank,
    /// different between communicators.
    pub fn comm_hash(&self) -> Result<u64> {
        Ok(self.any_core()?.ident.comm_hash)
    }

    /// The CTA (channel) bounds its collectives run within: minCTAs and
    /// maxCTAs (NCCL_MIN_CTAS, NCCL_MAX_CTAS and the older
    /// NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS), as the device path holds them.
    pub fn cta_bounds(&self) -> Result<(usize, usize)> {
        Ok(crate::exec::device::config::cta_bounds(
            &self.any_core()?.cfg,
        ))
    }

    /// The GPU this communicator runs on (`None`: host memory).
    pub fn device(&self) -> Result<Option<usize>> {
        Ok(self.any_core()?.device.as_ref().and_then(|d| d.ordinal()))
    }

    /// Registers `len` bytes of device memory at `ptr` with this rank
    /// (NCCL's `ncclCommRegister`), so that peers read it where it lies
    /// (see [`crate::exec::device::DeviceComm::register`]); the handle for
    /// [`Comm::deregister_buffer`]. `None` where NCCL_LOCAL_REGISTER=0
    /// turns registration off, as NCCL hands back NULL then. Refused for
    /// host memory, memory of another GPU, and on a communicator of host
    /// memory.
    pub fn register_buffer(&self, ptr: u64, len: usize) -> Result<Option<u64>> {
        let core = self.any_core()?;
        if !core.cfg.local_register {
            tracing::info!(target: "oxccl::reg", "rank {}: NCCL_LOCAL_REGISTER=0: {len} bytes at {ptr:#x} not registered; operations on it take the step slots", self.shared.rank);
            return Ok(None);
        }
        match &core.device {
            Some(gpu) => on_device::lock(gpu)?.register(ptr, len).map(Some),
            None => Err(Error::InvalidUsage(format!(
                "ncclCommRegister({ptr:#x}, {len} bytes): this communicator moves host memory (it has no GPU), where there is nothing to register: register device buffers with a communicator on a GPU"
            ))),
        }
    }

    /// Releases a registration of [`Comm::register_buffer`] (NCCL's
    /// `ncclCommDeregister`); refused for a handle it did not give.
    pub fn deregister_buffer(&self, handle: u64) -> Result<()> {
        let core = self.any_core()?;
        match &core.device {
            Some(gpu) => on_device::lock(gpu)?.deregister(handle),
            None => Err(Error::InvalidArgument(format!(
                "ncclCommDeregister: handle {handle:#x} is no registration of this communicator (it moves host memory and registers nothing)"
            ))),
        }
    }

    /// What the communicator allocated and holds (see [`MemStats`]).
    pub fn mem_stats(&self) -> Result<MemStats> {
        let core = self.any_core()?;
        let (device_bytes, suspendable_bytes, released) = match &core.device {
            Some(self::on_device::GpuPath(dc, _)) => {
                let dc = dc.lock().map_err(|_| {
                    Error::Internal("device executor poisoned by an earlier panic".into())
                })?;
                let (all, part) = (dc.device_bytes() as u64, dc.suspendable_bytes() as u64);
                (all, part, if dc.suspended() { part } else { 0 })
            }
            None => (0, 0, 0),
        };
        Ok(MemStats {
            device_bytes,
            suspendable_bytes,
            held_bytes: device_bytes - released,
            suspended: core.suspended.load(std::sync::atomic::Ordering::SeqCst),
        })
    }

    pub fn count(&self) -> usize {
        self.shared.nranks
    }

    pub fn user_rank(&self) -> usize {
        self.shared.rank
    }

    /// Which ranks took down an operation here, and at which operation
    /// (see [`crate::Failure`]): the exclude list for [`Comm::shrink`],
    /// the same on every survivor. `None` while no operation has failed
    /// because of a peer (or once destroyed); kept through a revoke.
    pub fn failure(&self) -> Option<crate::Failure> {
        self.any_core().ok()?.failure()
    }

    /// Marks the communicator failed after an operation error, so that
    /// `async_error` reports it.
    pub(crate) fn record_failure(&self, e: &Error) {
        if matches!(e, Error::Remote(_) | Error::System(_)) {
            if let Some(rec) = &self.shared.ras {
                rec.set_error(&e.to_string());
            }
            let mut st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
            if let Status::Ready(c) = &*st {
                *st = Status::Failed(e.clone(), Some(c.clone()));
            }
        }
    }

    /// Splits into new communicators by color, ranked by key then by rank
    /// here (NCCL's `ncclCommSplit`). Every rank must call it;
    /// [`SPLIT_NOCOLOR`] gives `None`. When this communicator was made with
    /// `split_share` (see [`Comm::split_share`]), the new one uses its
    /// network context (not after a revoke, as in NCCL); `config.split_share`
    /// is the new one's, for its own splits. Works on a revoked
    /// communicator (once its operations have ended).
    pub fn split(&self, color: i32, key: i32, config: &CommConfig) -> Result<Option<Comm>> {
        if color < SPLIT_NOCOLOR {
            return Err(Error::InvalidArgument(format!(
                "color {color} is negative and not NCCL_SPLIT_NOCOLOR (-1)"
            )));
        }
        let (core, revoked) = self.core_for_split()?;
        Comm::split_core(&core, self.user_rank(), revoked, color, key, config)
    }

    /// [`Comm::split`] on `core`, whose rank `me` is: also before the
    /// communicator is ready (its own hidden splits, see `hier`).
    pub(super) fn split_core(
        core: &Arc<Core>,
        me: usize,
        revoked: bool,
        color: i32,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Comm>> {
        let mut mine = Vec::with_capacity(8);
        mine.extend_from_slice(&color.to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let all = core.bootstrap.allgather(&mine)?;
        let split_no = core.next_split();
        if color == SPLIT_NOCOLOR {
            return Ok(None);
        }
        let mut members: Vec<(i32, usize)> = all
            .iter()
            .enumerate()
            .filter_map(|(r, b)| {
                let c = i32::from_le_bytes(b.get(0..4)?.try_into().ok()?);
                let k = i32::from_le_bytes(b.get(4..8)?.try_into().ok()?);
                (c == color).then_some((k, r))
            })
            .collect();
        members.sort_unstable();
        let members: Vec<usize> = members.into_iter().map(|(_, r)| r).collect();
        // As NCCL's shareResources, the parent's setting decides.
        let share = core.split_share && !revoked;
        let child = Child {
            members: &members,
            split_no,
            hash: ident::split_hash(core.ident.comm_hash, split_no, color),
            share,
            despite_failures: false,
        };
        Comm::make_child(core, me, child, config).map(Some)
    }

    /// The core a split works on: a ready communicator's, or a revoked
    /// one's once its operations have ended (with `true`).
    fn core_for_split(&self) -> Result<(Arc<Core>, bool)> {
        let st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
        if let Status::Revoked(c, _) = &*st {
            let c = c.clone();
            drop(st);
            c.wait_revoked()?;
            return Ok((c, true));
        }
        drop(st);
        Ok((self.core()?, false))
    }

    /// Creates this rank's communicator among `child.members` (ranks of
    /// this one, in their new order): the first of them starts a root in
    /// its process and sends its id to the others through this
    /// communicator's bootstrap, so nothing goes through a rank outside
    /// the members. The child inherits this communicator's resolved
    /// settings below `config`'s, and its GPU.
    fn make_child(
        core: &Arc<Core>,
        me: usize,
        child: Child<'_>,
        config: &CommConfig,
    ) -> Result<Comm> {
        let members = child.members;
        let new_rank = members
            .iter()
            .position(|&r| r == me)
            .ok_or_else(|| Error::Internal("a rank is not among its own child's members".into()))?;
        let tag = crate::transport::TAG_CONN * 2 + child.split_no;
        let id = if new_rank == 0 {
            // A root of its own in this process: an id from NCCL_COMM_ID would
            // send every color to the same address.
            let id = crate::bootstrap::start_root(&core.cfg)?;
            for &r in &members[1..] {
                core.bootstrap.send(r, tag, &id.0)?;
            }
            id
        } else if child.despite_failures {
            bytes_to_id(&core.bootstrap.recv_despite_failures(members[0], tag)?)?
        } else {
            bytes_to_id(&core.bootstrap.recv(members[0], tag)?)?
        };
        let cfg = child_config(core, config);
        let parent = child.share.then(|| FromParent {
            net: core.net.clone(),
            net_setting: core.cfg.net.clone(),
        });
        Comm::init_rank_hashed(members.len(), vec![id], new_rank, &cfg, child.hash, parent)
    }

    /// Waits for this rank's outstanding work and synchronises with the
    /// other ranks (NCCL's `ncclCommFinalize`); then `destroy` frees.
    pub fn finalize(&self) -> Result<()> {
        match &*self.shared.status.lock().unwrap_or_else(|p| p.into_inner()) {
            Status::Revoked(_, RevokedBy::Shrink) => {
                info!(target: "oxccl::init", "rank {}: finalize of a failed communicator that a shrink replaced: nothing outstanding", self.user_rank());
                return Ok(());
            }
            Status::Revoked(_, RevokedBy::Call) => {
                return Err(Error::InvalidUsage(
                    "finalize after revoke: NCCL defines no finalize for a revoked communicator (its operations were cut short); destroy it".into(),
                ))
            }
            _ => {}
        }
        let core = self.core()?;
        if let Some(rec) = &self.shared.ras {
            rec.set_state(crate::ras::State::Finalize);
        }
        core.bootstrap.barrier()
    }

    /// Frees the communicator's resources (NCCL's `ncclCommDestroy`).
    pub fn destroy(&self) -> Result<()> {
        self.end("destroyed")
    }

    /// Stops everything at once, even while another thread is inside an
    /// operation, which then fails (NCCL's `ncclCommAbort`). Always returns.
    pub fn abort(&self) {
        let _ = self.end("aborted");
    }

    fn end(&self, how: &'static str) -> Result<()> {
        for hook in oxccl_plugin::inventory::iter::<AtEnd> {
            (hook.0)(self, how == "aborted");
        }
        let old = {
            let mut st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
            if let Status::Destroyed(was) = *st {
                return Err(Error::InvalidUsage(format!(
                    "the communicator was already {was}"
                )));
            }
            std::mem::replace(&mut *st, Status::Destroyed(how))
        };
        if let Some(rec) = &self.shared.ras {
            if how == "aborted" {
                rec.set_state(crate::ras::State::Abort);
            }
            rec.retire();
        }
        self.let_hier_go(how == "aborted", false);
        self.let_collnet_go(how == "aborted");
        if let Status::Ready(core) | Status::Failed(_, Some(core)) | Status::Revoked(core, _) = old
        {
            let aborted = how == "aborted";
            if aborted {
                core.stop.set(crate::exec::StopReason::Aborted);
                core.stop_device();
                // Releases the stream waits too where no call holds the
                // device executor now (best effort: abort never waits).
                let _ = core.quiescent();
            }
            core.bootstrap.close();
            if aborted && core.device.is_some() {
                // Abort must return even while a kernel of this
                // communicator waits for a peer that never comes (PyTorch's
                // watchdog aborts exactly then): freeing its device memory
                // would wait for that kernel (cuMemFree synchronizes), which
                // spins until NCCL_TIMEOUT. So an aborted GPU communicator
                // keeps its memory, streams and threads until the process
                // ends.
                std::mem::forget(core);
            }
        }
        Ok(())
    }
}

/// Refuses a buffer that cannot hold the bytes its call claims, as far as
/// [`crate::exec::extent`] can tell (host memory: mapped at all; device
/// memory: in CUDA's allocations), naming the count.
pub(crate) fn check_extent(
    op: &Op,
    what: &str,
    ptr: u64,
    bytes: usize,
    device: bool,
) -> Result<()> {
    use crate::exec::extent;
    let (count, dtype) = (op.count, op.dtype.name());
    let said = if device {
        extent::device(ptr, bytes).map_err(|end| {
            format!(
                "count {count} of {dtype} needs {bytes} bytes of {what} from {ptr:#x} on, but the device allocations there end at {end:#x}, {} bytes in",
                end.saturating_sub(ptr)
            )
        })
    } else {
        extent::host(ptr, bytes).map_err(|have| {
            format!(
                "count {count} of {dtype} needs {bytes} bytes of {what} from {ptr:#x} on, but only about the first {have} are mapped in this process"
            )
        })
    };
    said.map_err(|m| {
        Error::InvalidArgument(format!(
            "{}: {m}: the count is larger than the buffer",
            op.kind.name()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CommConfig {
        CommConfig::default()
            .with("SOCKET_IFNAME", "lo")
            .with("TIMEOUT", "30")
    }

    fn ident(c: &Comm) -> self::core::Ident {
        c.core().unwrap().ident
    }

    /// What plugins are told at init: one node here, one hash shared by
    /// the ranks of a communicator, another for each split.
    #[test]
    fn ranks_agree_on_the_hash_and_count_one_node() {
        let comms = Comm::init_all(3, &cfg()).unwrap();
        let ids: Vec<_> = comms.iter().map(ident).collect();
        assert!(ids.iter().all(|i| i.nnodes == 1), "{ids:?}");
        assert!(
            ids.iter().all(|i| i.comm_hash == ids[0].comm_hash),
            "{ids:?}"
        );

        let other = Comm::init_all(3, &cfg()).unwrap();
        assert_ne!(ident(&other[0]).comm_hash, ids[0].comm_hash);

        // Colors 0 (ranks 0, 2) and 1 (rank 1), split on three threads.
        let splits: Vec<Comm> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .enumerate()
                .map(|(r, c)| s.spawn(move || c.split((r % 2) as i32, 0, &cfg()).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        let h: Vec<u64> = splits.iter().map(|c| ident(c).comm_hash).collect();
        assert_eq!(h[0], h[2]);
        assert_ne!(h[0], h[1]);
        assert!(h.iter().all(|x| *x != ids[0].comm_hash), "{h:?}");
        assert!(splits.iter().all(|c| ident(c).nnodes == 1));
        for c in splits.iter().chain(&comms).chain(&other) {
            c.destroy().unwrap();
        }
    }

    /// NCCL_COMM_SPLIT_SHARE_RESOURCES, where set, replaces the config's
    /// split_share (NCCL's envConfigOverride); unset, the config's counts,
    /// and neither means no sharing. ("" through the API stands for unset,
    /// whatever the environment of the test says.)
    #[test]
    fn split_share_variable_replaces_the_config() {
        let shares = |var: &str, asked: Option<bool>| {
            let cc = CommConfig {
                split_share: asked,
                ..CommConfig::default()
            }
            .with("COMM_SPLIT_SHARE_RESOURCES", var);
            cc.shares_with_splits(&cc.resolve().unwrap())
        };
        assert!(!shares("", None));
        assert!(shares("", Some(true)));
        assert!(!shares("", Some(false)));
        assert!(!shares("0", Some(true)));
        assert!(shares("1", Some(false)));
        assert!(shares("1", None));
        let e = CommConfig::default()
            .with("COMM_SPLIT_SHARE_RESOURCES", "2")
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("NCCL_COMM_SPLIT_SHARE_RESOURCES"), "{e}");
    }

    /// Ranks that say they are on different hosts count as nodes.
    #[test]
    fn hostid_makes_nodes() {
        let ids: Vec<_> = std::thread::scope(|s| {
            let id = get_unique_id(&cfg().resolve().unwrap()).unwrap();
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    s.spawn(move || {
                        let host = if r == 2 { "b" } else { "a" };
                        let c = Comm::init_rank(3, id, r, &cfg().with("HOSTID", host)).unwrap();
                        let i = ident(&c);
                        c.destroy().unwrap();
                        i
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|i| i.nnodes == 2), "{ids:?}");
    }
}
