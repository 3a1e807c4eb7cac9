//! Ranks in two processes (one GPU each, or both on the one GPU there is):
//! windows are mapped through CUDA IPC instead of by address. Sharing a GPU
//! without MPS, the two processes' kernels take turns on it, which is slow
//! but completes. The test starts a copy of its own binary as
//! rank 1; the two exchange setup bytes over a loopback TCP connection.

mod gpu_common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::Duration;

use gpu_common::{inputs, two_ranks, value};
use oxccl::cuda::{DeviceBuffer, Stream};
use oxccl::exec::device::{DeviceComm, DeviceConfig, Oob};
use oxccl::{DataType, RedOp, Result};

const CHILD_ENV: &str = "OXCCL_TEST_IPC_PORT";
const TEST: &str = "all_reduce_and_all_gather_across_processes";

/// Two ranks over one TCP connection: each all-gather sends ours, reads theirs.
struct TcpOob {
    rank: usize,
    conn: Mutex<TcpStream>,
}

impl Oob for TcpOob {
    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        2
    }

    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let io = |e: std::io::Error| oxccl::Error::System(format!("test exchange: {e}"));
        let mut c = self.conn.lock().unwrap();
        c.write_all(&(mine.len() as u64).to_le_bytes())
            .map_err(io)?;
        c.write_all(mine).map_err(io)?;
        let mut len = [0u8; 8];
        c.read_exact(&mut len).map_err(io)?;
        let mut theirs = vec![0u8; u64::from_le_bytes(len) as usize];
        c.read_exact(&mut theirs).map_err(io)?;
        Ok(if self.rank == 0 {
            vec![mine.to_vec(), theirs]
        } else {
            vec![theirs, mine.to_vec()]
        })
    }
}

/// One rank's part; returns its wrong elements.
fn rank_main(oob: &TcpOob) -> usize {
    let rank = oob.rank();
    let gpus = oxccl::cuda::device_count().unwrap_or(1).max(1);
    let cfg = DeviceConfig::from_env().unwrap();
    let mut comm = DeviceComm::new(oob, rank % gpus, cfg).expect("comm");
    let ctx = comm.context().clone();
    let stream = Stream::new(&ctx).unwrap();
    let count = 1_000_003;
    let dtype = DataType::Float32;
    let mine = inputs(dtype, 500 + rank as u64, count);
    let theirs = inputs(dtype, 500 + 1 - rank as u64, count);
    let send = DeviceBuffer::alloc(&ctx, count * 4).unwrap();
    let recv = DeviceBuffer::alloc(&ctx, count * 4).unwrap();
    let gathered = DeviceBuffer::alloc(&ctx, 2 * count * 4).unwrap();
    send.write(0, &mine).unwrap();
    recv.fill_bytes(0xff).unwrap();
    gathered.fill_bytes(0xff).unwrap();
    let s = stream.handle();
    comm.all_reduce(send.ptr(), recv.ptr(), count, dtype, RedOp::Sum, s)
        .unwrap();
    comm.all_gather(send.ptr(), gathered.ptr(), count, dtype, s)
        .unwrap();
    stream.synchronize().unwrap();
    let mut out = vec![0u8; count * 4];
    recv.read(0, &mut out).unwrap();
    let mut g = vec![0u8; 2 * count * 4];
    gathered.read(0, &mut g).unwrap();
    let (lo, hi) = if rank == 0 {
        (&mine, &theirs)
    } else {
        (&theirs, &mine)
    };
    let mut wrong = 0;
    for i in 0..count {
        let want = value(dtype, &mine, i) + value(dtype, &theirs, i);
        if (value(dtype, &out, i) - want).abs() > 1e-6 * want.abs().max(1.0) {
            wrong += 1;
        }
        if g[i * 4..i * 4 + 4] != lo[i * 4..i * 4 + 4]
            || g[(count + i) * 4..(count + i) * 4 + 4] != hi[i * 4..i * 4 + 4]
        {
            wrong += 1;
        }
    }
    println!(
        "rank {rank} (pid {}): across processes {wrong} wrong",
        std::process::id()
    );
    // Neither rank frees its window while the other may still write into it.
    oob.allgather(b"done").unwrap();
    wrong
}

#[test]
fn all_reduce_and_all_gather_across_processes() {
    if let Ok(port) = std::env::var(CHILD_ENV) {
        let conn = TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
        let wrong = rank_main(&TcpOob {
            rank: 1,
            conn: Mutex::new(conn),
        });
        assert_eq!(wrong, 0);
        return;
    }
    let Some((_gpus, _)) = two_ranks() else {
        return;
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, port.to_string())
        .spawn()
        .unwrap();
    // The child may die before connecting: never wait for it forever.
    listener.set_nonblocking(true).unwrap();
    let start = std::time::Instant::now();
    let conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(st) = child.try_wait().unwrap() {
                    panic!("rank 1's process exited before connecting: {st}");
                }
                if start.elapsed() > Duration::from_secs(120) {
                    let _ = child.kill();
                    panic!("rank 1's process did not connect within 120 s");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(300)))
        .unwrap();
    let wrong = rank_main(&TcpOob {
        rank: 0,
        conn: Mutex::new(conn),
    });
    let status = child.wait().unwrap();
    assert!(status.success(), "rank 1's process failed: {status}");
    assert_eq!(wrong, 0);
}
