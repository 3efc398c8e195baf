//! NVRTC: CUDA C source compiled at run time, once per GPU architecture,
//! with the binary cached on disk.
//!
//! The cache lives in `$TENSORCOMM_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/tensorcomm/kernels`, else `~/.cache/tensorcomm/kernels`.
//! A file's name holds a hash of the source, the architecture and the NVRTC
//! version, so a changed kernel or toolkit never loads a stale binary.

use std::ffi::CString;
use std::path::PathBuf;

use cudarc::nvrtc::{result, sys};

use crate::{Error, Result};

/// 64-bit FNV-1a: a hash that is the same on every run and platform.
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where compiled kernels are cached.
pub fn cache_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = env("TENSORCOMM_CACHE_DIR") {
        return dir;
    }
    if let Some(dir) = env("XDG_CACHE_HOME") {
        return dir.join("tensorcomm").join("kernels");
    }
    if let Some(home) = env("HOME") {
        return home.join(".cache").join("tensorcomm").join("kernels");
    }
    std::env::temp_dir().join("tensorcomm-kernels")
}

fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out-pointers; the library was checked to be present.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    r.result().map_err(|e| Error::Nvrtc {
        kernel: "nvrtcVersion".into(),
        arch: String::new(),
        log: format!("{e:?}"),
    })?;
    Ok((major, minor))
}

fn ensure_nvrtc() -> Result<()> {
    // SAFETY: only tries to open the shared library by name.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::NoCuda {
            reason: "the NVRTC library (libnvrtc) could not be loaded".into(),
        })
    }
}

/// The CUBIN of `source` for `arch` (e.g. `sm_90`), from the disk cache or
/// compiled now (and then cached).
pub(crate) fn cubin(name: &str, source: &str, arch: &str) -> Result<Vec<u8>> {
    ensure_nvrtc()?;
    let (major, minor) = nvrtc_version()?;
    let version = format!("{major}.{minor}");
    let key = fnv1a(&[source.as_bytes(), arch.as_bytes(), version.as_bytes()]);
    let dir = cache_dir();
    let path = dir.join(format!("{name}-{arch}-{key:016x}.cubin"));
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            tracing::debug!(path = %path.display(), "kernel cache hit");
            return Ok(bytes);
        }
    }
    let bytes = compile(name, source, arch)?;
    // A cache that cannot be written only costs a compile next time.
    let tmp = dir.join(format!(".{name}-{arch}-{key:016x}.{}", std::process::id()));
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&tmp, &bytes))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        tracing::debug!(dir = %dir.display(), error = %e, "could not write the kernel cache");
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(bytes)
}

/// Compiles `source` to a CUBIN for `arch` with NVRTC.
pub(crate) fn compile(name: &str, source: &str, arch: &str) -> Result<Vec<u8>> {
    ensure_nvrtc()?;
    let fail = |log: String| Error::Nvrtc {
        kernel: name.to_string(),
        arch: arch.to_string(),
        log,
    };
    let src = CString::new(source).map_err(|_| fail("the source contains a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| fail("the name contains a NUL byte".into()))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| fail(format!("{e:?}")))?;
    let opts = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
    ];
    // SAFETY: `prog` is a live program; the options are valid C strings.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    let out = match compiled {
        Ok(()) => get_cubin(prog).map_err(fail),
        Err(e) => {
            // SAFETY: `prog` is live; reading its log has no other effect.
            let log = unsafe { result::get_program_log(prog) }
                .map(|raw| {
                    let bytes: Vec<u8> = raw
                        .iter()
                        .map(|&c| c as u8)
                        .take_while(|&b| b != 0)
                        .collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                })
                .unwrap_or_default();
            Err(fail(format!("{e:?}: {log}")))
        }
    };
    // SAFETY: `prog` is destroyed once, after its last use.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

fn get_cubin(prog: sys::nvrtcProgram) -> std::result::Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is a valid out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))?;
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` has the `size` bytes NVRTC asked for.
    unsafe { sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))?;
    if bytes.is_empty() {
        return Err("NVRTC produced an empty CUBIN".into());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_is_stable_and_separates_parts() {
        assert_eq!(fnv1a(&[b"ab"]), fnv1a(&[b"ab"]));
        assert_ne!(fnv1a(&[b"a", b"b"]), fnv1a(&[b"ab"]));
        assert_ne!(fnv1a(&[b"src", b"sm_90"]), fnv1a(&[b"src", b"sm_80"]));
        // Pinned value: a changed hash would silently orphan every cache.
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
    }

    #[test]
    fn sources_compile_and_errors_carry_the_log_where_nvrtc_is_present() {
        if ensure_nvrtc().is_err() {
            crate::test_skipped("NVRTC is not installed on this machine");
            return;
        }
        let bin = compile(
            "store_one",
            "extern \"C\" __global__ void f(int* p) { *p = 1; }",
            "sm_90",
        )
        .unwrap();
        assert!(bin.starts_with(b"\x7fELF"), "a CUBIN is an ELF image");
        match compile(
            "broken",
            "extern \"C\" __global__ void f() { nope; }",
            "sm_90",
        ) {
            Err(Error::Nvrtc { kernel, arch, log }) => {
                assert_eq!((kernel.as_str(), arch.as_str()), ("broken", "sm_90"));
                assert!(log.contains("nope"), "{log}");
            }
            other => panic!("{other:?}"),
        }
    }
}
