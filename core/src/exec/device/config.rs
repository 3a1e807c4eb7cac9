//! Settings of the device data path.
//!
//! The CTAs (thread blocks, channels) a collective takes are SMs that the
//! application's kernels lose while they overlap, so a communicator holds
//! as many as NCCL would and no more: on P2P the count comes from the link
//! between the ranks' GPUs, calibrated so that a pair of H200 on NV18 gets
//! NCCL 2.28.9's 24 (`crate::topo::channels`); through host memory (shared
//! memory or the network) NCCL's 2. The communicator's bounds (NCCL's
//! minCTAs and maxCTAs, NCCL_MIN_CTAS and NCCL_MAX_CTAS, and the older
//! NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS) hold on every path, and every
//! rank takes the smallest count any rank proposes, since the window layout
//! must match. Slot sizes are what measured fastest on two H200 over
//! NVLink: 256 KiB slots beat 128 KiB and matched 512 KiB; a channel per 32
//! KiB and slices of at least 64 KiB kept 64 KiB..4 MiB at their best.
//! Blocks have 1024 threads, twice NCCL's 512: the SM is the budget, not its
//! threads, and at NCCL's 24 CTAs a block of 512 could not keep enough loads
//! in flight (all_reduce of 1 GiB by the ring kernels on one H200: 282 GB/s
//! busbw at 512 threads, 333 at 1024; an unroll of 8 at 512, limited to 64
//! registers a thread, spilled and gave 241). Each
//! can be overridden from the environment (`OXCCL_DEV_*`) for tuning;
//! `OXCCL_DEV_CHANNELS=N` fixes the count (still within maxCTAs).

use std::time::Duration;

use crate::config::{ox, AutoOr};
use crate::error::{Error, Result};
pub use crate::topo::channels::MAX_CHANNELS;

/// Threads per block of the collective kernels: as many as a block of
/// `oxccl_coll` (`__launch_bounds__(1024, 1)`) may have. One block per SM
/// either way; more threads keep more of a channel's loads in flight.
pub const DEFAULT_THREADS: u32 = 1024;

/// CTAs of a P2P communicator whose GPUs' link is not known (ranks
/// sharing one GPU, no sysfs): NCCL 2.28.9's count for two H200 on NV18
/// ("24 coll channels" in its INFO log).
pub const DEFAULT_P2P_CTAS: usize = 24;

/// CTAs per thread-block cluster of a launch (NCCL_CGA_CLUSTER_SIZE,
/// cgaClusterSize): NCCL's default on Hopper. A cluster runs within one
/// GPC, and clusters are spread over the GPCs, so that a launch's CTAs
/// share the GPU's crossbar evenly; launched plainly, the 24 CTAs of a
/// collective put 8 on the SMs of one GPC (SMs 124-131 of an H200), which
/// moved their data over NVLink up to 30 % slower than the others, and the
/// launch lasted as long as they did (broadcast of 1 GiB on 2 H200).
pub const DEFAULT_CLUSTER: u32 = 4;

/// Most CTAs per cluster that every Hopper launch may ask for (NCCL's
/// NCCL_MAX_CGA_CLUSTER_SIZE): a larger value is taken as this.
pub const MAX_CLUSTER: u32 = 8;

/// CTAs of a window whose peers are reached through host memory (shared
/// memory or the network): NCCL 2.28.9 ran 2 between two H200 as two
/// hosts through its socket transport ("2 coll channels"), and its graph
/// search gives a ring through the CPU two channels. Each channel is a
/// connection the proxy drives; NCCL_MAX_NCHANNELS, where set, gives the
/// count.
pub const HOST_CTAS: usize = 2;

