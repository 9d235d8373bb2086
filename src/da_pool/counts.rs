//! The counts an allocator process leaves for the node's metrics daemon:
//! one line per command, appended to a file in one `write`, so that
//! processes that end at once never interleave and a crash loses at most
//! the line of the command it cut short; and the daemon's totals, folded
//! from those lines as they come.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cni::Reportable;
use crate::da_pool::error::PoolError;

/// Where each network's counts are left unless `ipam.pool.counts` says:
/// on a tmpfs, so that a count costs no disk write, and the totals start
/// again at boot, as a Prometheus counter may.
pub const DEFAULT_DIR: &str = "/run/ipam-da-pool/counts";

/// Leaves the count of `command` on network `network`, begun at
/// `started`, in `dir`'s file of the network (made if need be). A count
/// that cannot be left is logged, never the command's failure.
pub fn record<T>(
    dir: Option<&Path>,
    network: &str,
    command: &'static str,
    started: Instant,
    outcome: &Result<T, PoolError>,
) {
    let Some(dir) = dir else {
        return;
    };
    let (requests, failures) = crate::etcd::requests();
    let counted = Counted {
        command,
        code: outcome.as_ref().map_or_else(|e| e.code(), |_| 0),
        took: started.elapsed(),
        requests,
        failures,
    };
    // The network's name is an identifier (the CNI layer checked it).
    let file = dir.join(network);
    let appended = append(&file, &counted).or_else(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)?;
            append(&file, &counted)
        }
        _ => Err(e),
    });
    if let Err(e) = appended {
        tracing::debug!("no count left in {}: {e}", file.display());
    }
}

/// The first word of every line: a line of another layout is skipped,
/// never misread.
const LAYOUT: &str = "c1";

/// The upper bounds, in seconds, of the latency histogram's buckets.
pub const BUCKETS: [f64; 10] = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0];

/// What one command did, as counted.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    /// ADD, DEL, CHECK, GC or STATUS.
    pub command: &'static str,
    /// The CNI code answered: 0 for success.
    pub code: u32,
    /// How long the command took.
    pub took: Duration,
    /// The requests made to etcd.
    pub requests: u64,
    /// How many of those failed: unreached, out of time or refused.
    pub failures: u64,
}

impl Counted {
    /// The line that records it.
    fn line(&self) -> String {
        format!(
            "{LAYOUT} {} {} {} {} {}\n",
            self.command,
            self.code,
            self.took.as_micros(),
            self.requests,
            self.failures
        )
    }
}

/// Appends `counted` to the file at `path`, made if need be, in one write:
/// `O_APPEND` places each write whole at the end, whoever else writes.
/// The plugins run as root: a symbolic link or a FIFO planted at `path`
/// is refused, never followed or waited on.
pub fn append(path: &Path, counted: &Counted) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    file.write_all(counted.line().as_bytes())
}

/// A command's totals: by code, and its latency histogram.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct CommandTotals {
    /// Commands answered with each code.
    pub by_code: BTreeMap<u32, u64>,
    /// Commands at or under each of [`BUCKETS`], in its order.
    pub buckets: [u64; BUCKETS.len()],
    /// Every command's time added up, in seconds.
    pub seconds: f64,
}

/// What the lines read so far add up to.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Totals {
    /// By command.
    pub commands: BTreeMap<String, CommandTotals>,
    /// Requests to etcd.
    pub requests: u64,
    /// Those that failed.
    pub failures: u64,
    /// Lines that were not a count of this layout.
    pub skipped: u64,
}

impl Totals {
    /// Adds the whole lines of `bytes`; the length of what it took, so that
    /// a line still being written is read whole next time.
    pub fn fold(&mut self, bytes: &[u8]) -> usize {
        let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else {
            return 0;
        };
        for line in bytes[..end].split(|b| *b == b'\n') {
            if !self.add_line(line) {
                self.skipped += 1;
            }
        }
        end + 1
    }

