//! A directory the plugins keep records in: opened once, everything in it
//! reached through its descriptor and never through a symbolic link, each
//! file written whole or not at all, and the directory itself the lock
//! (a flock) over what is in it, so that taking it creates nothing; and
//! how using records fails ([`DirError`]).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cni::{code, Reportable};
use crate::signals::{self, Interrupted};
use crate::sys::{self, Lock};

/// How records kept in files fail: a file or directory that cannot be
/// read or written (or is not what it should be), or a lock not taken.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// A file or directory could not be read or written, or is not what
    /// it should be.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        #[source]
        error: io::Error,
    },

    /// A lock was held past the time the configuration allows.
    #[error("the lock on {} is still held after {waited:?}: try again later", path.display())]
    LockTimeout {
        /// The directory locked.
        path: PathBuf,
        /// How long the plugin waited.
        waited: Duration,
    },

    /// A termination request came while the plugin waited for a lock.
    #[error(transparent)]
    Interrupted(#[from] Interrupted),
}

impl DirError {
    /// `error` on `path`.
    pub fn io(path: &Path, error: io::Error) -> DirError {
        DirError::Io {
            path: path.to_owned(),
            error,
        }
    }

    /// Whether it says "not now" rather than "no": a lock that stayed
    /// held, or a termination request.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            DirError::LockTimeout { .. } | DirError::Interrupted(_)
        )
    }
}

impl Reportable for DirError {
    fn code(&self) -> u32 {
        match self {
            DirError::Io { .. } => code::IO_FAILURE,
            DirError::LockTimeout { .. } => code::TRY_AGAIN_LATER,
            DirError::Interrupted(e) => e.code(),
        }
    }
}

/// How often a waiter for a lock tries again (a flock cannot be waited for
/// alongside the signalfd).
const LOCK_RETRY: Duration = Duration::from_millis(20);

/// The mode of a directory made here: records name pods and namespaces,
/// which are no other user's business (a record that is a symbolic link
/// has no mode of its own: its directory keeps it).
const PRIVATE_DIR: libc::mode_t = 0o700;

/// The mode of a file written here.
const PRIVATE_FILE: libc::mode_t = 0o600;

/// An open directory.
#[derive(Debug)]
pub struct Dir {
    file: File,
    path: PathBuf,
    durable: bool,
}

/// How far a directory's changes are pushed to the disk. A file is always
/// whole or absent, crash or not: its content is synced before its name
/// appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Each change is synced into the directory before it returns, so that
    /// it outlives a power loss.
    Durable,
    /// Changes reach the disk in the order they were made, with the
    /// filesystem's journal, but a power loss may undo the last ones: for
    /// records that no longer matter after the machine restarts (the
    /// containers they were for are gone). A record made with
    /// [`Dir::create`] is a symbolic link whose target is its content: the
    /// journal makes it whole in one step, with no data of its own to sync
    /// (a file must be synced before it is linked into place, or a crash
    /// can leave it empty), which halves an allocation's time on disk.
    Ordered,
}

