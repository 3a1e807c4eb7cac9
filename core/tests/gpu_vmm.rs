//! ncclMemAlloc's memory (the CUDA virtual memory API): sizes rounded up
//! to the granularity, the memory exported as a file descriptor and mapped
//! a second time from it, both mappings seeing the same bytes, and freed.
//! Skips, saying so, without a GPU or where the GPU has no virtual memory
//! management.

mod gpu_common;

use oxccl::cuda::vmm::{granularity, is_vmm, vmm_alloc, vmm_bytes, vmm_export, vmm_free};
use oxccl::cuda::vmm::{vmm_supported, VmmImport};
use oxccl::cuda::{read_raw, Context, Device, FillPattern, KernelSet, RawStream};
use oxccl::DataType;

#[test]
fn memory_from_the_virtual_memory_api_maps_again_from_its_handle() {
    let Some(_gpu) = gpu_common::gpus(1) else {
        return;
    };
    let dev = Device::get(0).unwrap();
    if !vmm_supported(&dev).unwrap() {
        println!("skipped: GPU 0 has no virtual memory management");
        return;
    }
    let ctx = Context::primary(Device::get(0).unwrap()).unwrap();
    ctx.bind().unwrap();
    let gran = granularity(&dev).unwrap();
    let bytes = 3 * gran + 5;
    let p = vmm_alloc(0, bytes).unwrap();
    assert!(is_vmm(p));
    assert_eq!(
        vmm_bytes(p),
        Some(4 * gran),
        "rounded up to the granularity"
    );
    let kernels = KernelSet::new(&ctx).unwrap();
    let pattern = FillPattern {
        seed: 7,
        modulus: 251,
        offset: 0,
    };
    let count = bytes / 4;
    kernels
        .fill(p, count, DataType::Float32, pattern, RawStream::DEFAULT)
        .unwrap();
    ctx.synchronize().unwrap();
    let (fd, size, device) = vmm_export(p).unwrap();
    assert_eq!((size, device), (4 * gran, 0));
    let again = VmmImport::new(&fd, size, 0).unwrap();
    assert_ne!(again.ptr(), p);
    let mut a = vec![0u8; count * 4];
    let mut b = vec![1u8; count * 4];
    // SAFETY: both ranges are mapped device memory of this context.
    unsafe {
        read_raw(p, &mut a).unwrap();
        read_raw(again.ptr(), &mut b).unwrap();
    }
    assert!(a.iter().any(|&x| x != 0), "the fill wrote something");
    assert_eq!(a, b, "both mappings see the same memory");
    drop(again);
    // SAFETY: nothing is queued on the memory.
    assert!(unsafe { vmm_free(p) }.unwrap());
    assert!(!is_vmm(p));
    // SAFETY: as above; freeing twice is refused, not a crash.
    assert!(!unsafe { vmm_free(p) }.unwrap());
    assert!(vmm_export(p).is_err());
    println!("vmm: {bytes} bytes -> {size} (granularity {gran}), exported and mapped again");
}