/// How a communicator settles its channel count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelChoice {
    /// `channels` as given (`OXCCL_DEV_CHANNELS`, or a program's own).
    Fixed,
    /// From the slowest link of the ring of the ranks' GPUs, kept within
    /// `min..=max` (the communicator's CTA bounds); `channels` stands where
    /// no link is known (one rank, ranks sharing a GPU, no sysfs).
    Topology { min: usize, max: usize },
    /// `channels`, the path's count (through host memory), within
    /// `min..=max`; no link is consulted.
    Path { min: usize, max: usize },
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    /// Most thread blocks (channels) a collective uses; also how many
    /// channels each window has room for (the window holds
    /// `channels * slots * slot_bytes` per peer: 48 MiB at 24 channels).
    /// `OXCCL_DEV_CHANNELS`.
    pub channels: usize,
    /// Whether `channels` is final or replaced at setup from the topology.
    pub choice: ChannelChoice,
    /// Threads per block: [`DEFAULT_THREADS`], `NCCL_NTHREADS`, else
    /// `OXCCL_DEV_THREADS`.
    pub threads: u32,
    /// FIFO slots per connection and channel. `OXCCL_DEV_SLOTS`.
    pub slots: usize,
    /// Bytes per FIFO slot: the most one slice carries. `OXCCL_DEV_SLOT_BYTES`.
    pub slot_bytes: usize,
    /// A channel is added per this many bytes of data, so that small
    /// operations use few blocks. `OXCCL_DEV_CHANNEL_BYTES`.
    pub channel_bytes: usize,
    /// Slices each step of a channel moves before the next step moves (a
    /// chunk, in NCCL's terms); at most half the slots, so that two chunks
    /// in flight never fill a FIFO. More than one lets a rank run ahead of
    /// a peer that is not running (another process's kernel on a shared
    /// GPU, a proxy across a network). `OXCCL_DEV_GROUP`.
    pub group: usize,
    /// Smallest slice worth a FIFO round (flags, fences), unless the data
    /// is smaller. `OXCCL_DEV_MIN_SLICE_BYTES`.
    pub min_slice_bytes: usize,
    /// A kernel waiting longer than this for a peer traps, so that a dead
    /// peer ends in an error rather than a hung GPU. `OXCCL_DEV_TIMEOUT_S`.
    pub timeout: Duration,
    /// Bytes per slot of each connection's LL FIFO (16-byte lines, half of
    /// them data); 0: none. Windows with peers through host memory (SHM or
    /// the network) have one ([`DeviceConfig::through_host`]).
    /// `OXCCL_DEV_LL_SLOT_BYTES`.
    pub ll_slot_bytes: usize,
    /// Operations of at most this many bytes per rank take the LL FIFO
    /// where the window has one (NCCL_PROTO: 0 with `Simple` alone or
    /// `^LL`, every size with `LL` alone). `OXCCL_DEV_LL_BYTES`.
    pub ll_max_bytes: usize,
    /// CTAs per thread-block cluster where the GPU has clusters (compute
    /// capability 9.0 and later): [`DEFAULT_CLUSTER`], or
    /// NCCL_CGA_CLUSTER_SIZE / cgaClusterSize; 0 or 1: no clusters. A
    /// launch whose CTA count it does not divide runs in clusters of one.
    pub cluster: u32,
}

/// LL slot bytes: 4 KiB of data per slice.
pub const LL_SLOT_BYTES: usize = 8 << 10;

/// Channels an LL launch uses at most: two, for the double binary tree's
/// two trees; an operation of up to [`LL_MAX_BYTES`] fills one otherwise.
pub const LL_CHANNELS: usize = 2;

/// Largest operation (bytes per rank) that takes LL by default. On 2 H200
/// through the socket network (nccl-tests `-g 2`, P2P and SHM off), LL
/// took 2-4 us off Simple's 22-26 us up to 2 KiB, was level at 4 KiB
/// (all_gather 2-3 us faster, all_reduce up to 2 us slower) and slower from
/// 8 KiB (16 KiB all_reduce: 62 us against 27), where each LL slot of 4 KiB
/// of data is a message of its own, twice the data's bytes. Through
/// shared memory too, LL was slower from 8 KiB (all_reduce 16 us against
/// Simple's 13.6).
pub const LL_MAX_BYTES: usize = 4 << 10;

/// NCCL_PROTO's parser, beside the setting's declaration.
pub use crate::config::protocols;

