//! GPUDirect through the net interface, without an RDMA NIC ("CudaBounce",
//! see `bounce`). Two ranks on GPU 0 in this process, P2P and SHM off, so
//! every byte goes through the net proxy. With NCCL_NET_GDR_LEVEL=SYS the
//! step slots must be GPU memory registered as CUDA memory and every
//! transfer must use them; with LOC the slots stay in host memory. Results
//! are checked either way. Skips, saying so, without a GPU.

mod bounce;

use bounce::{run, COUNT, CUDA, LOG, NRANKS};

#[test]
fn step_slots_in_gpu_memory_with_a_network_that_takes_cuda_pointers() {
    let n = oxccl::cuda::device_count().unwrap_or(0);
    if n == 0 {
        eprintln!("skipped: no GPU (CUDA driver and a GPU needed)");
        return;
    }
    for (level, gdr) in [("SYS", true), ("LOC", false)] {
        LOG.lock().unwrap().clear();
        CUDA.lock().unwrap().clear();
        let wrong = run("CudaBounce", level, "1");
        let log = LOG.lock().unwrap().clone();
        let regs = log.iter().filter(|e| e.0 == "regMr").count();
        let cuda_regs = log.iter().filter(|e| e.0 == "regMr" && e.3 == 2).count();
        let moves: Vec<_> = log.iter().filter(|e| e.0 != "regMr" && e.2 > 0).collect();
        let on_gpu = moves.iter().filter(|e| e.3 == 2).count();
        let device = moves.iter().filter(|e| e.4).count();
        println!(
            "NCCL_NET_GDR_LEVEL={level}: {wrong} wrong of {}; {regs} regMr ({cuda_regs} CUDA), \
             {} transfers, {on_gpu} from/into registered GPU memory, {device} device pointers",
            NRANKS * COUNT * (1 + NRANKS),
            moves.len()
        );
        assert_eq!(wrong, 0);
        assert!(!moves.is_empty());
        if gdr {
            assert!(
                cuda_regs > 0 && cuda_regs == regs,
                "every slot registered as CUDA memory"
            );
            assert_eq!(on_gpu, moves.len(), "every transfer from/into GPU memory");
            assert_eq!(device, moves.len());
        } else {
            assert_eq!(cuda_regs, 0, "host slots registered as host memory");
            assert_eq!(device, 0);
        }
    }
}
