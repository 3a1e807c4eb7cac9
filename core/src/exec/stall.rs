//! A stalled lane's questions to its peers: what they called under the
//! collective's number, and the error that names a mismatch, a peer's own
//! report or the waits still open at NCCL_TIMEOUT.

use super::*;

/// How long a wait on the rings goes before it asks its peers, through
/// the bootstrap, what they called as this collective: long beside a
/// message's trip between hosts, short beside NCCL_TIMEOUT. A rank that
/// only comes late is asked again, after twice the wait so far, then at
/// least every [`ASK_EVERY`].
pub(super) const ASK_AFTER: Duration = Duration::from_millis(100);
pub(super) const ASK_EVERY: Duration = Duration::from_secs(1);
/// How long one round of asking waits for the peers' answers: a stopped
/// peer never answers, and the wait's other checks wait meanwhile.
pub(super) const ASK_WAIT: Duration = Duration::from_millis(500);

/// Asks the peers this collective still waits on (the lanes' unfinished
/// sends and receives) what they called under its number, and fails,
/// naming both calls, where one called another. Ranks whose counts differ
/// may take different paths (algorithms, channels, peers) or, with a
/// count of 0, none, so that the operation header that would have named
/// the mismatch never travels: they would wait until NCCL_TIMEOUT. Some
/// rank of such a stall always waits on a rank with another call (ranks
/// that called alike run the same plan, which does not stall), so that
/// one names it and its failure notice ends the others' waits.
pub(super) fn ask_peers(ctx: &ExecCtx<'_>, lanes: &[Lane], states: &[LaneState<'_>]) -> Result<()> {
    let Some(seq) = ctx.seq else {
        return Ok(());
    };
    let open = || {
        lanes
            .iter()
            .zip(states)
            .filter(|(_, s)| !s.done)
            .map(|(l, _)| l)
    };
    let Some(mine) = open().next().map(|l| OpHeader {
        plan: None,
        ..l.header
    }) else {
        return Ok(());
    };
    let peers: Vec<usize> = open()
        .flat_map(|l| l.send.keys().chain(l.recv.keys()).copied())
        .collect();
    for (peer, answer) in ctx.bootstrap.query_call(&peers, seq, ASK_WAIT) {
        match answer {
            PeerCall::Called(theirs) => mine.check(&theirs, peer, ctx.rank)?,
            // Behind, in an earlier collective, which this rank left
            // without it (with a count of 0, say): compare that one.
            PeerCall::Started(n) if n > 0 && n <= seq => {
                let at = n - 1;
                let Some(own) = ctx
                    .bootstrap
                    .own_call(at)
                    .and_then(|b| OpHeader::decode(&b))
                else {
                    continue;
                };
                for (p, a) in ctx.bootstrap.query_call(&[peer], at, ASK_WAIT) {
                    if let PeerCall::Called(theirs) = a {
                        own.check(&theirs, p, ctx.rank)?;
                    }
                }
            }
            PeerCall::Started(_) => {}
        }
    }
    Ok(())
}

/// How long a broken connection waits for a report that may explain it,
/// where nothing says that none is coming.
pub(super) const REPORT_GRACE: Duration = Duration::from_millis(300);

/// A broken connection is often the echo of a failure another rank has
/// already reported (and then left): its report says more, so prefer it.
/// Where the connection says its peer left (a remote error: its process
/// exited or was killed, or it closed the connection), any report that
/// peer made has already been recorded here, since a rank's failure
/// notice waits for each peer to take it before the rank goes on (see
/// `Bootstrap::broadcast_failure`): one look, no wait. A killed rank
/// sends none, and survivors used to wait the whole grace for it. Other
/// errors wait up to [`REPORT_GRACE`].
pub(super) fn prefer_peer_report(ctx: &ExecCtx<'_>, e: Error) -> Error {
    if !matches!(e, Error::Remote(_) | Error::System(_)) {
        return e;
    }
    let grace = match e {
        Error::Remote(_) => Duration::ZERO,
        _ => REPORT_GRACE,
    };
    let start = Instant::now();
    loop {
        if let Some((who, msg)) = ctx.bootstrap.remote_failure() {
            return Error::Remote(format!("rank {who} failed: {msg} (seen here as: {e})"));
        }
        if start.elapsed() >= grace {
            return e;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Names what this rank waited for and, by asking every rank how far it
/// got, the ranks that never arrived at this operation.
pub(super) fn timeout_error(ctx: &ExecCtx<'_>, waits: &[String]) -> Error {
    let mut msg = format!(
        "{} on rank {}: no progress for {:.1} s (NCCL_TIMEOUT) waiting {}",
        (ctx.what)(),
        ctx.rank,
        ctx.timeout.as_secs_f64(),
        if waits.is_empty() {
            "on peers".to_string()
        } else {
            waits.join(", ")
        }
    );
    if let Some(seq) = ctx.seq {
        let progress = ctx.bootstrap.query_progress();
        let behind: Vec<String> = progress
            .iter()
            .enumerate()
            .filter_map(|(r, p)| match p {
                PeerProgress::Started(n) if *n <= seq => {
                    Some(format!("{r} (started {n} operations)"))
                }
                _ => None,
            })
            .collect();
        let gone: Vec<String> = progress
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p, PeerProgress::Unreachable))
            .map(|(r, _)| r.to_string())
            .collect();
        if !behind.is_empty() {
            msg += &format!(
                "; ranks that never arrived at operation #{seq}: {}",
                behind.join(", ")
            );
        }
        if !gone.is_empty() {
            msg += &format!("; ranks not answering (dead or hung): {}", gone.join(", "));
        }
    }
    Error::Remote(msg)
}
