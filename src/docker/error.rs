//! How the Docker driver fails a request: one it cannot serve as Docker
//! put it, an address it cannot give; and what it meets on its way: the
//! stack it runs (ipam-delegated's agent mode), the configuration files
//! it serves, its socket and records. Each knows its CNI code, which
//! Docker is told.

use crate::cni::{code, Reportable};
use crate::delegated::DelegatedError;
use crate::dir::DirError;
use crate::netd::ConfigFileError;

/// A request the Docker driver cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// Not as the driver can serve it, as Docker put it.
    #[error("{0}")]
    Request(String),

    /// The address asked for cannot be given from the pool.
    #[error("{address} cannot be given from pool {pool:?}: {why}")]
    AddressUnavailable {
        address: String,
        pool: String,
        why: String,
    },

    /// The stack, or agent mode's state that keeps what it gave.
    #[error(transparent)]
    Stack(#[from] DelegatedError),

    /// The configurations it serves.
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),

    /// Its socket, or a file it reads.
    #[error(transparent)]
    Files(#[from] DirError),
}

impl Reportable for DockerError {
    fn code(&self) -> u32 {
        match self {
            DockerError::Request(_) => code::INVALID_CONFIG,
            DockerError::AddressUnavailable { .. } => code::ADDRESS_UNAVAILABLE,
            DockerError::Stack(e) => e.code(),
            DockerError::ConfigFile(e) => e.code(),
            DockerError::Files(e) => e.code(),
        }
    }

    fn details(&self) -> String {
        match self {
            DockerError::Stack(e) => e.details(),
            _ => String::new(),
        }
    }

    fn summary(&self) -> String {
        match self {
            DockerError::Stack(e) => e.summary(),
            other => other.to_string(),
        }
    }
}

/// What Docker is told when a request fails: the error's one-line summary
/// (naming a delegate that failed), its CNI code, and its details.
pub fn message(e: &impl Reportable) -> String {
    let details = e.details();
    let mut text = format!("{} (CNI error code {})", e.summary(), e.code());
    if !details.is_empty() {
        text.push_str(": ");
        text.push_str(&details.replace('\n', " "));
    }
    text
}
