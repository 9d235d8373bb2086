//! The attachments agent mode keeps: one file per (network, container ID,
//! interface) under the state directory, holding the last ADD result,
//! written atomically; and the locks that serialise everything that reads
//! or changes a network's attachments, GC included. Files and locks are
//! [`Dir`]'s: no link is followed inside the state directory, and taking a
//! lock creates nothing.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::cni::{self, is_object};
use crate::delegated::error::DelegatedError;
use crate::dir::{Dir, DirError};
use crate::sys::Lock;

/// Where attachments are kept when `ipam.stateDir` does not say.
pub const DEFAULT_DIR: &str = "/var/lib/cni/ipam-delegated";

/// A network's attachments, locked for as long as this lives.
#[derive(Debug)]
pub struct Network {
    /// The network's directory; its lock is the network's.
    dir: Dir,
}

/// One attachment: which container ID and interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub id: String,
    pub ifname: String,
}

impl Attachment {
    /// Its file's name: a ':' is in neither a container ID nor an
    /// interface name, so it separates them without ambiguity.
    fn file_name(&self) -> String {
        format!("{}:{}", self.id, self.ifname)
    }
}

/// What GC must keep of agent mode's state: the attachments kept for the
/// network, and a shared lock held while the delegates run, so that no
/// `ensure` allocates meanwhile.
#[derive(Debug)]
pub struct Kept {
    /// Every attachment kept for the network.
    pub attachments: Vec<Attachment>,
    // Held for its lock: the network's directory, or the nearest one
    // above it that exists; none where this user cannot read the state
    // directory, which no agent of this user can keep anything in either.
    _lock: Option<Dir>,
}

impl Network {
    /// Locks network `name`'s attachments under `root` for `ensure` or
    /// `release`, making the directories that are missing. Waits for any
    /// other holder, unless asked to stop.
    ///
    /// Each missing directory is made while the nearest existing one above
    /// it is locked: a GC that found no directory for the network holds
    /// that same lock, shared, until its delegates are done, so the first
    /// `ensure` of a network cannot allocate while such a GC runs. The
    /// network's own directory is always made under the state directory's
    /// lock, the state directory under its parent's.
    pub fn lock(root: &Path, name: &str) -> Result<Network, DelegatedError> {
        check_directory_name(name)?;
        let path = root.join(name);
        loop {
            if let Some(dir) = open_network(root, name)? {
                dir.lock(Lock::Exclusive, None)?;
                dir.keep_private().map_err(|e| files_error(&path, e))?;
                return Ok(Network { dir });
            }
            let above = Nearest::find(&path)?;
            above.dir.lock(Lock::Exclusive, None)?;
            if !above.still_missing() {
                // Made by someone else meanwhile: start again from there.
                continue;
            }
            if above.missing != path {
                // The state directory (or one above it) first; the
                // network's under the state directory's own lock, next time.
                Dir::open_made(root).map_err(|e| files_error(root, e))?;
                continue;
            }
            // Still holding the state directory's lock: no GC in between.
            let dir = above
                .dir
                .child_made(name)
                .map_err(|e| above.dir.error_at(name, e))?;
            dir.lock(Lock::Exclusive, None)?;
            return Ok(Network { dir });
        }
    }

