//! The attachments agent mode keeps: one file per (network, container ID,
//! interface) under the state directory, holding the last ADD result,
//! written atomically; and the lock that serialises everything that reads
//! or changes a network's attachments, GC included.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// Where attachments are kept when `ipam.stateDir` does not say.
pub const DEFAULT_DIR: &str = "/var/lib/cni/ipam-delegated";

/// A network's attachments, locked for as long as this lives.
#[derive(Debug)]
pub struct Network {
    dir: PathBuf,
    // Held for its lock; closing it releases the lock.
    _lock: File,
}

/// One attachment: which container ID and interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// Its container ID.
    pub id: String,
    /// Its interface name.
    pub ifname: String,
}

impl Network {
    /// Locks network `name`'s attachments under `root`, creating the
    /// directory. Waits for any other holder.
    pub fn lock(root: &Path, name: &str) -> Result<Network, Error> {
        let dir = network_dir(root, name)?;
        fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
        Self::lock_dir(dir)
    }

    /// Locks network `name`'s attachments if any were ever kept; `None`
    /// when its directory does not exist (nothing to keep safe).
    pub fn lock_existing(root: &Path, name: &str) -> Result<Option<Network>, Error> {
        let Ok(dir) = network_dir(root, name) else {
            // A name agent mode refuses can have no attachments.
            return Ok(None);
        };
        if !dir.is_dir() {
            return Ok(None);
        }
        Self::lock_dir(dir).map(Some)
    }

    fn lock_dir(dir: PathBuf) -> Result<Network, Error> {
        let path = dir.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_error(&path, e))?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                break;
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(io_error(&path, error));
            }
        }
        Ok(Network { dir, _lock: file })
    }

    /// The stored result of `attachment`, if any.
    pub fn read(&self, attachment: &Attachment) -> Result<Option<Vec<u8>>, Error> {
        let path = self.path(attachment);
        match fs::read(&path) {
            Ok(result) => Ok(Some(result)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(&path, e)),
        }
    }

    /// Stores `result` for `attachment`: a temporary file, written and
    /// synced, then renamed over the old one, so a crash leaves the old
    /// result or the new one, never half of one.
    pub fn write(&self, attachment: &Attachment, result: &[u8]) -> Result<(), Error> {
        let path = self.path(attachment);
        let temporary = self
            .dir
            .join(format!(".{}:{}.tmp", attachment.id, attachment.ifname));
        let written = File::create(&temporary)
            .and_then(|mut file| {
                file.write_all(result)?;
                file.sync_all()
            })
            .and_then(|()| fs::rename(&temporary, &path))
            .and_then(|()| File::open(&self.dir)?.sync_all());
        written.map_err(|e| io_error(&path, e))
    }

    /// Forgets `attachment`; forgetting one not kept is no error.
    pub fn remove(&self, attachment: &Attachment) -> Result<(), Error> {
        let path = self.path(attachment);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error(&path, e)),
            _ => Ok(()),
        }
    }

    /// Every attachment kept for this network.
    pub fn attachments(&self) -> Result<Vec<Attachment>, Error> {
        let entries = fs::read_dir(&self.dir).map_err(|e| io_error(&self.dir, e))?;
        let mut found: Vec<Attachment> = entries
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                // Dot-files are the lock and temporary files: no container
                // ID starts with a dot.
                if name.starts_with('.') {
                    return None;
                }
                let (id, ifname) = name.split_once(':')?;
                Some(Attachment {
                    id: id.to_owned(),
                    ifname: ifname.to_owned(),
                })
            })
            .collect();
        found.sort_by(|a, b| (&a.id, &a.ifname).cmp(&(&b.id, &b.ifname)));
        Ok(found)
    }

    /// A ':' is in neither a container ID nor an interface name, so it
    /// separates them without ambiguity.
    fn path(&self, attachment: &Attachment) -> PathBuf {
        self.dir
            .join(format!("{}:{}", attachment.id, attachment.ifname))
    }
}

/// The network's own directory; its name must be one path component, as
/// the specification's rule for network names (1.0 and later) makes it.
fn network_dir(root: &Path, name: &str) -> Result<PathBuf, Error> {
    let plain = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if plain {
        Ok(root.join(name))
    } else {
        Err(Error::InvalidConfig(format!(
            "network name {name:?} cannot name a state directory: agent mode needs a name of letters, digits, '_', '.' and '-'"
        )))
    }
}

fn io_error(path: &Path, error: io::Error) -> Error {
    Error::State {
        path: path.to_owned(),
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Root(PathBuf);

    impl Root {
        fn new(tag: &str) -> Root {
            let path = std::env::temp_dir()
                .join(format!("ipam-delegated-state-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&path);
            Root(path)
        }
    }

    impl Drop for Root {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn attachment(id: &str, ifname: &str) -> Attachment {
        Attachment {
            id: id.into(),
            ifname: ifname.into(),
        }
    }

    #[test]
    fn results_are_kept_read_listed_and_removed() {
        let root = Root::new("kept");
        let net = Network::lock(&root.0, "agents").unwrap();
        let health = attachment("cilium-health", "eth0");
        assert_eq!(net.read(&health).unwrap(), None);
        net.write(&health, b"{\"ips\":[]}").unwrap();
        net.write(&attachment("dns.cache", "net1.100"), b"{}")
            .unwrap();
        assert_eq!(
            net.read(&health).unwrap().as_deref(),
            Some(&b"{\"ips\":[]}"[..])
        );
        assert_eq!(
            net.attachments().unwrap(),
            [health.clone(), attachment("dns.cache", "net1.100")]
        );
        net.remove(&health).unwrap();
        net.remove(&health).unwrap();
        assert_eq!(
            net.attachments().unwrap(),
            [attachment("dns.cache", "net1.100")]
        );
    }

    #[test]
    fn a_network_never_used_has_nothing_to_lock() {
        let root = Root::new("unused");
        assert!(Network::lock_existing(&root.0, "agents").unwrap().is_none());
        assert!(Network::lock_existing(&root.0, "../x").unwrap().is_none());
    }

    #[test]
    fn names_that_are_not_one_path_component_are_refused() {
        let root = Root::new("names");
        for name in ["../x", "a/b", ".hidden", ""] {
            assert!(Network::lock(&root.0, name).is_err(), "{name:?}");
        }
    }
}
