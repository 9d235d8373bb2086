//! The attachments agent mode keeps: one file per (network, container ID,
//! interface) under the state directory, holding the last ADD result,
//! written atomically; and the locks that serialise everything that reads
//! or changes a network's attachments, GC included.
//!
//! Inside the state directory nothing is opened by path: the network's
//! directory and every file in it are opened relative to a descriptor,
//! without following a symbolic link, so a link planted there cannot send
//! a write elsewhere. The locks are flock(2)s on directories, so taking one
//! creates nothing.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::cni::{self, is_object};
use crate::error::Error;
use crate::signals;
use crate::sys::{self, Lock};

/// How often a waiter for a lock tries again (a flock cannot be waited for
/// alongside the signalfd).
const LOCK_RETRY: Duration = Duration::from_millis(20);

/// Where attachments are kept when `ipam.stateDir` does not say.
pub const DEFAULT_DIR: &str = "/var/lib/cni/ipam-delegated";

/// A network's attachments, locked for as long as this lives.
#[derive(Debug)]
pub struct Network {
    /// The network's directory, opened without following a link; its
    /// flock is the network's lock, released when it closes.
    dir: File,
    /// Its path, for messages only.
    path: PathBuf,
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
    _lock: Option<File>,
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
    pub fn lock(root: &Path, name: &str) -> Result<Network, Error> {
        check_directory_name(name)?;
        let path = root.join(name);
        loop {
            if let Some(dir) = open_network(root, name)? {
                wait_for(&dir, Lock::Exclusive, &path, None)?;
                return Ok(Network { dir, path });
            }
            let above = Nearest::find(&path)?;
            wait_for(&above.dir, Lock::Exclusive, &above.path, None)?;
            if !above.still_missing() {
                // Made by someone else meanwhile: start again from there.
                continue;
            }
            if above.missing != path {
                // The state directory (or one above it) first; the
                // network's under the state directory's own lock, next time.
                create_dirs(root)?;
                continue;
            }
            match sys::mkdirat(&above.dir, name, 0o755) {
                Ok(()) => above.dir.sync_all().map_err(|e| io_error(root, e))?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_error(&path, e)),
            }
            // Still holding the state directory's lock: no GC in between.
            let dir = open_network(root, name)?
                .ok_or_else(|| io_error(&path, io::ErrorKind::NotFound.into()))?;
            wait_for(&dir, Lock::Exclusive, &path, None)?;
            return Ok(Network { dir, path });
        }
    }

    /// The stored result of `attachment`, if any. A file that is not a JSON
    /// object (a damaged disk, a hand edit) counts as none, said in a
    /// warning: a DEL without it still frees the attachment by its ID. A
    /// link or anything but a regular file is refused.
    pub fn read(&self, attachment: &Attachment) -> Result<Option<Vec<u8>>, Error> {
        let name = attachment.file_name();
        let path = self.path.join(&name);
        // Non-blocking, so that a FIFO planted there cannot hang the open.
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        let mut file = match sys::openat(&self.dir, &name, flags, 0) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(refused_or(&path, e)),
        };
        if !file.metadata().map_err(|e| io_error(&path, e))?.is_file() {
            return Err(Error::State {
                path,
                error: io::Error::other("not a regular file: refused"),
            });
        }
        let mut result = Vec::new();
        file.read_to_end(&mut result)
            .map_err(|e| io_error(&path, e))?;
        if is_object(&result) {
            Ok(Some(result))
        } else {
            warn!("ignoring {}: not a JSON object", path.display());
            Ok(None)
        }
    }

    /// Stores `result` for `attachment`: a new temporary file (never one
    /// that is there already, nor through a link), written and synced,
    /// then renamed over the old one and the directory synced, so a crash
    /// leaves the old result or the new one, never half of one. On failure
    /// nothing of the new result is left.
    pub fn write(&self, attachment: &Attachment, result: &[u8]) -> Result<(), Error> {
        let name = attachment.file_name();
        let path = self.path.join(&name);
        // Dot-files are not attachments: no container ID starts with a dot.
        let temporary = format!(".{name}.tmp");
        let written = self
            .create_new(&temporary)
            .and_then(|mut file| {
                file.write_all(result)?;
                file.sync_all()
            })
            .and_then(|()| sys::renameat(&self.dir, &temporary, &name))
            .and_then(|()| self.dir.sync_all());
        written.map_err(|e| {
            let _ = sys::unlinkat(&self.dir, &temporary);
            let _ = sys::unlinkat(&self.dir, &name);
            io_error(&path, e)
        })
    }

    /// A file of this name made anew. One left by a crash, or put there by
    /// someone else (a link included), is removed first, not opened.
    fn create_new(&self, name: &str) -> io::Result<File> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        match sys::openat(&self.dir, name, flags, 0o644) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                sys::unlinkat(&self.dir, name)?;
                sys::openat(&self.dir, name, flags, 0o644)
            }
            opened => opened,
        }
    }

    /// Forgets `attachment`, durably; forgetting one not kept is no error.
    pub fn remove(&self, attachment: &Attachment) -> Result<(), Error> {
        let name = attachment.file_name();
        match sys::unlinkat(&self.dir, &name) {
            Ok(()) => self.dir.sync_all().map_err(|e| io_error(&self.path, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&self.path.join(name), e)),
        }
    }
}