/// The communicator's CTA bounds: NCCL_MIN_CTAS / NCCL_MAX_CTAS (the
/// config's minCTAs / maxCTAs arrive as the same keys; zero is refused when
/// the settings load), tightened by NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS
/// where those are set, within 1..=[`MAX_CHANNELS`]; a minimum above the
/// maximum yields to it (NCCL's rule).
pub fn cta_bounds(cfg: &crate::config::Config) -> (usize, usize) {
    use crate::config::Source;
    let ctas = |v: Option<u64>| v.map(|n| n.clamp(1, MAX_CHANNELS as u64) as usize);
    let mut min = ctas(cfg.min_ctas).unwrap_or(1);
    let mut max = ctas(cfg.max_ctas).unwrap_or(MAX_CHANNELS);
    if cfg.source("MIN_NCHANNELS") != Some(&Source::Default) {
        min = min.max((cfg.min_nchannels as usize).clamp(1, MAX_CHANNELS));
    }
    if cfg.source("MAX_NCHANNELS") != Some(&Source::Default) {
        max = max.min((cfg.max_nchannels as usize).clamp(1, MAX_CHANNELS));
    }
    (min.min(max), max)
}

/// The CTAs sends and receives use where collectives use `coll`: NCCL's
/// p2p count, `coll` rounded up to a power of two, within the maximum of
/// `choice`'s bounds (NCCL honours maxCTAs there too) and never below
/// `coll`. A fixed count is used for both.
pub fn p2p_channels(coll: usize, choice: ChannelChoice) -> usize {
    let max = match choice {
        ChannelChoice::Fixed => return coll,
        ChannelChoice::Topology { max, .. } | ChannelChoice::Path { max, .. } => max,
    };
    coll.next_power_of_two()
        .min(max)
        .min(MAX_CHANNELS)
        .max(coll)
}

/// NCCL_CTA_POLICY's parser, beside the setting's declaration.
pub fn cta_policy(s: Option<&str>) -> Result<u32> {
    crate::config::cta_policy(s)
        .map_err(|why| Error::InvalidArgument(format!("NCCL_CTA_POLICY={s:?}: {why}")))
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            channels: DEFAULT_P2P_CTAS,
            choice: ChannelChoice::Topology {
                min: 1,
                max: MAX_CHANNELS,
            },
            threads: DEFAULT_THREADS,
            slots: 8,
            slot_bytes: 256 << 10,
            group: 1,
            channel_bytes: 32 << 10,
            min_slice_bytes: 64 << 10,
            timeout: Duration::from_secs(120),
            ll_slot_bytes: 0,
            ll_max_bytes: LL_MAX_BYTES,
            cluster: DEFAULT_CLUSTER,
        }
    }
}