    /// The stored result of `attachment`, if any. A file that is not a JSON
    /// object (a damaged disk, a hand edit) counts as none, said in a
    /// warning: a DEL without it still frees the attachment by its ID. A
    /// link or anything but a regular file is refused.
    pub fn read(&self, attachment: &Attachment) -> Result<Option<Vec<u8>>, DelegatedError> {
        let name = attachment.file_name();
        match self
            .dir
            .read(&name)
            .map_err(|e| self.dir.error_at(&name, e))?
        {
            Some(result) if is_object(&result) => Ok(Some(result)),
            Some(_) => {
                warn!(
                    "ignoring {}: not a JSON object",
                    self.dir.path().join(&name).display()
                );
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Stores `result` for `attachment`, whole: a crash leaves the old
    /// result or the new one, never half of one. On failure nothing of the
    /// new result is left, and no old one either: the caller gives the
    /// address back.
    pub fn write(&self, attachment: &Attachment, result: &[u8]) -> Result<(), DelegatedError> {
        let name = attachment.file_name();
        self.dir.replace(&name, result).map_err(|e| {
            let _ = self.dir.remove(&name);
            self.dir.error_at(&name, e).into()
        })
    }

    /// Every attachment kept for the network.
    pub fn attachments(&self) -> Result<Vec<Attachment>, DelegatedError> {
        list(&self.dir)
    }

    /// Another record of the network's (the Docker driver's pools), by a
    /// name without ':', which no attachment's file has.
    pub fn read_record(&self, name: &str) -> Result<Option<Vec<u8>>, DelegatedError> {
        debug_assert!(!name.contains(':'));
        self.dir
            .read(name)
            .map_err(|e| self.dir.error_at(name, e).into())
    }

    /// Stores record `name`, whole, as [`Self::write`] stores a result.
    pub fn write_record(&self, name: &str, content: &[u8]) -> Result<(), DelegatedError> {
        debug_assert!(!name.contains(':'));
        self.dir
            .replace(name, content)
            .map_err(|e| self.dir.error_at(name, e).into())
    }

    /// Removes record `name`, durably; removing one not there is no error.
    pub fn remove_record(&self, name: &str) -> Result<(), DelegatedError> {
        debug_assert!(!name.contains(':'));
        self.dir
            .remove(name)
            .map(drop)
            .map_err(|e| self.dir.error_at(name, e).into())
    }

    /// Forgets `attachment`, durably; forgetting one not kept is no error.
    pub fn remove(&self, attachment: &Attachment) -> Result<(), DelegatedError> {
        let name = attachment.file_name();
        self.dir
            .remove(&name)
            .map(drop)
            .map_err(|e| self.dir.error_at(&name, e).into())
    }
}

/// For GC: the attachments kept for network `name` under `root`, and a
/// shared lock to hold while the delegates run. Nothing is created: a
/// network with no directory has nothing kept, and its lock is the
/// nearest existing directory's above it (see [`Network::lock`]). Waits
/// no longer than `timeout` when given.
pub fn kept_for_gc(
    root: &Path,
    name: &str,
    timeout: Option<Duration>,
) -> Result<Kept, DelegatedError> {
    check_directory_name(name)?;
    let path = root.join(name);
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let found = open_network(root, name).and_then(|dir| match dir {
            Some(dir) => Ok(Ok(dir)),
            None => Nearest::find(&path).map(Err),
        });
        match found {
            Ok(Ok(dir)) => {
                dir.lock(Lock::Shared, deadline)?;
                return Ok(Kept {
                    attachments: list(&dir)?,
                    _lock: Some(dir),
                });
            }
            Ok(Err(above)) => {
                above.dir.lock(Lock::Shared, deadline)?;
                if above.still_missing() {
                    return Ok(Kept {
                        attachments: Vec::new(),
                        _lock: Some(above.dir),
                    });
                }
                // Made meanwhile: start again from there.
            }
            Err(DelegatedError::State(DirError::Io { error, .. }))
                if error.kind() == io::ErrorKind::PermissionDenied =>
            {
                return Ok(Kept {
                    attachments: Vec::new(),
                    _lock: None,
                })
            }
            Err(e) => return Err(e),
        }
    }
}

/// Refuses a network name that is not one plain path component. The
/// configuration's name was checked against the specification's rule,
/// which makes it one; checked again here, where it names a directory.
fn check_directory_name(name: &str) -> Result<(), DelegatedError> {
    if cni::is_identifier(name) {
        Ok(())
    } else {
        Err(cni::Error::InvalidConfig(format!(
            "network name {name:?} cannot name a state directory: it {}",
            cni::IDENTIFIER_RULE
        ))
        .into())
    }
}

/// The network's directory under `root` (a link there refused), or `None`
/// if it or `root` does not exist.
fn open_network(root: &Path, name: &str) -> Result<Option<Dir>, DelegatedError> {
    let root_dir = match Dir::open(root) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(files_error(root, e)),
    };
    root_dir
        .child(name)
        .map_err(|e| root_dir.error_at(name, e).into())
}

/// The nearest directory above the network's that exists, opened, and
/// the first one below it, on the way to the network's, that does not.
struct Nearest {
    dir: Dir,
    missing: PathBuf,
}

impl Nearest {
    fn find(network: &Path) -> Result<Nearest, DelegatedError> {
        let mut missing = network.to_path_buf();
        for path in network.ancestors().skip(1) {
            match Dir::open(path) {
                Ok(dir) => return Ok(Nearest { dir, missing }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => missing = path.to_path_buf(),
                Err(e) => return Err(files_error(path, e)),
            }
        }
        Err(files_error(network, io::ErrorKind::NotFound.into()))
    }

    /// Whether the missing directory is still missing: once the one above
    /// is locked, nothing of ours makes it.
    fn still_missing(&self) -> bool {
        matches!(std::fs::metadata(&self.missing), Err(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

/// The attachments in a network's directory, by their files' names.
fn list(dir: &Dir) -> Result<Vec<Attachment>, DelegatedError> {
    let names = dir.names().map_err(|e| dir.error(e))?;
    Ok(names
        .iter()
        .filter_map(|name| {
            let (id, ifname) = name.split_once(':')?;
            Some(Attachment {
                id: id.to_owned(),
                ifname: ifname.to_owned(),
            })
        })
        .collect())
}

fn files_error(path: &Path, error: io::Error) -> DelegatedError {
    DirError::io(path, error).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    /// A state directory not made yet, in a temporary directory.
    struct Root(tempfile::TempDir);

    impl Root {
        fn new() -> Root {
            Root(tempfile::tempdir().unwrap())
        }

        fn path(&self) -> PathBuf {
            self.0.path().join("state")
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
        let root = Root::new();
        let net = Network::lock(&root.path(), "agents").unwrap();
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
            list(&net.dir).unwrap(),
            [health.clone(), attachment("dns.cache", "net1.100")]
        );
        net.remove(&health).unwrap();
        net.remove(&health).unwrap();
        assert_eq!(
            list(&net.dir).unwrap(),
            [attachment("dns.cache", "net1.100")]
        );
    }

    #[test]
    fn gc_makes_nothing_and_finds_nothing_kept_for_a_new_network() {
        let root = Root::new();
        let kept = kept_for_gc(&root.path(), "agents", None).unwrap();
        assert!(kept.attachments.is_empty());
        assert!(!root.path().exists(), "GC made the state directory");
        drop(kept);
        fs::create_dir_all(root.path()).unwrap();
        assert!(kept_for_gc(&root.path(), "agents", None)
            .unwrap()
            .attachments
            .is_empty());
        assert!(!root.path().join("agents").exists());
        assert!(kept_for_gc(&root.path(), "../x", None).is_err());
    }

    #[test]
    fn gc_sees_what_is_kept_and_shares_the_lock() {
        let root = Root::new();
        let net = Network::lock(&root.path(), "agents").unwrap();
        net.write(&attachment("a", "eth0"), b"{}").unwrap();
        drop(net);
        let first = kept_for_gc(&root.path(), "agents", None).unwrap();
        let second = kept_for_gc(&root.path(), "agents", Some(Duration::ZERO)).unwrap();
        assert_eq!(first.attachments, [attachment("a", "eth0")]);
        assert_eq!(second.attachments, first.attachments);
    }

    #[test]
    fn waiting_for_the_lock_is_bounded_when_asked() {
        let root = Root::new();
        let _held = Network::lock(&root.path(), "agents").unwrap();
        let started = Instant::now();
        let e = kept_for_gc(&root.path(), "agents", Some(Duration::from_millis(100))).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            crate::cni::Reportable::code(&e),
            crate::cni::code::TRY_AGAIN_LATER
        );
    }

    #[test]
    fn the_first_ensure_of_a_network_waits_for_a_gc_that_found_nothing() {
        // With no state directory at all, and with one but no network's.
        for make_root in [false, true] {
            let root = Root::new();
            fs::create_dir_all(root.path().parent().unwrap()).unwrap();
            if make_root {
                fs::create_dir_all(root.path()).unwrap();
            }
            let gc = kept_for_gc(&root.path(), "agents", None).unwrap();
            assert!(gc.attachments.is_empty());
            // GC shares its lock with GC.
            assert!(kept_for_gc(&root.path(), "agents", Some(Duration::ZERO)).is_ok());
            let path = root.path().clone();
            let ensure = std::thread::spawn(move || Network::lock(&path, "agents").map(drop));
            std::thread::sleep(Duration::from_millis(300));
            assert!(!ensure.is_finished(), "ensure went ahead while GC ran");
            assert!(!root.path().join("agents").exists());
            drop(gc);
            ensure.join().unwrap().unwrap();
            assert!(root.path().join("agents").is_dir());
        }
    }

    #[test]
    fn a_damaged_state_file_counts_as_none() {
        let root = Root::new();
        let net = Network::lock(&root.path(), "agents").unwrap();
        let health = attachment("cilium-health", "eth0");
        for damaged in [&b""[..], b"{\"ips\":[", b"[1]"] {
            fs::write(root.path().join("agents/cilium-health:eth0"), damaged).unwrap();
            assert_eq!(net.read(&health).unwrap(), None, "{damaged:?}");
        }
    }

    #[test]
    fn links_in_the_state_directory_are_never_followed() {
        let root = Root::new();
        let net = Network::lock(&root.path(), "agents").unwrap();
        let health = attachment("cilium-health", "eth0");
        let target = root.path().join("target");
        fs::write(&target, "precious").unwrap();
        // A link at the temporary file's path: replaced, not written through.
        symlink(&target, root.path().join("agents/.cilium-health:eth0.tmp")).unwrap();
        net.write(&health, b"{}").unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
        // A state file that is a link: refused, its target untouched.
        fs::remove_file(root.path().join("agents/cilium-health:eth0")).unwrap();
        symlink(&target, root.path().join("agents/cilium-health:eth0")).unwrap();
        let e = net.read(&health).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // Writing replaces the link itself.
        net.write(&health, b"{\"ips\":[]}").unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
        assert_eq!(
            net.read(&health).unwrap().as_deref(),
            Some(&b"{\"ips\":[]}"[..])
        );
        // A network directory that is a link: refused.
        drop(net);
        fs::create_dir(root.path().join("elsewhere")).unwrap();
        symlink(root.path().join("elsewhere"), root.path().join("planted")).unwrap();
        let e = Network::lock(&root.path(), "planted").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(kept_for_gc(&root.path(), "planted", None).is_err());
    }

    #[test]
    fn names_that_are_not_one_path_component_are_refused() {
        let root = Root::new();
        for name in ["../x", "a/b", ".hidden", ""] {
            assert!(Network::lock(&root.path(), name).is_err(), "{name:?}");
        }
    }
}
