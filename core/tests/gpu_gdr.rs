//! GPUDirect through the net interface, without an RDMA NIC ("CudaBounce",
//! see `bounce`). Two ranks on GPU 0 in this process, P2P and SHM off, so
//! every byte goes through the net proxy. With NCCL_NET_GDR_LEVEL=SYS the
//! step slots must be GPU memory registered as CUDA memory and every
//! transfer must use them; with LOC the slots stay in host memory. Each
//! connection's LL slots are host memory either way, registered beside its
//! simple ones; with NCCL_PROTO=LL every transfer goes through them.
//! Results are checked every time. Skips, saying so, without a GPU.

mod bounce;

use bounce::{run, transfers, COUNT, CUDA, LOG, NRANKS};

#[test]
fn step_slots_in_gpu_memory_with_a_network_that_takes_cuda_pointers() {
    let n = oxccl::cuda::device_count().unwrap_or(0);
    if n == 0 {
        eprintln!("skipped: no GPU (CUDA driver and a GPU needed)");
        return;
    }
    for (level, proto, gdr) in [("SYS", "", true), ("LOC", "", false), ("SYS", "LL", false)] {
        LOG.lock().unwrap().clear();
        CUDA.lock().unwrap().clear();
        let wrong = run("CudaBounce", level, "1", proto);
        let log = LOG.lock().unwrap().clone();
        let regs = log.iter().filter(|e| e.0 == "regMr").count();
        let cuda_regs = log.iter().filter(|e| e.0 == "regMr" && e.3 == 2).count();
        let (moves, ll) = transfers(&log);
        // Operations of 12 MiB run Simple: the LL slots see only the
        // receives posted ahead into them, unless NCCL_PROTO=LL.
        if proto.is_empty() {
            assert!(ll.iter().all(|e| e.0 == "irecv"), "{ll:?}");
        }
        let on_gpu = moves.iter().filter(|e| e.3 == 2).count();
        let device = moves.iter().filter(|e| e.4).count();
        println!(
            "NCCL_NET_GDR_LEVEL={level} NCCL_PROTO={proto}: {wrong} wrong of {}; {regs} regMr ({cuda_regs} CUDA), \
             {} transfers, {on_gpu} from/into registered GPU memory, {device} device pointers; \
             {} of the LL slots beside them",
            NRANKS * COUNT * (1 + NRANKS),
            moves.len(),
            ll.len()
        );
        assert_eq!(wrong, 0);
        assert!(!moves.is_empty());
        if level == "SYS" {
            // The simple slots in GPU memory; the LL ones, on the channels
            // LL launches use, in host memory.
            let host_regs = regs - cuda_regs;
            assert!(
                cuda_regs > 0 && host_regs > 0 && host_regs <= cuda_regs,
                "every simple slot registered as CUDA memory, every LL slot as host memory"
            );
        }
        if proto == "LL" {
            assert!(
                moves.iter().all(|e| e.0 == "irecv"),
                "the simple slots see only the receives posted ahead into them"
            );
            assert!(
                !ll.is_empty() && ll.iter().all(|e| !e.4),
                "every LL transfer from/into host memory"
            );
        } else if gdr {
            assert_eq!(on_gpu, moves.len(), "every transfer from/into GPU memory");
            assert_eq!(device, moves.len());
        } else {
            if level == "LOC" {
                assert_eq!(cuda_regs, 0, "host slots registered as host memory");
            }
            assert_eq!(device, 0, "every transfer from/into host memory");
        }
    }
}