impl DeviceConfig {
    /// The defaults with the environment's overrides.
    pub fn from_env() -> Result<DeviceConfig> {
        let mut c = DeviceConfig::default();
        // `auto`, the default, takes the link's count.
        match ox::dev_channels()? {
            Some(AutoOr::Count(v)) => {
                c.channels = v as usize;
                c.choice = ChannelChoice::Fixed;
            }
            Some(AutoOr::Auto) | None => {}
        }
        if let Some(v) = ox::dev_threads()? {
            c.threads = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(v) = ox::dev_slots()? {
            c.slots = v as usize;
        }
        if let Some(v) = ox::dev_slot_bytes()? {
            c.slot_bytes = v as usize;
        }
        if let Some(v) = ox::dev_group()? {
            c.group = v as usize;
        }
        if let Some(v) = ox::dev_channel_bytes()? {
            c.channel_bytes = v as usize;
        }
        if let Some(v) = ox::dev_min_slice_bytes()? {
            c.min_slice_bytes = v as usize;
        }
        if let Some(v) = ox::dev_timeout_s()? {
            c.timeout = Duration::from_secs(v);
        }
        if let Some(v) = ox::dev_ll_bytes()? {
            c.ll_max_bytes = v as usize;
        }
        c.validate()?;
        Ok(c)
    }

    /// Takes the communicator's CTA bounds from `cfg`: NCCL_MIN_CTAS and
    /// NCCL_MAX_CTAS (or the config's minCTAs and maxCTAs), and the older
    /// NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS where set (their defaults
    /// are the host path's, not meant for a GPU); the tighter of each pair
    /// holds, and a minimum above the maximum yields to it, as in NCCL. A
    /// fixed count is only capped by the maximum. NCCL_NTHREADS sets the
    /// threads per block.
    pub fn with_nccl_bounds(mut self, cfg: &crate::config::Config) -> Result<DeviceConfig> {
        use crate::config::Source;
        // A user who set NCCL_TIMEOUT expects every wait on a peer to end
        // then, the kernels' and the shared-GPU path's included.
        if cfg.source("TIMEOUT") != Some(&Source::Default)
            && !crate::config::env_is_set("OXCCL_DEV_TIMEOUT_S")
        {
            self.timeout = cfg.timeout();
        }
        if let Some(t) = cfg.nthreads {
            // Checked at load (64-1024, multiples of 32).
            self.threads = u32::try_from(t).unwrap_or(u32::MAX);
        }
        if let Some(n) = cfg.cga_cluster_size {
            if n > u64::from(MAX_CLUSTER) {
                tracing::info!(target: "oxccl::init", "NCCL_CGA_CLUSTER_SIZE (cgaClusterSize) {n} is above {MAX_CLUSTER}: clusters of {MAX_CLUSTER}, as NCCL");
            }
            self.cluster = n.min(u64::from(MAX_CLUSTER)) as u32;
        }
        let policy = cta_policy(cfg.cta_policy.as_deref())?;
        if policy != 0 {
            tracing::warn!(target: "oxccl::init", "NCCL_CTA_POLICY (CTAPolicy) {policy}: all_gather and all_to_all into symmetric windows run on the copy engine (OXCCL_CE_COLL); everything else runs as DEFAULT: the CTA count is NCCL's default one, within minCTAs and maxCTAs");
        }
        let (min, max) = cta_bounds(cfg);
        match &mut self.choice {
            ChannelChoice::Fixed => self.channels = self.channels.min(max),
            ChannelChoice::Topology { min: lo, max: hi }
            | ChannelChoice::Path { min: lo, max: hi } => {
                (*lo, *hi) = (min, max);
            }
        }
        self.validate()?;
        Ok(self)
    }

    /// The window of a communicator some of whose peers are reached
    /// through host memory (SHM or the network): NCCL's step slots
    /// (NCCL_STEPS = 8 of NCCL_BUFFSIZE / 8 bytes) on a few channels, since
    /// host memory is pinned per peer and a PCIe link or a NIC is fed by
    /// few blocks: [`HOST_CTAS`], NCCL's count there, whether some peers
    /// are over the network or all in shared memory, within the
    /// communicator's CTA bounds. NCCL_MAX_NCHANNELS, where set, gives the count.
    /// The window also has an LL FIFO ([`LL_SLOT_BYTES`] per slot,
    /// `OXCCL_DEV_LL_SLOT_BYTES`; 0: none), through shared memory as
    /// through the network: on 2 H200 with P2P off, LL took 1-1.7 us off
    /// shared memory's 11-12 us all_reduce up to 2 KiB. Slots of NCCL's LL
    /// step (64 KiB, 8 lines a thread, read together) did not pay: from
    /// 32 KiB LL was still slower than Simple (2026-11-27, a9abdf9).
    pub fn through_host(mut self, cfg: &crate::config::Config) -> Result<DeviceConfig> {
        use crate::config::Source;
        let set = cfg.source("MAX_NCHANNELS") != Some(&Source::Default);
        let wanted = if set {
            (cfg.max_nchannels as usize).clamp(1, MAX_CHANNELS)
        } else {
            HOST_CTAS
        };
        match self.choice {
            ChannelChoice::Fixed => self.channels = wanted.min(self.channels),
            ChannelChoice::Topology { min, max } | ChannelChoice::Path { min, max } => {
                self.channels = wanted;
                self.choice = ChannelChoice::Path { min, max };
            }
        }
        self.slots = 8;
        if ox::dev_group()?.is_none() {
            self.group = self.slots / 2;
        }
        self.slot_bytes = ((cfg.buffsize as usize / 8) & !15).clamp(4 << 10, 64 << 20);
        self.min_slice_bytes = self.min_slice_bytes.min(self.slot_bytes);
        self.ll_slot_bytes = ox::dev_ll_slot_bytes()?.map_or(LL_SLOT_BYTES, |v| v as usize);
        self.validate()?;
        Ok(self)
    }

    /// Applies NCCL_PROTO (rank 0's, so that every rank cuts alike).
    pub fn with_protocols(mut self, proto: Option<&str>) -> Result<DeviceConfig> {
        match protocols(proto)? {
            (true, true) => {}
            (false, _) => self.ll_max_bytes = 0,
            (true, false) => self.ll_max_bytes = usize::MAX,
        }
        Ok(self)
    }

    /// The count for a link that asks for `wanted` channels (None: not
    /// known), within the bounds; `channels` itself when fixed, and the
    /// path's `channels` where no link is consulted.
    pub fn channels_for(&self, wanted: Option<usize>) -> usize {
        match self.choice {
            ChannelChoice::Fixed => self.channels,
            ChannelChoice::Topology { min, max } => {
                let n = wanted.unwrap_or(self.channels);
                // A minimum above the maximum: NCCL lets the maximum win.
                n.max(min).min(max).clamp(1, MAX_CHANNELS)
            }
            ChannelChoice::Path { min, max } => {
                self.channels.max(min).min(max).clamp(1, MAX_CHANNELS)
            }
        }
    }

    /// Whether the count is settled by asking the link between the GPUs.
    pub fn asks_link(&self) -> bool {
        matches!(self.choice, ChannelChoice::Topology { .. })
    }

    /// Checks the ranges the kernels and the window layout rely on.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("device config: {m}")));
        if !(1..=MAX_CHANNELS).contains(&self.channels) {
            return bad(format!(
                "channels {} not in 1..={MAX_CHANNELS} (OXCCL_DEV_CHANNELS)",
                self.channels
            ));
        }
        // Two warp groups at least: an exchange sends with one, reduces with the other.
        if !(64..=1024).contains(&self.threads) || !self.threads.is_multiple_of(32) {
            return bad(format!(
                "threads {} not a multiple of 32 in 64..=1024 (OXCCL_DEV_THREADS)",
                self.threads
            ));
        }
        if !(1..=64).contains(&self.slots) {
            return bad(format!(
                "slots {} not in 1..=64 (OXCCL_DEV_SLOTS)",
                self.slots
            ));
        }
        if self.slot_bytes < 16 || !self.slot_bytes.is_multiple_of(16) || self.slot_bytes > 64 << 20
        {
            return bad(format!(
                "slot bytes {} not a multiple of 16 up to 64 MiB (OXCCL_DEV_SLOT_BYTES)",
                self.slot_bytes
            ));
        }
        if self.group == 0 || (self.group > 1 && 2 * self.group > self.slots) {
            return bad(format!(
                "group {} not 1 or at most half of {} slots (OXCCL_DEV_GROUP)",
                self.group, self.slots
            ));
        }
        if self.channel_bytes == 0 {
            return bad("channel bytes 0 (OXCCL_DEV_CHANNEL_BYTES)".into());
        }
        // An LL slot carries half its bytes of data, in whole 16-byte units.
        let ll = self.ll_slot_bytes;
        if !ll.is_multiple_of(16) || ll > 1 << 20 || (ll > 0 && ll < 32) {
            return bad(format!(
                "LL slot bytes {ll} not 0 or a multiple of 16 from 32 up to 1 MiB (OXCCL_DEV_LL_SLOT_BYTES)"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_size;

    /// The defaults docs/settings.md shows for OXCCL_DEV_* (the table's
    /// `shown` values) are the ones this file holds.
    #[test]
    fn the_settings_table_shows_these_defaults() {
        let d = DeviceConfig::default();
        // The count is the link's unless fixed: `auto` is the default.
        assert!(d.asks_link());
        let shown = crate::config::setting("OXCCL_DEV_CHANNELS").expect("declared");
        assert_eq!(shown.default, "auto");
        let want = [
            ("OXCCL_DEV_THREADS", u64::from(d.threads)),
            ("OXCCL_DEV_SLOTS", d.slots as u64),
            ("OXCCL_DEV_SLOT_BYTES", d.slot_bytes as u64),
            ("OXCCL_DEV_GROUP", d.group as u64),
            ("OXCCL_DEV_CHANNEL_BYTES", d.channel_bytes as u64),
            ("OXCCL_DEV_MIN_SLICE_BYTES", d.min_slice_bytes as u64),
            ("OXCCL_DEV_TIMEOUT_S", d.timeout.as_secs()),
            ("OXCCL_DEV_LL_BYTES", d.ll_max_bytes as u64),
            ("OXCCL_DEV_LL_SLOT_BYTES", LL_SLOT_BYTES as u64),
        ];
        for (name, value) in want {
            let shown = crate::config::setting(name).expect("declared").default;
            assert_eq!(
                parse_size(shown),
                Some(value),
                "{name}: the table in core/src/config/mod.rs shows {shown:?}, DeviceConfig holds {value}; change its `shown`"
            );
        }
    }

    #[test]
    fn p2p_takes_nccls_power_of_two_within_the_maximum() {
        let topo = |max| ChannelChoice::Topology { min: 1, max };
        // 2 H200 on NV18: NCCL ran collectives on 24 CTAs, SendRecv on 32.
        assert_eq!(p2p_channels(24, topo(MAX_CHANNELS)), 32);
        assert_eq!(p2p_channels(32, topo(MAX_CHANNELS)), 32);
        assert_eq!(p2p_channels(2, ChannelChoice::Path { min: 1, max: 64 }), 2);
        // maxCTAs bounds both; never fewer than the collectives'.
        assert_eq!(p2p_channels(24, topo(28)), 28);
        assert_eq!(p2p_channels(8, topo(8)), 8);
        assert_eq!(p2p_channels(24, ChannelChoice::Fixed), 24);
    }

    #[test]
    fn sizes_and_ranges() {
        assert_eq!(parse_size("128K"), Some(128 << 10));
        assert_eq!(parse_size(" 7 "), Some(7));
        assert_eq!(parse_size("x"), None);
        assert!(DeviceConfig::default().validate().is_ok());
        let c = DeviceConfig {
            threads: 100,
            ..DeviceConfig::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn windows_through_host_memory_have_an_ll_fifo() {
        let cfg = crate::config::Config::load_with(&[]).unwrap();
        let c = DeviceConfig::default().through_host(&cfg).unwrap();
        assert_eq!(c.ll_slot_bytes, LL_SLOT_BYTES);
        assert_eq!(c.ll_max_bytes, LL_MAX_BYTES);
        assert_eq!(DeviceConfig::default().ll_slot_bytes, 0, "all P2P: none");
    }

    #[test]
    fn nccl_proto_as_nccl_reads_it() {
        assert_eq!(protocols(None).unwrap(), (true, true));
        assert_eq!(protocols(Some("")).unwrap(), (true, true));
        assert_eq!(protocols(Some("Simple")).unwrap(), (false, true));
        assert_eq!(protocols(Some("ll")).unwrap(), (true, false));
        assert_eq!(protocols(Some("LL,Simple")).unwrap(), (true, true));
        assert_eq!(protocols(Some("^LL")).unwrap(), (false, true));
        assert_eq!(protocols(Some("^LL128")).unwrap(), (true, true));
        assert!(protocols(Some("LL128")).is_err(), "nothing oxccl runs");
        assert!(protocols(Some("Fast")).is_err());
        let c = DeviceConfig::default();
        assert_eq!(
            c.clone().with_protocols(None).unwrap().ll_max_bytes,
            LL_MAX_BYTES
        );
        let s = c.clone().with_protocols(Some("Simple")).unwrap();
        assert_eq!(s.ll_max_bytes, 0);
        let l = c.with_protocols(Some("LL")).unwrap();
        assert_eq!(l.ll_max_bytes, usize::MAX);
    }

    #[test]
    fn topology_count_within_nccl_bounds() {
        let c = DeviceConfig::default();
        assert_eq!(c.channels_for(Some(128)), 128);
        assert_eq!(c.channels_for(Some(17)), 17);
        // Unknown link: NCCL's count for NV18 stands.
        assert_eq!(c.channels_for(None), DEFAULT_P2P_CTAS);
        let cfg = crate::config::Config::load_with(&[
            ("NCCL_MIN_NCHANNELS", "32"),
            ("NCCL_MAX_NCHANNELS", "64"),
        ])
        .unwrap();
        let b = c.clone().with_nccl_bounds(&cfg).unwrap();
        assert_eq!(b.choice, ChannelChoice::Topology { min: 32, max: 64 });
        assert_eq!(b.channels_for(Some(17)), 32);
        assert_eq!(b.channels_for(Some(128)), 64);
        // Only the maximum set: the minimum stays 1, not the host's default.
        let cfg = crate::config::Config::load_with(&[("NCCL_MAX_NCHANNELS", "1000")]).unwrap();
        let b = c.clone().with_nccl_bounds(&cfg).unwrap();
        assert_eq!(b.channels_for(Some(2)), 2);
        assert_eq!(b.channels_for(Some(128)), MAX_CHANNELS);
        // A fixed count is only capped.
        let f = DeviceConfig {
            channels: 8,
            choice: ChannelChoice::Fixed,
            ..DeviceConfig::default()
        }
        .with_nccl_bounds(&cfg)
        .unwrap();
        assert_eq!(f.channels_for(Some(128)), 8);
    }

    #[test]
    fn cta_bounds_hold_on_every_path() {
        let load = |kv: &[(&str, &str)]| crate::config::Config::load_with(kv).unwrap();
        let cfg = load(&[("MAX_CTAS", "8")]);
        let p2p = DeviceConfig::default().with_nccl_bounds(&cfg).unwrap();
        assert_eq!(p2p.channels_for(Some(24)), 8);
        assert_eq!(p2p.channels_for(None), 8);
        let host = p2p.clone().through_host(&cfg).unwrap();
        assert_eq!(host.channels_for(None), HOST_CTAS);
        let fixed = DeviceConfig {
            channels: 128,
            choice: ChannelChoice::Fixed,
            ..DeviceConfig::default()
        }
        .with_nccl_bounds(&cfg)
        .unwrap();
        assert_eq!(
            fixed.channels_for(None),
            8,
            "OXCCL_DEV_CHANNELS stays under maxCTAs"
        );
        // minCTAs raises the count on every path, up to the maximum.
        let cfg = load(&[("MIN_CTAS", "16")]);
        let p2p = DeviceConfig::default().with_nccl_bounds(&cfg).unwrap();
        assert_eq!(p2p.channels_for(Some(2)), 16);
        let host = p2p.through_host(&cfg).unwrap();
        assert_eq!(host.channels_for(None), 16);
        let cfg = load(&[("MIN_CTAS", "64"), ("MAX_CTAS", "4")]);
        assert_eq!(cta_bounds(&cfg), (4, 4), "the maximum wins, as NCCL's");
        // The older names tighten the newer ones.
        let cfg = load(&[("MAX_CTAS", "16"), ("MAX_NCHANNELS", "4")]);
        assert_eq!(cta_bounds(&cfg), (1, 4));
        let cfg = load(&[("NTHREADS", "256")]);
        let t = DeviceConfig::default().with_nccl_bounds(&cfg).unwrap();
        assert_eq!(t.threads, 256);
        let e = crate::config::Config::load_with(&[("NTHREADS", "100")]).unwrap_err();
        assert!(e.to_string().contains("NCCL_NTHREADS"), "{e}");
        let e = crate::config::Config::load_with(&[("MAX_CTAS", "0")]).unwrap_err();
        assert!(e.to_string().contains("NCCL_MAX_CTAS"), "{e}");
    }

    #[test]
    fn cluster_size_as_nccl_reads_it() {
        let load = |kv: &[(&str, &str)]| crate::config::Config::load_with(kv).unwrap();
        let cluster = |kv: &[(&str, &str)]| {
            DeviceConfig::default()
                .with_nccl_bounds(&load(kv))
                .unwrap()
                .cluster
        };
        assert_eq!(cluster(&[]), DEFAULT_CLUSTER, "NCCL's 4 unset");
        assert_eq!(cluster(&[("CGA_CLUSTER_SIZE", "2")]), 2);
        assert_eq!(cluster(&[("CGA_CLUSTER_SIZE", "0")]), 0, "no clusters");
        assert_eq!(cluster(&[("CGA_CLUSTER_SIZE", "20")]), MAX_CLUSTER);
        assert!(crate::config::Config::load_with(&[("CGA_CLUSTER_SIZE", "two")]).is_err());
    }

    #[test]
    fn cta_policy_as_nccl_reads_it() {
        assert_eq!(cta_policy(None).unwrap(), 0);
        assert_eq!(cta_policy(Some("efficiency")).unwrap(), 1);
        assert_eq!(cta_policy(Some("ZERO|EFFICIENCY")).unwrap(), 2);
        assert_eq!(cta_policy(Some("1")).unwrap(), 1);
        let e = cta_policy(Some("fast")).unwrap_err().to_string();
        assert!(e.contains("NCCL_CTA_POLICY"), "{e}");
    }

    #[test]
    fn default_is_nccls_count() {
        let c = DeviceConfig::default();
        assert_eq!(c.channels, DEFAULT_P2P_CTAS);
        assert!(c.asks_link());
    }
}
