//! Communicators: creation (blocking or not), split, teardown, and the
//! operations of the Rust API.

mod collnet;
mod core;
mod device_watch;
mod elastic;
mod hier;
mod ident;
mod init;
mod kernel_events;
mod network;
mod on_device;
mod split;
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