/// For GC: the attachments kept for network `name` under `root`, and a
/// shared lock to hold while the delegates run. Nothing is created: a
/// network with no directory has nothing kept, and its lock is the
/// nearest existing directory's above it (see [`Network::lock`]). Waits
/// no longer than `timeout` when given.
pub fn kept_for_gc(root: &Path, name: &str, timeout: Option<Duration>) -> Result<Kept, Error> {
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
                wait_for(&dir, Lock::Shared, &path, deadline)?;
                return Ok(Kept {
                    attachments: list(&dir, &path)?,
                    _lock: Some(dir),
                });
            }
            Ok(Err(above)) => {
                wait_for(&above.dir, Lock::Shared, &above.path, deadline)?;
                if above.still_missing() {
                    return Ok(Kept {
                        attachments: Vec::new(),
                        _lock: Some(above.dir),
                    });
                }
                // Made meanwhile: start again from there.
            }
            Err(Error::State { error, .. }) if error.kind() == io::ErrorKind::PermissionDenied => {
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
fn check_directory_name(name: &str) -> Result<(), Error> {
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

/// The network's directory under `root`, opened without following a link
/// (a link there is refused); `None` if it or `root` does not exist.
fn open_network(root: &Path, name: &str) -> Result<Option<File>, Error> {
    let path = root.join(name);
    let root_dir = match open_dir(root) {
        Ok(dir) => dir,
        Err(Error::State { error, .. }) if error.kind() == io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    match sys::openat(&root_dir, name, flags, 0) {
        Ok(dir) => Ok(Some(dir)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(refused_or(&path, e)),
    }
}

/// The nearest directory above the network's that exists, opened, and
/// the first one below it, on the way to the network's, that does not.
struct Nearest {
    dir: File,
    path: PathBuf,
    missing: PathBuf,
}

impl Nearest {
    fn find(network: &Path) -> Result<Nearest, Error> {
        let mut missing = network.to_path_buf();
        for dir in network.ancestors().skip(1) {
            match open_dir(dir) {
                Ok(file) => {
                    return Ok(Nearest {
                        dir: file,
                        path: dir.to_path_buf(),
                        missing,
                    })
                }
                Err(Error::State { error, .. }) if error.kind() == io::ErrorKind::NotFound => {
                    missing = dir.to_path_buf();
                }
                Err(e) => return Err(e),
            }
        }
        Err(io_error(network, io::ErrorKind::NotFound.into()))
    }

    /// Whether the missing directory is still missing: once the one above
    /// is locked, nothing of ours makes it.
    fn still_missing(&self) -> bool {
        matches!(fs::metadata(&self.missing), Err(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

/// Opens a directory by path: the state directory and those above it,
/// which are the operator's to place, links and all.
fn open_dir(dir: &Path) -> Result<File, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)
        .map_err(|e| io_error(dir, e))
}

/// Makes `dir` and any missing parent, each synced into its own parent so
/// that a crash cannot lose a directory a kept result was written into.
fn create_dirs(dir: &Path) -> Result<(), Error> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
    for made in missing.iter().rev() {
        if let Some(parent) = made.parent() {
            File::open(parent)
                .and_then(|p| p.sync_all())
                .map_err(|e| io_error(parent, e))?;
        }
    }
    Ok(())
}

/// Takes `lock` on directory `dir`, waiting for other holders, but not
/// past `deadline` (code 11) nor past a termination request (code 105).
fn wait_for(dir: &File, lock: Lock, path: &Path, deadline: Option<Instant>) -> Result<(), Error> {
    // Not a plain blocking flock: the plugin's termination signals are
    // blocked (it reads them from a signalfd), so a request to stop must
    // be looked for while waiting.
    let started = Instant::now();
    loop {
        if sys::try_flock(dir, lock).map_err(|e| io_error(path, e))? {
            return Ok(());
        }
        if let Some(signal) = signals::received(1) {
            return Err(Error::Interrupted {
                signal,
                during: "waiting for agent mode's lock",
            });
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::LockTimeout {
                path: path.to_owned(),
                waited: started.elapsed(),
            });
        }
        signals::wait(LOCK_RETRY);
    }
}

/// The attachments in network directory `dir`, by their files' names;
/// read through the descriptor, so it is that very directory.
fn list(dir: &File, path: &Path) -> Result<Vec<Attachment>, Error> {
    let by_descriptor = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let entries = fs::read_dir(by_descriptor).map_err(|e| io_error(path, e))?;
    let mut found: Vec<Attachment> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            // Dot-files are temporary files: no container ID starts with a dot.
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

/// An open with O_NOFOLLOW fails on a link where a file or directory of
/// ours should be (ELOOP, or ENOTDIR with O_DIRECTORY): said so. Anything
/// else as it is.
fn refused_or(path: &Path, error: io::Error) -> Error {
    let is_link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if is_link && matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) {
        Error::State {
            path: path.to_owned(),
            error: io::Error::other("a symbolic link: refused"),
        }
    } else {
        io_error(path, error)
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
            list(&net.dir, &net.path).unwrap(),
            [health.clone(), attachment("dns.cache", "net1.100")]
        );
        net.remove(&health).unwrap();
        net.remove(&health).unwrap();
        assert_eq!(
            list(&net.dir, &net.path).unwrap(),
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
        assert_eq!(e.code(), crate::error::code::TRY_AGAIN_LATER);
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
    fn a_fifo_in_place_of_a_state_file_is_refused_not_waited_on() {
        let root = Root::new();
        let net = Network::lock(&root.path(), "agents").unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(root.path().join("agents/x:eth0"))
            .status();
        assert!(made.unwrap().success());
        let e = net.read(&attachment("x", "eth0")).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn names_that_are_not_one_path_component_are_refused() {
        let root = Root::new();
        for name in ["../x", "a/b", ".hidden", ""] {
            assert!(Network::lock(&root.path(), name).is_err(), "{name:?}");
        }
    }
}
