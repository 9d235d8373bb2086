//! The counts an allocator process leaves for the node's metrics daemon:
//! one line per command, appended to a file in one `write`, so that
//! processes that end at once never interleave and a crash loses at most
//! the line of the command it cut short; and the daemon's totals, folded
//! from those lines as they come.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
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
            std::fs::create_dir_all(dir)?;
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
    /// The requests made to etcd, and how many of them failed.
    pub requests: u64,
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
pub fn append(path: &Path, counted: &Counted) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)?;
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
    /// Requests to etcd, and those that failed.
    pub requests: u64,
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
}
