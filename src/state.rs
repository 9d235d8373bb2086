//! The attachments agent mode keeps: one file per (network, container ID,
//! interface) under the state directory, holding the last ADD result,
//! written atomically; and the lock that serialises everything that reads
//! or changes a network's attachments, GC included.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use tracing::warn;

use crate::environment;
use crate::error::Error;
use crate::json::is_object;
use crate::signals;

/// How often a waiter for a network's lock tries again (a flock cannot be
/// waited for alongside the signalfd).
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

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
    /// directory. Waits for any other holder, unless asked to stop.
    pub fn lock(root: &Path, name: &str) -> Result<Network, Error> {
        let dir = network_dir(root, name)?;
        create_dirs(&dir)?;
        Self::lock_dir(dir)
    }

    /// For GC: the network's lock, made if need be, so that no `ensure`
    /// can allocate while GC runs, even the first one for this network;
    /// `None` (nothing to keep safe) for a name agent mode refuses, or a
    /// state directory that cannot be made, which no agent can use either.
    pub fn lock_for_gc(root: &Path, name: &str) -> Result<Option<Network>, Error> {
        match network_dir(root, name) {
            Ok(dir) if create_dirs(&dir).is_ok() => Self::lock_dir(dir).map(Some),
            _ => Ok(None),
        }
    }

    fn lock_dir(dir: PathBuf) -> Result<Network, Error> {
        let path = dir.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_error(&path, e))?;
        // Not a plain blocking flock: the plugin's termination signals are
        // blocked (it reads them from a signalfd), so a request to stop
        // must be looked for while waiting.
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Network { dir, _lock: file });
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::WouldBlock
                && error.kind() != io::ErrorKind::Interrupted
            {
                return Err(io_error(&path, error));
            }
            if let Some(signal) = signals::received(1) {
                return Err(Error::Interrupted {
                    signal,
                    during: "waiting for agent mode's lock",
                });
            }
            signals::wait(LOCK_RETRY);
        }
    }

    /// The stored result of `attachment`, if any. A file that is not a JSON
    /// object (a damaged disk, a hand edit) counts as none, said in a
    /// warning: a DEL without it still frees the attachment by its ID.
    pub fn read(&self, attachment: &Attachment) -> Result<Option<Vec<u8>>, Error> {
        let path = self.path(attachment);
        match fs::read(&path) {
            Ok(result) if is_object(&result) => Ok(Some(result)),
            Ok(_) => {
                warn!("ignoring {}: not a JSON object", path.display());
                Ok(None)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(&path, e)),
        }
    }

    /// Stores `result` for `attachment`: a temporary file, written and
    /// synced, then renamed over the old one and the directory synced, so
    /// a crash leaves the old result or the new one, never half of one. On
    /// failure nothing of the new result is left.
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
            .and_then(|()| sync_dir(&self.dir));
        written.map_err(|e| {
            let _ = fs::remove_file(&temporary);
            let _ = fs::remove_file(&path);
            io_error(&path, e)
        })
    }

    /// Forgets `attachment`, durably; forgetting one not kept is no error.
    pub fn remove(&self, attachment: &Attachment) -> Result<(), Error> {
        let path = self.path(attachment);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir).map_err(|e| io_error(&self.dir, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&path, e)),
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

/// The network's own directory. Its name is one path component: the
/// configuration's name was checked against the specification's rule.
fn network_dir(root: &Path, name: &str) -> Result<PathBuf, Error> {
    if environment::is_identifier(name) {
        Ok(root.join(name))
    } else {
        Err(Error::InvalidConfig(format!(
            "network name {name:?} cannot name a state directory: it {}",
            environment::IDENTIFIER_RULE
        )))
    }
}

/// Makes `dir` and any missing parent, each synced into its own parent so
/// that a crash cannot lose a directory a kept result was written into.
fn create_dirs(dir: &Path) -> Result<(), Error> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
    for made in missing.iter().rev() {
        if let Some(parent) = made.parent() {
            sync_dir(parent).map_err(|e| io_error(parent, e))?;
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
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
    fn gc_locks_every_network_agent_mode_could_use() {
        let root = Root::new("gc");
        assert!(Network::lock_for_gc(&root.0, "agents").unwrap().is_some());
        assert!(root.0.join("agents/.lock").exists());
        assert!(Network::lock_for_gc(&root.0, "../x").unwrap().is_none());
    }

    #[test]
    fn a_damaged_state_file_counts_as_none() {
        let root = Root::new("damaged");
        let net = Network::lock(&root.0, "agents").unwrap();
        let health = attachment("cilium-health", "eth0");
        for damaged in [&b""[..], b"{\"ips\":[", b"[1]"] {
            fs::write(root.0.join("agents/cilium-health:eth0"), damaged).unwrap();
            assert_eq!(net.read(&health).unwrap(), None, "{damaged:?}");
        }
    }

    #[test]
    fn names_that_are_not_one_path_component_are_refused() {
        let root = Root::new("names");
        for name in ["../x", "a/b", ".hidden", ""] {
            assert!(Network::lock(&root.0, name).is_err(), "{name:?}");
        }
    }
}