    /// Adds one line; false if it is not a count.
    fn add_line(&mut self, line: &[u8]) -> bool {
        let Ok(text) = std::str::from_utf8(line) else {
            return false;
        };
        let words: Vec<&str> = text.split(' ').collect();
        let [LAYOUT, command, code, micros, requests, failures] = words[..] else {
            return false;
        };
        let known = ["ADD", "DEL", "CHECK", "GC", "STATUS"];
        let (Some(command), Ok(code), Ok(micros), Ok(requests), Ok(failures)) = (
            known.iter().find(|k| **k == command),
            code.parse::<u32>(),
            micros.parse::<u64>(),
            requests.parse::<u64>(),
            failures.parse::<u64>(),
        ) else {
            return false;
        };
        let totals = self.commands.entry((*command).to_owned()).or_default();
        *totals.by_code.entry(code).or_default() += 1;
        let seconds = micros as f64 / 1e6;
        totals.seconds += seconds;
        for (bound, count) in BUCKETS.iter().zip(totals.buckets.iter_mut()) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        self.requests += requests;
        self.failures += failures;
        true
    }
}

/// How large a network's counts file may grow before the daemon starts
/// a new one: about 30,000 commands (on a tmpfs, memory).
const ROTATE_AT: u64 = 1 << 20;

/// How long a counts file the daemon set aside is left before it reads
/// the file's rest and removes it: a command that opened it just before
/// has written its line by then.
const SETTLE: Duration = Duration::from_secs(30);

/// One network's counts file, read on from where the last read ended by
/// the node's metrics daemon, which also keeps it from growing for ever:
/// past [`ROTATE_AT`] the file is set aside (a name no network can have)
/// and the commands make a new one; the old one's rest is read after
/// [`SETTLE`], then it is removed. No count is lost to it. Of two daemons
/// reading one network's counts (a unit beside a DaemonSet), only the
/// one holding the network's lock sets files aside; the other's counters
/// start again at each file set aside, and may miss its last lines.
#[derive(Debug)]
pub struct Tail {
    /// The network.
    pub network: String,
    file: PathBuf,
    offset: u64,
    /// The file read up to `offset` (its inode; 0: none yet).
    inode: u64,
    /// The file set aside, if one is: read up to its offset, and since when.
    aside: Option<(u64, Instant)>,
    /// The network's lock, held for the daemon's life, if this daemon
    /// took it: then it alone sets files aside.
    lock: Option<std::fs::File>,
    /// What its lines added up to so far.
    pub totals: Totals,
    rotate_at: u64,
    settle: Duration,
}

impl Tail {
    /// The counts of `network` under `dir`, none read yet. A file an
    /// earlier daemon set aside is read whole once it has settled: these
    /// totals start with it.
    pub fn new(dir: &Path, network: &str) -> Tail {
        let mut tail = Tail {
            network: network.to_owned(),
            file: dir.join(network),
            offset: 0,
            inode: 0,
            aside: None,
            lock: lock(dir, network, true),
            totals: Totals::default(),
            rotate_at: ROTATE_AT,
            settle: SETTLE,
        };
        if tail.lock.is_some() && tail.set_aside().exists() {
            tail.aside = Some((0, Instant::now()));
        }
        tail
    }

    /// Where the file is set aside: a network's name never begins with a
    /// dot.
    fn set_aside(&self) -> PathBuf {
        self.file.with_file_name(format!(".{}.aside", self.network))
    }

