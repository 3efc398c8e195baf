//! CUDA test helpers shared by the GPU test files: a kernel that keeps a
//! stream busy and then writes a buffer (to check stream ordering), a
//! copy kernel, and a GPU tensor together with its device address.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use tensorcomm::cuda::runtime::Stream;
use tensorcomm::tensor::Tensor;

/// A kernel that spins for `cycles` clock cycles, then fills `p` with `v`.
const SPIN: &str = r#"
extern "C" __global__ void spin_fill(float* p, int n, float v, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = v;
}
extern "C" __global__ void copy(float* dst, const float* src, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
"#;

pub struct Spin {
    module: Arc<cudarc::driver::CudaModule>,
}

impl Spin {
    pub fn load(stream: &Stream) -> Spin {
        let ptx = cudarc::nvrtc::compile_ptx(SPIN).unwrap();
        Spin {
            module: stream.cudarc().context().load_module(ptx).unwrap(),
        }
    }

    /// Queues on `stream`: spin about `ms` milliseconds, then fill.
    pub fn fill_after(&self, stream: &Stream, ptr: u64, n: usize, v: f32, ms: u64) {
        let f = self.module.load_function("spin_fill").unwrap();
        let cycles: i64 = ms as i64 * 2_000_000; // ~2 GHz
        let n = n as i32;
        let mut b = stream.cudarc().launch_builder(&f);
        b.arg(&ptr).arg(&n).arg(&v).arg(&cycles);
        unsafe { b.launch(LaunchConfig::for_num_elems(256)) }.unwrap();
    }

    pub fn copy(&self, stream: &Stream, dst: u64, src: u64, n: usize) {
        let f = self.module.load_function("copy").unwrap();
        let n = n as i32;
        let mut b = stream.cudarc().launch_builder(&f);
        b.arg(&dst).arg(&src).arg(&n);
        unsafe { b.launch(LaunchConfig::for_num_elems(256)) }.unwrap();
    }
}

/// A GPU f32 tensor of `n` zeros and its device address.
pub fn tensor_with_address(stream: &Stream, n: usize) -> (Tensor<'static>, u64) {
    let slice: CudaSlice<f32> = stream.cudarc().alloc_zeros(n).unwrap();
    let addr = {
        let (ptr, _record) = slice.device_ptr(stream.cudarc());
        ptr
    };
    stream.synchronize().unwrap();
    (Tensor::from_cuda_slice(slice, &[n]).unwrap(), addr)
}
