//! Where a tensor's memory lives, and moving a tensor there.

use std::fmt;
use std::str::FromStr;

use super::dense::Tensor;
use crate::{Error, Result};

impl Tensor<'static> {
    /// This tensor on `device`: itself when it is already there, else a
    /// copy there ([`Tensor::to_device`]). [`Error::NoCuda`] for a GPU
    /// when tensorcomm was built without its `cuda` feature.
    ///
    /// ```
    /// use tensorcomm::tensor::{Device, Tensor};
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// let same = t.clone().into_device(Device::Cpu)?;
    /// assert!(same.shares_storage(&t));
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn into_device(self, device: Device) -> Result<Tensor<'static>> {
        if self.device() == device {
            return Ok(self);
        }
        #[cfg(feature = "cuda")]
        {
            self.to_device(device)
        }
        #[cfg(not(feature = "cuda"))]
        Err(Error::NoCuda {
            reason: "tensorcomm was built without its `cuda` feature".into(),
        })
    }
}

/// The device holding a tensor's storage: host memory or one CUDA GPU.
///
/// Written and parsed the way PyTorch spells devices: `"cpu"`, `"cuda:1"`.
/// A bare `"cuda"` parses as GPU 0.
///
/// ```
/// use tensorcomm::tensor::Device;
///
/// assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
/// assert_eq!("cpu".parse::<Device>()?, Device::Cpu);
/// assert_eq!("cuda".parse::<Device>()?, Device::Cuda(0));
/// assert_eq!("cuda:3".parse::<Device>()?, Device::Cuda(3));
/// assert!("cuda:x".parse::<Device>().is_err());
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// The CUDA GPU with this ordinal.
    Cuda(usize),
}

impl Device {
    /// True for [`Device::Cuda`].
    ///
    /// ```
    /// use tensorcomm::tensor::Device;
    /// assert!(Device::Cuda(0).is_cuda());
    /// assert!(!Device::Cpu.is_cuda());
    /// ```
    pub const fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// True for [`Device::Cpu`].
    ///
    /// ```
    /// use tensorcomm::tensor::Device;
    /// assert!(Device::Cpu.is_cpu());
    /// ```
    pub const fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::BadValue {
            name: "device".into(),
            expected: "\"cpu\", \"cuda\" or \"cuda:N\" with N a GPU ordinal".into(),
            found: s.into(),
        };
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            other => {
                let ordinal = other.strip_prefix("cuda:").ok_or_else(bad)?;
                if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                ordinal
                    .parse::<usize>()
                    .map(Device::Cuda)
                    .map_err(|_| bad())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        for device in [Device::Cpu, Device::Cuda(0), Device::Cuda(7)] {
            assert_eq!(device.to_string().parse::<Device>().unwrap(), device);
        }
        assert_eq!("CUDA:2".parse::<Device>().unwrap(), Device::Cuda(2));
    }

    #[test]
    fn bad_devices_are_bad_values_naming_the_input() {
        for bad in [
            "", "gpu", "cuda:", "cuda:-1", "cuda:+1", "cuda:1:2", "cpu:0",
        ] {
            match bad.parse::<Device>() {
                Err(Error::BadValue { name, found, .. }) => {
                    assert_eq!(name, "device");
                    assert_eq!(found, bad);
                }
                other => panic!("{bad:?} parsed as {other:?}"),
            }
        }
    }
}
