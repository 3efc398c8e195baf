//! CUDA C programs compiled at run time: each is compiled once per GPU
//! architecture (see [`nvrtc`]), loaded once per device as a
//! module, its kernels looked up once, then launched.
//!
//! The runtime does not know what a program computes. Its owner (for
//! tensorcomm's own kernels, `cuda::kernels`) declares it as a `static`
//! [`Program`] with its source and kernel names, and launches a
//! [`Function`] with the arguments it lays out ([`KernelArg`]).

use std::ffi::{c_void, CString};
use std::marker::PhantomData;
use std::sync::OnceLock;

use cudarc::driver::{result, sys};

use super::context::Context;
use super::driver::{check, ensure_driver};
use super::nvrtc;
use super::stream::Stream;
use crate::{Error, Result};

/// Arguments one launch takes at most (kernels take a struct or two).
const MAX_ARGS: usize = 8;

/// CUDA C source compiled at run time: a name (for the disk cache and
/// error messages), the source, and the kernels (`extern "C" __global__`
/// functions) that callers launch. Declared as a `static`, so that its
/// module is built once per device for the whole process.
pub(crate) struct Program {
    name: &'static str,
    source: &'static str,
    kernels: &'static [&'static str],
    /// Per device ordinal: the loaded module, or why it could not be built
    /// (remembered, so a broken program fails every call the same way).
    modules: OnceLock<Box<[ModuleSlot]>>,
}

/// One device's module of a [`Program`], built on first use.
type ModuleSlot = OnceLock<std::result::Result<Module, LoadFailure>>;

/// Why a program could not be loaded, kept to rebuild the error each time.
enum LoadFailure {
    /// No NVRTC library: [`Error::NoCuda`] with this reason.
    NoCuda(String),
    /// Compiling, loading or a kernel lookup failed: [`Error::Nvrtc`].
    Failed(String),
}

impl Program {
    /// A program named `name` whose `source` defines `kernels`.
    pub(crate) const fn new(
        name: &'static str,
        source: &'static str,
        kernels: &'static [&'static str],
    ) -> Program {
        Program {
            name,
            source,
            kernels,
            modules: OnceLock::new(),
        }
    }

    /// The program's module on `ctx`'s GPU: compiled for its architecture
    /// (or read from the disk cache) and loaded on first use. A failure is
    /// remembered and returned by every later call.
    pub(crate) fn module(&self, ctx: &Context) -> Result<&Module> {
        let slots = self.modules.get_or_init(|| {
            // `ctx` exists, so the driver is loaded and this is its count.
            let count = ensure_driver().unwrap_or(0).max(ctx.ordinal() + 1);
            (0..count).map(|_| OnceLock::new()).collect()
        });
        let slot = slots.get(ctx.ordinal()).ok_or_else(|| Error::NoCuda {
            reason: format!("no GPU cuda:{}", ctx.ordinal()),
        })?;
        let loaded = slot.get_or_init(|| {
            Module::load(self, ctx).map_err(|e| match e {
                Error::NoCuda { reason } => LoadFailure::NoCuda(reason),
                other => LoadFailure::Failed(other.to_string()),
            })
        });
        loaded.as_ref().map_err(|failure| match failure {
            LoadFailure::NoCuda(reason) => Error::NoCuda {
                reason: reason.clone(),
            },
            LoadFailure::Failed(log) => Error::Nvrtc {
                kernel: self.name.into(),
                arch: ctx.arch(),
                log: log.clone(),
            },
        })
    }

    /// Compiles the program for `arch` (e.g. `sm_90`) without the disk
    /// cache or a device: for tests where only NVRTC is installed.
    #[cfg(test)]
    pub(crate) fn compile(&self, arch: &str) -> Result<Vec<u8>> {
        nvrtc::compile(self.name, self.source, arch)
    }
}

/// A program loaded on one device, with its kernels looked up.
pub(crate) struct Module {
    _handle: ModuleHandle,
    kernels: Vec<(&'static str, Function)>,
}

struct ModuleHandle(sys::CUmodule);
// SAFETY: a module handle is a context-wide handle, usable from any thread.
unsafe impl Send for ModuleHandle {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for ModuleHandle {}

/// A kernel of a loaded [`Module`], launched with [`Function::launch`].
#[derive(Clone, Copy)]
pub(crate) struct Function {
    handle: FunctionHandle,
    ordinal: usize,
}

#[derive(Clone, Copy)]
struct FunctionHandle(sys::CUfunction);
// SAFETY: a function handle is a context-wide handle, usable from any thread.
unsafe impl Send for FunctionHandle {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for FunctionHandle {}

impl Module {
    fn load(program: &Program, ctx: &Context) -> Result<Module> {
        let image = nvrtc::cubin(program.name, program.source, &ctx.arch())?;
        ctx.bind()?;
        // SAFETY: `image` is a complete CUBIN produced by NVRTC for this
        // device's architecture; the driver copies it during the call.
        let module = check("cuModuleLoadData", unsafe {
            result::module::load_data(image.as_ptr().cast())
        })?;
        let module = ModuleHandle(module);
        let get = |name: &'static str| -> Result<(&'static str, Function)> {
            let cname = CString::new(name).map_err(|_| Error::InvalidArgument(name.into()))?;
            // SAFETY: `module` is loaded and `cname` a valid C string.
            let handle = check("cuModuleGetFunction", unsafe {
                result::module::get_function(module.0, cname)
            })?;
            let function = Function {
                handle: FunctionHandle(handle),
                ordinal: ctx.ordinal(),
            };
            Ok((name, function))
        };
        let kernels = program
            .kernels
            .iter()
            .map(|&name| get(name))
            .collect::<Result<_>>()?;
        Ok(Module {
            _handle: module,
            kernels,
        })
    }

