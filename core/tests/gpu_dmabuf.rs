//! GPUDirect through dma-buf, without an RDMA NIC ("DmaBufBounce", see
//! `bounce`, which claims `NCCL_PTR_DMABUF` and not CUDA pointers). Two
//! ranks on GPU 0 in this process, P2P and SHM off, NCCL_NET_GDR_LEVEL=SYS:
//! where the GPU exports dma-bufs, every step slot must be registered
//! through `regMrDmaBuf` with a live dma-buf descriptor and every transfer
//! must use GPU memory; with NCCL_DMABUF_ENABLE=0, or a GPU that cannot
//! export, the slots stay in host memory. Results are checked either way.
//! Skips, saying so, without a GPU.

mod bounce;

use bounce::{run, transfers, CUDA, LOG};
use oxccl::cuda::Device;

#[test]
fn step_slots_registered_as_dma_bufs_with_a_network_that_takes_them() {
    let n = oxccl::cuda::device_count().unwrap_or(0);
    if n == 0 {
        eprintln!("skipped: no GPU (CUDA driver and a GPU needed)");
        return;
    }
    let exports = Device::get(0).unwrap().dma_buf_supported();
    if !exports {
        println!("this GPU or driver cannot export dma-bufs: GPUDirect must stay off below");
    }
    for (enable, gdr) in [("1", exports), ("0", false)] {
        LOG.lock().unwrap().clear();
        CUDA.lock().unwrap().clear();
        let wrong = run("DmaBufBounce", "SYS", enable, "");
        let log = LOG.lock().unwrap().clone();
        let count = |call: &str| log.iter().filter(|e| e.0 == call).count();
        let (live, dead, plain) = (count("regMrDmaBuf+"), count("regMrDmaBuf-"), count("regMr"));
        // The LL slots (host memory) see only the receives posted ahead
        // into them: every operation here runs Simple.
        let (moves, ll) = transfers(&log);
        assert!(ll.iter().all(|e| e.0 == "irecv"), "{ll:?}");
        let device = moves.iter().filter(|e| e.4).count();
        println!(
            "NCCL_DMABUF_ENABLE={enable}: {wrong} wrong; {live} regMrDmaBuf with a live dma-buf, \
             {dead} without, {plain} regMr; {} transfers, {device} of device memory",
            moves.len()
        );
        assert_eq!(wrong, 0);
        assert_eq!(dead, 0, "every dma-buf descriptor open and a dma-buf");
        assert!(!moves.is_empty());
        if gdr {
            // The LL slots (on the channels LL launches use) are host
            // memory, registered through regMr.
            assert!(
                live > 0 && plain > 0 && plain <= live,
                "every simple slot registered through regMrDmaBuf, every LL slot through regMr"
            );
            assert_eq!(device, moves.len(), "every transfer from/into GPU memory");
        } else {
            assert_eq!(live, 0);
            assert_eq!(device, 0, "host slots");
        }
    }
}