    /// Adds what was appended since the last read. A file shorter than
    /// what was read (made again after a reboot, by an operator, or set
    /// aside by another daemon) starts the totals again, as a Prometheus
    /// counter may.
    pub fn read_on(&mut self) -> std::io::Result<()> {
        if self.lock.is_none() {
            // The daemon that held it gone (or, for a moment, a child
            // forked with its file): this one sets files aside from now
            // on, and reads what that one set aside.
            if let Some(dir) = self.file.parent() {
                self.lock = lock(dir, &self.network, false);
            }
            if self.lock.is_some() && self.set_aside().exists() {
                self.aside = Some((0, Instant::now()));
            }
        }
        if let Some((offset, since)) = self.aside {
            if since.elapsed() >= self.settle {
                let aside = self.set_aside();
                read_from(&aside, offset, &mut self.totals)?;
                remove_if_there(&aside)?;
                self.aside = None;
            }
        }
        let (length, inode) = match std::fs::metadata(&self.file) {
            Ok(metadata) => (metadata.len(), metadata.ino()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if length < self.offset || (self.inode != 0 && inode != self.inode) {
            self.offset = 0;
            self.totals = Totals::default();
        }
        self.inode = inode;
        self.offset = read_from(&self.file, self.offset, &mut self.totals)?;
        if self.lock.is_some() && self.aside.is_none() && self.offset >= self.rotate_at {
            // Linked, then unlinked: never over a file set aside that
            // another daemon has still to read.
            match std::fs::hard_link(&self.file, self.set_aside()) {
                Ok(()) => {
                    remove_if_there(&self.file)?;
                    self.aside = Some((self.offset, Instant::now()));
                    // The commands' next file is read from its start,
                    // these totals going on.
                    self.offset = 0;
                    self.inode = 0;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The lock of `network`'s counts in `dir` (a file whose name no network
/// can have, made with the directory if need be), if no other daemon
/// holds it; what stops this one taking it is logged if `say`.
fn lock(dir: &Path, network: &str, say: bool) -> Option<std::fs::File> {
    let path = dir.join(format!(".{network}.lock"));
    let taken = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
        })
        .and_then(|file| {
            Ok(crate::sys::try_flock(&file, crate::sys::Lock::Exclusive)?.then_some(file))
        });
    match taken {
        Ok(Some(file)) => Some(file),
        Ok(None) if !say => None,
        Err(_) if !say => None,
        Ok(None) => {
            tracing::info!(
                "another daemon keeps {}: this one sets no counts file aside",
                path.display()
            );
            None
        }
        Err(e) => {
            tracing::warn!(
                "{}: {e}: no counts file is set aside, and it grows",
                path.display()
            );
            None
        }
    }
}

/// Adds the whole lines of `file` from `offset` on to `totals`: the offset
/// after them (a file gone: `offset`).
fn read_from(file: &Path, offset: u64, totals: &mut Totals) -> std::io::Result<u64> {
    let mut file = match std::fs::File::open(file) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(offset),
        Err(e) => return Err(e),
    };
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(offset + totals.fold(&bytes) as u64)
}

fn remove_if_there(file: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A command's count, 3 ms and one etcd request, for the tests.
#[cfg(test)]
pub(crate) fn counted(command: &'static str, code: u32) -> Counted {
    Counted {
        command,
        code,
        took: Duration::from_millis(3),
        requests: 1,
        failures: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(code: u32, millis: u64) -> Counted {
        Counted {
            command: "ADD",
            code,
            took: Duration::from_millis(millis),
            requests: 1,
            failures: 0,
        }
    }

    #[test]
    fn counts_appended_by_many_processes_add_up_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("counts");
        append(&file, &add(0, 3)).unwrap();
        append(&file, &add(110, 40)).unwrap();
        let mut totals = Totals::default();
        let bytes = std::fs::read(&file).unwrap();
        assert_eq!(totals.fold(&bytes), bytes.len());
        let adds = &totals.commands["ADD"];
        assert_eq!(adds.by_code, BTreeMap::from([(0, 1), (110, 1)]));
        // 3 ms is under 5 ms and above; 40 ms under 50 ms and above.
        assert_eq!(adds.buckets, [0, 0, 1, 1, 1, 2, 2, 2, 2, 2]);
        assert!((adds.seconds - 0.043).abs() < 1e-9);
        assert_eq!(
            (totals.requests, totals.failures, totals.skipped),
            (2, 0, 0)
        );
    }

    #[test]
    fn a_line_still_being_written_is_left_for_the_next_read() {
        let whole = add(0, 1).line();
        let mut bytes = whole.clone().into_bytes();
        bytes.extend_from_slice(&whole.as_bytes()[..5]);
        let mut totals = Totals::default();
        assert_eq!(totals.fold(&bytes), whole.len());
        assert_eq!(totals.commands["ADD"].by_code[&0], 1);
        assert_eq!(totals.fold(b"c1 ADD 0"), 0);
    }

    #[test]
    fn a_line_of_another_layout_or_garbled_is_skipped_not_misread() {
        let mut totals = Totals::default();
        totals.fold(b"c2 ADD 0 1 1 0\nc1 ADD x 1 1 0\nc1 RM 0 1 1 0\n\xff\nc1 DEL 0 7 1 1\n");
        assert_eq!(totals.skipped, 4);
        assert_eq!(totals.commands.keys().collect::<Vec<_>>(), ["DEL"]);
        assert_eq!((totals.requests, totals.failures), (1, 1));
    }

    #[test]
    fn a_tail_reads_on_from_where_it_stopped_and_starts_again_on_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut tail = Tail::new(dir.path(), "pods");
        tail.read_on().unwrap();
        assert_eq!(tail.totals, Totals::default());
        append(&dir.path().join("pods"), &counted("ADD", 0)).unwrap();
        tail.read_on().unwrap();
        append(&dir.path().join("pods"), &counted("ADD", 110)).unwrap();
        tail.read_on().unwrap();
        let adds = &tail.totals.commands["ADD"].by_code;
        assert_eq!((adds[&0], adds[&110]), (1, 1));
        std::fs::remove_file(dir.path().join("pods")).unwrap();
        append(&dir.path().join("pods"), &counted("DEL", 0)).unwrap();
        tail.read_on().unwrap();
        assert_eq!(tail.totals.commands.keys().collect::<Vec<_>>(), ["DEL"]);
    }

    #[test]
    fn a_grown_file_is_set_aside_and_its_late_lines_still_counted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pods");
        let aside = dir.path().join(".pods.aside");
        let mut tail = Tail::new(dir.path(), "pods");
        (tail.rotate_at, tail.settle) = (2 * counted("ADD", 0).line().len() as u64, Duration::ZERO);
        append(&file, &counted("ADD", 0)).unwrap();
        tail.read_on().unwrap();
        assert!(file.exists() && !aside.exists());
        append(&file, &counted("ADD", 0)).unwrap();
        // A settle of 0: but set aside only after this read.
        tail.settle = Duration::from_secs(3600);
        tail.read_on().unwrap();
        assert!(!file.exists() && aside.exists());
        // A command that opened the file before: its line lands aside.
        append(&aside, &counted("ADD", 110)).unwrap();
        append(&file, &counted("DEL", 0)).unwrap();
        tail.read_on().unwrap();
        assert_eq!(tail.totals.commands["ADD"].by_code.get(&110), None);
        tail.settle = Duration::ZERO;
        tail.read_on().unwrap();
        assert!(!aside.exists());
        assert_eq!(
            tail.totals.commands["ADD"].by_code,
            BTreeMap::from([(0, 2), (110, 1)])
        );
        assert_eq!(
            tail.totals.commands["DEL"].by_code,
            BTreeMap::from([(0, 1)])
        );
        // A second daemon beside it sets nothing aside, whatever it reads.
        let mut beside = Tail::new(dir.path(), "pods");
        (beside.rotate_at, beside.settle) = (1, Duration::ZERO);
        beside.read_on().unwrap();
        assert!(file.exists() && !aside.exists());
        assert_eq!(beside.totals.commands["DEL"].by_code[&0], 1);
        drop((tail, beside));
        // A new daemon reads what an earlier one set aside, whole; so
        // does one that started beside another, once that one is gone.
        std::fs::write(&aside, counted("GC", 0).line()).unwrap();
        let held = Tail::new(dir.path(), "pods");
        let mut next = Tail::new(dir.path(), "pods");
        assert!(next.lock.is_none());
        // Without the lock it leaves the set-aside file to the holder.
        next.settle = Duration::ZERO;
        next.read_on().unwrap();
        assert!(aside.exists());
        assert!(!next.totals.commands.contains_key("GC"));
        drop(held);
        next.settle = Duration::ZERO;
        // Another test's child, forked before it execs, may hold the
        // lock's file for a moment.
        for _ in 0..100 {
            next.read_on().unwrap();
            if next.lock.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(next.totals.commands["GC"].by_code[&0], 1);
        assert_eq!(next.totals.commands["DEL"].by_code[&0], 1);
    }

    #[test]
    fn a_link_or_a_fifo_planted_for_the_counts_is_refused_not_followed_or_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("passwd");
        std::fs::write(&target, "root\n").unwrap();
        let link = dir.path().join("pods");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(append(&link, &counted("ADD", 0)).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "root\n");
        let fifo = dir.path().join("nodes");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(append(&fifo, &counted("ADD", 0)).is_err());
    }
}