    /// The kernel `name`, one of those its [`Program`] declares.
    pub(crate) fn kernel(&self, name: &str) -> Result<Function> {
        self.kernels
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "no kernel {name:?} in the module: expected one of {:?}",
                    self.kernels.iter().map(|(n, _)| *n).collect::<Vec<_>>()
                ))
            })
    }
}

/// One argument of a launch: a value the kernel takes by value, borrowed
/// for the call (the driver copies its bytes when the kernel is queued).
#[derive(Clone, Copy)]
pub(crate) struct KernelArg<'a> {
    value: *const c_void,
    _borrow: PhantomData<&'a ()>,
}

impl<'a> KernelArg<'a> {
    /// Passes `value` (a `#[repr(C)]` mirror of the kernel's parameter).
    pub(crate) fn new<T: Copy>(value: &'a T) -> KernelArg<'a> {
        KernelArg {
            value: (value as *const T).cast(),
            _borrow: PhantomData,
        }
    }
}

impl Function {
    /// Queues the kernel on `stream` with `grid` blocks (at least one) of
    /// `block` threads.
    ///
    /// The caller's contract: `args` match the kernel's parameters in
    /// number, order and layout, and every device address inside them
    /// points into memory that the caller keeps alive until the stream has
    /// run the kernel, on this GPU or on one it has peer access to.
    pub(crate) fn launch(
        &self,
        stream: &Stream,
        grid: u32,
        block: u32,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        self.launch_with(stream, grid, block, args, false)
    }

    /// [`launch`](Self::launch); with `programmatic`, as a programmatic
    /// dependent launch (compute capability 9.0 and later): the kernel may
    /// be scheduled while the kernel before it on the stream still runs,
    /// once every block of that one has signalled
    /// (`griddepcontrol.launch_dependents`) or exited, so its own launch
    /// overlaps that kernel's work. The kernel must then
    /// wait (`griddepcontrol.wait`) before it touches memory that earlier
    /// work on the stream writes. The caller's contract is `launch`'s,
    /// plus that wait in the kernel, and `programmatic` only on a GPU of
    /// compute capability 9.0 or later.
    pub(crate) fn launch_with(
        &self,
        stream: &Stream,
        grid: u32,
        block: u32,
        args: &[KernelArg<'_>],
        programmatic: bool,
    ) -> Result<()> {
        if stream.device() != self.ordinal {
            return Err(Error::InvalidArgument(format!(
                "kernel launch: expected a stream on cuda:{}, found one on cuda:{}",
                self.ordinal,
                stream.device()
            )));
        }
        if args.len() > MAX_ARGS {
            return Err(Error::InvalidArgument(format!(
                "kernel launch: expected at most {MAX_ARGS} arguments, found {}",
                args.len()
            )));
        }
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (param, arg) in params.iter_mut().zip(args) {
            *param = arg.value.cast_mut();
        }
        stream.bind()?;
        if !programmatic {
            // SAFETY: the function belongs to a module loaded in the
            // context of the stream's device (checked above); each
            // parameter points at a live value of the type the kernel
            // declares (the #[repr(C)] mirrors the caller passes), borrowed
            // for the duration of this call (the driver copies parameters
            // at launch). The device addresses inside were taken from live
            // buffers that the caller keeps until the stream is
            // synchronised.
            return check("cuLaunchKernel", unsafe {
                result::launch_kernel(
                    self.handle.0,
                    (grid.max(1), 1, 1),
                    (block, 1, 1),
                    0,
                    stream.cu_stream(),
                    &mut params[..args.len()],
                )
            });
        }
        // SAFETY: a zeroed attribute is valid (its value a union of plain
        // integers); the id and the one field the id reads are set below.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.max(1),
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: as for cuLaunchKernel above; `config` and the attribute
        // it points to live until the call returns (the driver copies
        // them), and `params` starts with a pointer to each of the
        // kernel's parameters (its other slots are null and not read).
        super::driver::check_raw("cuLaunchKernelEx", unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.handle.0,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}
