//! Communicators made from another one: the split by color and key, and
//! the child communicator that splits, shrinks and grows create among some
//! of the parent's ranks.

use super::*;

/// What a split takes from a parent that shares its resources with its
/// splits (NCCL's `ncclNetInitFromParent`).
pub(super) struct FromParent {
    /// The parent's network with its context.
    pub(super) net: Arc<dyn Net>,
    /// The parent's NCCL_NET, which the split's must not contradict.
    pub(super) net_setting: Option<String>,
}

/// A communicator made from another one (split, shrink).
pub(super) struct Child<'a> {
    /// Ranks of the parent, in their order in the child.
    pub(super) members: &'a [usize],
    /// The parent's count of splits and shrinks before this one.
    pub(super) split_no: u64,
    pub(super) hash: u64,
    /// The child takes the parent's network context.
    pub(super) share: bool,
    /// The id travels while failure notices of other ranks stand (shrink).
    pub(super) despite_failures: bool,
}

/// `config` for a communicator made from `core`'s (split, shrink, grow):
/// on the same GPU unless it names one, and with the parent's resolved
/// settings below its own.
pub(super) fn child_config(core: &Core, config: &CommConfig) -> CommConfig {
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

pub(super) fn bytes_to_id(bytes: &[u8]) -> Result<UniqueId> {
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

impl Comm {
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
    pub(super) fn make_child(
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
}
