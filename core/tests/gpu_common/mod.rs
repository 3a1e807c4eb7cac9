//! Shared by the GPU tests: finding the GPUs (or saying why the test is
//! skipped), running ranks as threads, and deterministic inputs. Tests of
//! two ranks run them on two GPUs where there are two, and on one GPU that
//! both share otherwise (the machine most often lent has one).
#![allow(dead_code)] // each test binary uses a part

use std::sync::{Barrier, Mutex, MutexGuard};

use oxccl::cuda::{self, Stream};
use oxccl::exec::device::{DeviceComm, DeviceConfig, LocalOob, Oob};
use oxccl::reduce::{load_f64, store_f64};
use oxccl::DataType;

pub const NRANKS: usize = 2;

/// Held by each GPU test of a binary while it runs: cargo runs a binary's
/// tests on parallel threads, and two tests' kernels spinning on the same
/// GPUs can each hold the SMs the other's peer kernel needs (NCCL's caveat
/// about concurrent communicators), which ends in the kernels' timeout.
static GPUS: Mutex<()> = Mutex::new(());

/// The GPUs to themselves, and the GPU of each of the [`NRANKS`] ranks:
/// rank r on GPU r, or every rank on GPU 0 where there is one GPU. `None`
/// where no GPU, driver or NVRTC is there, having printed why the test is
/// skipped (and it passes: CI has no GPU).
pub fn two_ranks() -> Option<(MutexGuard<'static, ()>, [usize; NRANKS])> {
    let guard = gpus(1)?;
    let n = cuda::device_count().unwrap_or(1).max(1);
    let devices = std::array::from_fn(|r| r % n);
    if n < NRANKS {
        println!("{NRANKS} ranks share GPU 0 ({n} GPU found)");
    }
    Some((guard, devices))
}

/// As [`two_gpus`], for tests that need `needed` GPUs.
pub fn gpus(needed: usize) -> Option<MutexGuard<'static, ()>> {
    match cuda::device_count() {
        Err(e) => {
            println!("skipped: {e}");
            return None;
        }
        Ok(n) if n < needed => {
            println!("skipped: {n} GPU(s) found, {needed} needed");
            return None;
        }
        Ok(_) => {}
    }
    if let Err(e) = cuda::nvrtc::version() {
        println!("skipped: {e}");
        return None;
    }
    Some(GPUS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// One rank: its communicator and a stream of its own.
pub struct Rank {
    pub rank: usize,
    pub comm: DeviceComm,
    pub stream: Stream,
}

/// Runs `f` on every rank, each in its own thread on its GPU of
/// [`two_ranks`]; returns each rank's result.
pub fn with_ranks<T: Send>(
    cfg: DeviceConfig,
    f: impl Fn(&mut Rank, &Barrier) -> T + Sync,
) -> Vec<T> {
    let gpus = cuda::device_count().unwrap_or(1).max(1);
    let oobs = LocalOob::group(NRANKS);
    let barrier = Barrier::new(NRANKS);
    std::thread::scope(|s| {
        let hs: Vec<_> = oobs
            .iter()
            .map(|oob| {
                let (f, barrier, cfg) = (&f, &barrier, cfg.clone());
                s.spawn(move || {
                    let rank = oob.rank();
                    let comm = DeviceComm::new(oob, rank % gpus, cfg).expect("device communicator");
                    let stream = Stream::new(comm.context()).expect("stream");
                    let mut r = Rank { rank, comm, stream };
                    f(&mut r, barrier)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Random inputs: floats in [-1, 1) (rounded to the type on store),
/// integers in [-50, 50], so that no sum or product of two overflows.
pub fn inputs(dtype: DataType, seed: u64, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n * dtype.size()];
    for i in 0..n {
        let h = splitmix(seed.wrapping_mul(0x1000_0000_01b3) ^ i as u64);
        let v = if dtype.is_float() {
            (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        } else {
            (h % 101) as f64 - 50.0
        };
        store_f64(dtype, &mut b, i, v);
    }
    b
}

pub fn value(dtype: DataType, b: &[u8], i: usize) -> f64 {
    load_f64(dtype, b, i)
}
