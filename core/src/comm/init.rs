//! Creating a communicator: a rank joining through one root or several
//! (blocking or not), every rank of a process at once, and the build of
//! the core once the bootstrap is up.

use super::split::FromParent;
use super::*;

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
    pub(super) fn init_rank_hashed(
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
}