impl Dir {
    /// Opens the directory at `path`, following links: a configured
    /// directory, and those above it, are the operator's to place.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(path)?;
        Ok(Dir {
            file,
            path: path.to_owned(),
            durable: true,
        })
    }

    /// This directory, and those reached through it, with `durability`.
    pub fn with_durability(mut self, durability: Durability) -> Dir {
        self.durable = durability == Durability::Durable;
        self
    }

    /// Opens the directory at `path`, making it (private: 0700) and any
    /// missing parent (0755) as [`make_all`] does, each synced into its
    /// own parent so that a crash cannot lose a directory a record was
    /// written into.
    pub fn open_made(path: &Path) -> io::Result<Dir> {
        for made in make_all(path, PRIVATE_DIR)? {
            if let Some(parent) = made.parent() {
                Dir::open(parent)?.sync()?;
            }
        }
        Dir::open(path)
    }

    /// Takes from the group and others any access to this directory (one
    /// made by an earlier version, with 0755): for the records in it.
    pub fn keep_private(&self) -> io::Result<()> {
        let mode = self.file.metadata()?.permissions().mode();
        if mode & 0o077 != 0 {
            self.file
                .set_permissions(fs::Permissions::from_mode(mode & 0o700))?;
        }
        Ok(())
    }

    /// Where the directory is, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory `name` in this one, or `None` if there is none. A
    /// link there is refused.
    pub fn child(&self, name: &str) -> io::Result<Option<Dir>> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        match sys::openat(&self.file, name, flags, 0) {
            Ok(file) => Ok(Some(Dir {
                file,
                path: self.path.join(name),
                durable: self.durable,
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.refused_or(name, e)),
        }
    }

    /// The directory `name` in this one, made (and synced into this one)
    /// if it is missing.
    pub fn child_made(&self, name: &str) -> io::Result<Dir> {
        // Opened first: it is there on every call but the first.
        if let Some(child) = self.child(name)? {
            return Ok(child);
        }
        let made = match sys::mkdirat(&self.file, name, PRIVATE_DIR) {
            Ok(()) => self.sync().map(|()| true)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(e),
        };
        let child = self
            .child(name)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{name} vanished")))?;
        if made {
            // Exactly private, whatever the umask narrowed it to.
            child
                .file
                .set_permissions(fs::Permissions::from_mode(PRIVATE_DIR))?;
        }
        Ok(child)
    }

    /// The content of file `name`, or `None` if there is none. Anything
    /// but a regular file (a FIFO cannot hang the open) is refused, and a
    /// link too, unless the directory is [`Durability::Ordered`], where a
    /// link is a record: its content is its target, never followed.
    pub fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        if !self.durable {
            match sys::readlinkat(&self.file, name) {
                Ok(record) => return Ok(Some(record)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                // Not a link: a file (a hint, a marker), read as such.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(e),
            }
        }
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        let mut file = match sys::openat(&self.file, name, flags, 0) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.refused_or(name, e)),
        };
        if !file.metadata()?.is_file() {
            return Err(io::Error::other("not a regular file: refused"));
        }
        let mut content = Vec::new();
        file.read_to_end(&mut content)?;
        Ok(Some(content))
    }

    /// Whether anything is named `name` here (a link counts).
    pub fn contains(&self, name: &str) -> io::Result<bool> {
        sys::exists_at(&self.file, name)
    }

    /// Writes file `name` whole, replacing what was there: a new temporary
    /// file, synced, renamed over the old one (and the directory synced,
    /// if durable), so that a crash leaves the old content or the new,
    /// never half of one.
    pub fn replace(&self, name: &str, content: &[u8]) -> io::Result<()> {
        self.rename_into(name, content)
    }

    /// Writes `content` as file `name` (made if missing), in place and
    /// syncing nothing, with no new name to journal: for what a crash may
    /// garble at no cost but a longer look (a hint). Anything but a regular
    /// file there is refused (a FIFO cannot hang the open).
    pub fn overwrite(&self, name: &str, content: &[u8]) -> io::Result<()> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        let file = sys::openat(&self.file, name, flags, PRIVATE_FILE)
            .map_err(|e| self.refused_or(name, e))?;
        let before = file.metadata()?;
        if !before.is_file() {
            return Err(io::Error::other("not a regular file: refused"));
        }
        file.write_all_at(content, 0)?;
        // Usually one width per name; a longer old content loses its tail.
        let written = content.len() as u64;
        if before.len() > written {
            file.set_len(written)?;
        }
        Ok(())
    }

    fn rename_into(&self, name: &str, content: &[u8]) -> io::Result<()> {
        let temporary = self.write_temporary(&temporary_name(name, ""), content)?;
        let renamed = sys::renameat(&self.file, &temporary, name).and_then(|()| self.sync_change());
        if renamed.is_err() {
            let _ = sys::unlinkat(&self.file, &temporary);
        }
        renamed
    }

    /// Writes record `name` whole if there is none yet: `Ok(false)`, and
    /// nothing changed, if there is. A crash leaves the record whole or
    /// absent, never empty or half written: in an ordered directory a
    /// symbolic link whose target is `content`; in a durable one, or for
    /// content that cannot be a link's target, a file, synced before it is
    /// linked into place.
    pub fn create(&self, name: &str, content: &[u8]) -> io::Result<bool> {
        self.create_as(name, content, "")
    }

    /// As [`Dir::create`], for writer `writer`: a durable directory's
    /// temporary file is its own (`.NAME.WRITER.tmp`), so that writers
    /// that may race for one record without a lock, each with a name of
    /// its own (the node name's pins), never write into each other's.
    pub fn create_as(&self, name: &str, content: &[u8], writer: &str) -> io::Result<bool> {
        if !self.durable {
            match self.create_link(name, content) {
                Err(e) if cannot_be_link(&e) => {}
                made => return made,
            }
        }
        self.create_file(name, content, self.durable, writer)
    }

    /// As [`Dir::create`] in a durable directory, whatever this one's
    /// durability: a file, synced before it is linked into place, and the
    /// directory synced after, for a record that must outlive a power
    /// loss among records that need not.
    pub fn create_synced(&self, name: &str, content: &[u8]) -> io::Result<bool> {
        self.create_file(name, content, true, "")
    }

    /// Record `name` as a file, synced before it is linked into place
    /// (written first as `writer`'s temporary file); the directory synced
    /// after if `sync`.
    fn create_file(
        &self,
        name: &str,
        content: &[u8],
        sync: bool,
        writer: &str,
    ) -> io::Result<bool> {
        let temporary = self.write_temporary(&temporary_name(name, writer), content)?;
        let linked = sys::linkat(&self.file, &temporary, name);
        let _ = sys::unlinkat(&self.file, &temporary);
        match linked {
            Ok(()) if sync => self.sync().map(|()| true),
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes record `name` whole, replacing what was there, in one step:
    /// in an ordered directory a symbolic link whose target is `content`,
    /// made under a temporary name and renamed over the old record (nothing
    /// to sync); otherwise, or for content that cannot be a link's target,
    /// a file, as [`Dir::replace`] writes it. Read as [`Dir::create`]'s.
    pub fn replace_record(&self, name: &str, content: &[u8]) -> io::Result<()> {
        if !self.durable {
            let temporary = format!(".{name}.tmp");
            match sys::unlinkat(&self.file, &temporary) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            match self.create_link(&temporary, content) {
                Err(e) if cannot_be_link(&e) => {}
                Err(e) => return Err(e),
                Ok(_) => {
                    let renamed = sys::renameat(&self.file, &temporary, name);
                    if renamed.is_err() {
                        let _ = sys::unlinkat(&self.file, &temporary);
                    }
                    return renamed;
                }
            }
        }
        self.rename_into(name, content)
    }

    /// Record `name` as a symbolic link whose target is `content`, made in
    /// one step with it: nothing to sync.
    fn create_link(&self, name: &str, content: &[u8]) -> io::Result<bool> {
        if content.is_empty() || content.len() >= libc::PATH_MAX as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a record of {} bytes cannot be a link", content.len()),
            ));
        }
        match sys::symlinkat(content, &self.file, name) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes file `name` (durably, if the directory is): `Ok(false)` if
    /// there was none.
    pub fn remove(&self, name: &str) -> io::Result<bool> {
        match sys::unlinkat(&self.file, name) {
            Ok(()) => self.sync_change().map(|()| true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// How long ago entry `name` (a link, unfollowed) was last changed, by
    /// this machine's clock; none at all if that is in the future (the
    /// clock was set back).
    pub fn age(&self, name: &str) -> io::Result<std::time::Duration> {
        let changed = fs::symlink_metadata(self.path.join(name))?.modified()?;
        Ok(changed.elapsed().unwrap_or_default())
    }

    /// The names in this directory but dot-files (temporary files, by
    /// this module's naming), read through the descriptor, so that it is
    /// this very directory's.
    pub fn names(&self) -> io::Result<Vec<String>> {
        let by_descriptor = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        let mut names: Vec<String> = fs::read_dir(by_descriptor)?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| !name.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Takes `lock` on the directory, waiting for other holders, but not
    /// past `deadline` (code 11) nor past a termination request (code 105).
    pub fn lock(&self, lock: Lock, deadline: Option<Instant>) -> Result<(), DirError> {
        // Not a plain blocking flock: the plugins' termination signals are
        // blocked (read from a signalfd), so a request to stop must be
        // looked for while waiting.
        let started = Instant::now();
        loop {
            if sys::try_flock(&self.file, lock).map_err(|e| self.error(e))? {
                return Ok(());
            }
            if let Some(signal) = signals::received(1) {
                return Err(DirError::from(Interrupted {
                    signal,
                    during: "waiting for a lock",
                }));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(DirError::LockTimeout {
                    path: self.path.clone(),
                    waited: started.elapsed(),
                });
            }
            signals::wait(LOCK_RETRY);
        }
    }

    /// `error` on this directory.
    pub fn error(&self, error: io::Error) -> DirError {
        DirError::io(&self.path, error)
    }

    /// `error` on file `name` in this directory.
    pub fn error_at(&self, name: &str, error: io::Error) -> DirError {
        DirError::io(&self.path.join(name), error)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    /// Syncs this directory's names (made, renamed, removed) to the disk,
    /// whatever its durability.
    pub fn sync_names(&self) -> io::Result<()> {
        self.sync()
    }

    /// Syncs a change of names, if the directory is durable.
    fn sync_change(&self) -> io::Result<()> {
        if self.durable {
            self.sync()
        } else {
            Ok(())
        }
    }

    /// A new dot-file `temporary` holding `content`, synced. One left by a
    /// crash, or put there by someone else (a link included), is removed
    /// first, not written through.
    fn write_temporary(&self, temporary: &str, content: &[u8]) -> io::Result<String> {
        let temporary = temporary.to_owned();
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let mut file = match sys::openat(&self.file, &temporary, flags, PRIVATE_FILE) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                sys::unlinkat(&self.file, &temporary)?;
                sys::openat(&self.file, &temporary, flags, PRIVATE_FILE)?
            }
            opened => opened?,
        };
        let written = file.write_all(content).and_then(|()| file.sync_all());
        if let Err(e) = written {
            let _ = sys::unlinkat(&self.file, &temporary);
            return Err(e);
        }
        Ok(temporary)
    }

    /// An open with O_NOFOLLOW fails on a link where a file or directory
    /// should be (ELOOP, or ENOTDIR with O_DIRECTORY): said so.
    fn refused_or(&self, name: &str, error: io::Error) -> io::Error {
        let is_link =
            fs::symlink_metadata(self.path.join(name)).is_ok_and(|m| m.file_type().is_symlink());
        if is_link && matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) {
            io::Error::other("a symbolic link: refused")
        } else {
            error
        }
    }
}

/// Whether a record cannot be a symbolic link and must be a file: empty,
/// with a NUL byte, longer than this filesystem takes for a link's target
/// (XFS: 1,023 bytes), or a filesystem without links; `read` reads both.
fn cannot_be_link(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::InvalidInput
        || matches!(
            error.raw_os_error(),
            Some(libc::ENAMETOOLONG | libc::EPERM | libc::EOPNOTSUPP)
        )
}

/// The mode of a directory made for others to read: a CNI_PATH or net.d
/// directory, a log's or a socket's, and any directory made above
/// another (it may be shared with other plugins, as /var/lib/cni is).
pub const SHARED_DIR: u32 = 0o755;

/// A digest of `text` to name a file or a key after (FNV-1a, 64 bits):
/// stable across builds and releases, as a name must be.
pub fn name_digest(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Makes `path` with `mode` and each missing directory above it with
/// [`SHARED_DIR`], whatever the umask: each is made with its mode (which
/// the umask can only narrow) and then set to it exactly, so that none is
/// ever looser than its mode. One there already, or made meanwhile by
/// another process, is left as it is. The directories it made, top first.
pub fn make_all(path: &Path, mode: u32) -> io::Result<Vec<PathBuf>> {
    let missing: Vec<&Path> = path.ancestors().take_while(|d| !d.exists()).collect();
    let mut made = Vec::new();
    for dir in missing.into_iter().rev() {
        let mode = if dir == path { mode } else { SHARED_DIR };
        match fs::DirBuilder::new().mode(mode).create(dir) {
            Ok(()) => {
                fs::set_permissions(dir, fs::Permissions::from_mode(mode))?;
                made.push(dir.to_owned());
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(made)
}

/// The temporary file of record `name` for `writer` (none: the usual
/// writer): `.NAME.tmp`, or `.NAME.WRITER.tmp`. A dot-file, which
/// [`Dir::names`] leaves out.
fn temporary_name(name: &str, writer: &str) -> String {
    match writer {
        "" => format!(".{name}.tmp"),
        writer => format!(".{name}.{writer}.tmp"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn files_are_written_whole_created_once_read_listed_and_removed() {
        let root = tempfile::tempdir().unwrap();
        let dir = Dir::open_made(&root.path().join("a/b")).unwrap();
        assert_eq!(dir.read("x").unwrap(), None);
        dir.replace("x", b"one").unwrap();
        dir.replace("x", b"two").unwrap();
        assert_eq!(dir.read("x").unwrap().as_deref(), Some(&b"two"[..]));
        assert!(dir.create("y", b"first").unwrap());
        assert!(!dir.create("y", b"second").unwrap(), "never overwritten");
        assert_eq!(dir.read("y").unwrap().as_deref(), Some(&b"first"[..]));
        assert!(dir.contains("y").unwrap() && !dir.contains("z").unwrap());
        assert_eq!(dir.names().unwrap(), ["x", "y"], "no temporary file left");
        assert!(dir.remove("x").unwrap() && !dir.remove("x").unwrap());
        let child = dir.child_made("c").unwrap();
        assert!(child.path().ends_with("a/b/c"));
        assert!(dir.child("c").unwrap().is_some() && dir.child("d").unwrap().is_none());
    }

    #[test]
    fn what_is_made_here_only_its_owner_may_read() {
        let root = tempfile::tempdir().unwrap();
        let dir = Dir::open_made(root.path()).unwrap();
        let mode = |name: &str| {
            let meta = fs::symlink_metadata(root.path().join(name)).unwrap();
            meta.permissions().mode() & 0o777
        };
        dir.replace("file", b"pod default/web-0").unwrap();
        dir.create("record", b"pod default/web-1").unwrap();
        dir.overwrite("hint", b"10.1.0.9").unwrap();
        dir.child_made("network").unwrap();
        assert_eq!(
            [mode("file"), mode("record"), mode("hint"), mode("network")],
            [0o600, 0o600, 0o600, 0o700]
        );
        // A directory an earlier version made readable by all is closed.
        fs::create_dir(root.path().join("old")).unwrap();
        fs::set_permissions(root.path().join("old"), fs::Permissions::from_mode(0o755)).unwrap();
        dir.child("old").unwrap().unwrap().keep_private().unwrap();
        assert_eq!(mode("old"), 0o700);
    }

    #[test]
    fn an_ordered_directorys_records_are_links_whose_target_is_the_record() {
        let root = tempfile::tempdir().unwrap();
        let dir = Dir::open_made(&root.path().join("d"))
            .unwrap()
            .with_durability(Durability::Ordered);
        let record = br#"{"containerID":"c1","ifname":"eth0"}"#;
        assert!(dir.create("r", record).unwrap());
        assert!(!dir.create("r", b"other").unwrap(), "never overwritten");
        let target = fs::read_link(root.path().join("d/r")).unwrap();
        assert_eq!(target.as_os_str().as_encoded_bytes(), record);
        assert_eq!(dir.read("r").unwrap().as_deref(), Some(&record[..]));
        assert_eq!(dir.names().unwrap(), ["r"], "no temporary file made");
        // Files (a hint, written in place) are still read as files; what
        // cannot be a link is refused.
        dir.overwrite("h", b"010.001.000.005").unwrap();
        dir.overwrite("h", b"010.001.000.006").unwrap();
        assert_eq!(
            dir.read("h").unwrap().as_deref(),
            Some(&b"010.001.000.006"[..])
        );
        assert_eq!(dir.read("none").unwrap(), None);
        // What cannot be a link's target is a synced file, read the same.
        for (i, content) in [&b""[..], b"a\0b", &[b'x'; 4096]].into_iter().enumerate() {
            let name = format!("file-{i}");
            assert!(dir.create(&name, content).unwrap());
            assert!(!dir.create(&name, b"other").unwrap(), "never overwritten");
            let path = root.path().join("d").join(&name);
            assert!(fs::symlink_metadata(path).unwrap().is_file());
            assert_eq!(dir.read(&name).unwrap().as_deref(), Some(content));
            dir.remove(&name).unwrap();
        }
        // A longer old hint loses its tail; a FIFO is refused, not waited on.
        dir.overwrite("h", b"fd00:0000:0000:0000:0000:0000:0000:0001")
            .unwrap();
        dir.overwrite("h", b"010.001.000.007").unwrap();
        assert_eq!(
            dir.read("h").unwrap().as_deref(),
            Some(&b"010.001.000.007"[..])
        );
        let fifo = std::process::Command::new("mkfifo")
            .arg(root.path().join("d/fifo"))
            .status()
            .unwrap();
        assert!(fifo.success());
        // Without a reader, the open fails at once (ENXIO); never a wait.
        assert!(dir.overwrite("fifo", b"x").is_err());
        assert!(dir.remove("r").unwrap() && dir.read("r").unwrap().is_none());
        // A durable directory keeps files, and refuses a link as before.
        let durable = Dir::open_made(&root.path().join("e")).unwrap();
        assert!(durable.create("f", record).unwrap());
        assert!(fs::symlink_metadata(root.path().join("e/f"))
            .unwrap()
            .is_file());
    }

    #[test]
    fn a_record_is_replaced_whole_in_one_step() {
        let root = tempfile::tempdir().unwrap();
        let dir = Dir::open_made(&root.path().join("d"))
            .unwrap()
            .with_durability(Durability::Ordered);
        dir.replace_record("h", b"{\"until\":null}").unwrap();
        dir.replace_record("h", b"{\"until\":60}").unwrap();
        let path = root.path().join("d/h");
        assert!(fs::symlink_metadata(&path).unwrap().is_symlink());
        assert_eq!(
            dir.read("h").unwrap().as_deref(),
            Some(&b"{\"until\":60}"[..])
        );
        assert_eq!(dir.names().unwrap(), ["h"], "no temporary name left");
        // A temporary link left by a crash is replaced; what cannot be a
        // link is a file, read the same.
        symlink("stale", root.path().join("d/.h.tmp")).unwrap();
        dir.replace_record("h", &[b'x'; 4096]).unwrap();
        assert!(fs::symlink_metadata(&path).unwrap().is_file());
        assert_eq!(dir.read("h").unwrap().unwrap().len(), 4096);
        dir.replace_record("h", b"short").unwrap();
        assert_eq!(dir.read("h").unwrap().as_deref(), Some(&b"short"[..]));
        assert_eq!(dir.names().unwrap(), ["h"]);
    }

    #[test]
    fn links_are_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let dir = Dir::open_made(&root.path().join("d")).unwrap();
        let target = root.path().join("precious");
        fs::write(&target, "precious").unwrap();
        // At a temporary file's path: replaced, not written through.
        symlink(&target, root.path().join("d/.x.tmp")).unwrap();
        dir.replace("x", b"{}").unwrap();
        symlink(&target, root.path().join("d/.y.tmp")).unwrap();
        assert!(dir.create("y", b"{}").unwrap());
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
        // In place of a file or a directory: refused, or taken as taken.
        symlink(&target, root.path().join("d/l")).unwrap();
        let e = dir.read("l").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(!dir.create("l", b"{}").unwrap());
        let e = dir.overwrite("l", b"garbage").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(dir.contains("l").unwrap());
        symlink(root.path(), root.path().join("d/sub")).unwrap();
        let e = dir.child("sub").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
    }

    #[test]
    fn a_fifo_in_place_of_a_file_is_refused_not_waited_on() {
        let root = tempfile::tempdir().unwrap();
        let dir = Dir::open(root.path()).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(root.path().join("f"))
            .status();
        assert!(made.unwrap().success());
        let e = dir.read("f").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_held_lock_is_waited_for_no_longer_than_asked() {
        let root = tempfile::tempdir().unwrap();
        let (one, two) = (
            Dir::open(root.path()).unwrap(),
            Dir::open(root.path()).unwrap(),
        );
        one.lock(Lock::Exclusive, None).unwrap();
        let deadline = Instant::now() + Duration::from_millis(100);
        let e = two.lock(Lock::Shared, Some(deadline)).unwrap_err();
        assert_eq!(e.code(), code::TRY_AGAIN_LATER);
        drop(one);
        // A moment's wait: a child another test thread forks meanwhile
        // holds a copy of the descriptor, and so the lock, until it execs.
        two.lock(
            Lock::Shared,
            Some(Instant::now() + Duration::from_millis(500)),
        )
        .unwrap();
    }
}
