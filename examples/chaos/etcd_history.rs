//! The store as etcd itself keeps it, read by the checker's own client,
//! never through the code it judges: one `etcdctl watch` per member on the
//! run's prefix from the cluster's first revision, each resumed from its
//! last revision whenever it ends, merged by revision and each change
//! dated by the first watcher to deliver it (so that a member killed or
//! paused delays nothing); compaction held back to what the watchers have
//! read; and snapshots of the prefix. etcdctl's JSON is parsed here.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{Client, Cluster};
use crate::history::lock;

/// One change of a key, as etcd recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The revision that made it.
    pub revision: u64,
    pub key: String,
    /// What was put; `None` for a deletion.
    pub value: Option<Vec<u8>>,
    /// When the first watcher received it, ms since the run began.
    pub at: u64,
}

/// The key that marks a point in the history (see `Watchers::compact`):
/// under the prefix, so that the watchers see it; judged by nothing.
pub const MARK: &str = "/chaos/checker/mark";

/// A key's change within a revision: the key, and what was put (`None`:
/// deleted).
type KeyChange = (String, Option<Vec<u8>>);

/// The watchers of a run.
pub struct Watchers {
    prefix: String,
    began: Instant,
    /// Each revision's changes, and when the first watcher delivered it.
    revisions: Mutex<BTreeMap<u64, (u64, Vec<KeyChange>)>>,
    /// Per watcher, the last revision it delivered.
    seen: Vec<AtomicU64>,
    children: Mutex<Vec<Option<Child>>>,
    stop: AtomicBool,
    /// What went wrong with the history itself.
    trouble: Mutex<Vec<String>>,
}

impl Watchers {
    /// Watchers of `prefix`, one per member of `cluster` (its etcdctl
    /// flags), their times counted from `began`; each in a thread of its
    /// own until `stop`.
    pub fn start(cluster: &Cluster, prefix: &str, began: Instant) -> Arc<Watchers> {
        let size = cluster.size();
        let watchers = Arc::new(Watchers {
            prefix: prefix.to_owned(),
            began,
            revisions: Mutex::new(BTreeMap::new()),
            seen: (0..size).map(|_| AtomicU64::new(0)).collect(),
            children: Mutex::new((0..size).map(|_| None).collect()),
            stop: AtomicBool::new(false),
            trouble: Mutex::new(Vec::new()),
        });
        for member in 0..size {
            let flags = cluster.member_flags(member);
            let watchers = Arc::clone(&watchers);
            std::thread::spawn(move || watchers.follow(member, &flags));
        }
        watchers
    }

    /// Watcher `i`'s course: etcdctl watching from the revision after the
    /// last it delivered, started again each time it ends.
    fn follow(&self, i: usize, flags: &[String]) {
        while !self.stop.load(Ordering::SeqCst) {
            let from = self.seen[i].load(Ordering::SeqCst) + 1;
            let child = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(flags)
                .args(["watch", "--prefix", &self.prefix, "--rev"])
                .arg(from.to_string())
                .args(["-w", "json"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn();
            let Ok(mut child) = child else {
                lock(&self.trouble).push("etcdctl watch does not start".to_owned());
                return;
            };
            let stdout = child.stdout.take();
            lock(&self.children)[i] = Some(child);
            for line in stdout
                .map(std::io::BufReader::new)
                .into_iter()
                .flat_map(|r| r.lines())
            {
                let Ok(line) = line else { break };
                match parse_watch(&line) {
                    Ok(Watched::Changes(changes)) => self.deliver(i, changes),
                    Ok(Watched::Compacted(revision)) => {
                        // This watcher fell behind a compaction, which is
                        // held back to what another has read: it goes on
                        // from there, the others having the rest.
                        self.seen[i].fetch_max(revision.saturating_sub(1), Ordering::SeqCst);
                        break;
                    }
                    Ok(Watched::Nothing) => {}
                    Err(e) => {
                        lock(&self.trouble).push(format!("a watch answer not understood: {e}"));
                    }
                }
            }
            if let Some(mut child) = lock(&self.children)[i].take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Watcher `i` delivers `changes`: each revision no other watcher
    /// delivered before is kept, dated now.
    fn deliver(&self, i: usize, changes: Vec<(u64, String, Option<Vec<u8>>)>) {
        let at = self.began.elapsed().as_millis() as u64;
        let mut revisions = lock(&self.revisions);
        let mut mine = std::collections::BTreeSet::new();
        let mut last = 0;
        for (revision, key, value) in changes {
            last = last.max(revision);
            // Delivered again after a restart of this watcher.
            if self.seen[i].load(Ordering::SeqCst) >= revision {
                continue;
            }
            match revisions.get_mut(&revision) {
                None => {
                    revisions.insert(revision, (at, vec![(key, value)]));
                    mine.insert(revision);
                }
                Some(entry) if mine.contains(&revision) => entry.1.push((key, value)),
                // Another watcher's, earlier: the same changes.
                Some(_) => {}
            }
        }
        self.seen[i].fetch_max(last, Ordering::SeqCst);
    }

    /// The revision up to which the history is read: each watcher reads
    /// its revisions in order, and the one furthest on has them all.
    pub fn read_up_to(&self) -> u64 {
        self.seen
            .iter()
            .map(|s| s.load(Ordering::SeqCst))
            .max()
            .unwrap_or(0)
    }

    /// Waits up to `limit` until some watcher has delivered `revision`.
    pub fn wait_for(&self, revision: u64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.read_up_to() < revision {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Compacts etcd no further than the watchers have read: a mark is
    /// written (put, or, when etcd refuses puts, deleted, if `may_delete`)
    /// and, once a watcher has it, the history is compacted at its
    /// revision. The revision compacted at, if any.
    pub fn compact(&self, cluster: &Client, may_delete: bool) -> Option<u64> {
        let put = cluster.etcdctl(&["put", MARK, "mark", "-w", "json"]);
        let mut mark = put
            .status
            .success()
            .then(|| header_revision(&put.stdout))
            .flatten();
        if mark.is_none() && may_delete {
            let del = cluster.etcdctl(&["del", MARK, "-w", "json"]);
            let answer: Value = serde_json::from_slice(&del.stdout).unwrap_or_default();
            if answer["deleted"].as_u64().unwrap_or(0) > 0 {
                mark = header_revision(&del.stdout);
            }
        }
        let mark = mark?;
        if !self.wait_for(mark, Duration::from_secs(5)) {
            return None;
        }
        cluster
            .etcdctl(&["compact", &mark.to_string()])
            .status
            .success()
            .then_some(mark)
    }

    /// Stops the watchers.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for child in lock(&self.children).iter_mut().flatten() {
            let _ = child.kill();
        }
    }

    /// Every change so far, by revision.
    pub fn changes(&self) -> Vec<Change> {
        lock(&self.revisions)
            .iter()
            .flat_map(|(revision, (at, changes))| {
                changes.iter().map(|(key, value)| Change {
                    revision: *revision,
                    key: key.clone(),
                    value: value.clone(),
                    at: *at,
                })
            })
            .collect()
    }

    /// What went wrong with the history itself.
    pub fn trouble(&self) -> Vec<String> {
        lock(&self.trouble).clone()
    }
}

/// What one line of `etcdctl watch -w json` says.
#[derive(Debug, PartialEq)]
enum Watched {
    /// Changes: revision, key, value (`None`: deleted).
    Changes(Vec<(u64, String, Option<Vec<u8>>)>),
    /// The watch was cancelled: its history compacted up to here.
    Compacted(u64),
    Nothing,
}

fn parse_watch(line: &str) -> Result<Watched, String> {
    let answer: Value = serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))?;
    let compacted = answer["CompactRevision"].as_u64().unwrap_or(0);
    if compacted > 0 {
        return Ok(Watched::Compacted(compacted));
    }
    let mut changes = Vec::new();
    for event in answer["Events"].as_array().into_iter().flatten() {
        let kv = &event["kv"];
        let key = decode(kv["key"].as_str().unwrap_or_default())?;
        let revision = kv["mod_revision"]
            .as_u64()
            .ok_or_else(|| format!("an event without its revision: {line}"))?;
        // A PUT's type is 0, which etcdctl's JSON leaves out.
        let value = match event["type"].as_u64().unwrap_or(0) {
            0 => Some(decode(kv["value"].as_str().unwrap_or_default())?),
            _ => None,
        };
        changes.push((
            revision,
            String::from_utf8(key).map_err(|_| format!("a key not UTF-8: {line}"))?,
            value,
        ));
    }
    Ok(if changes.is_empty() {
        Watched::Nothing
    } else {
        Watched::Changes(changes)
    })
}

/// The revision in the header of an answer of etcdctl's (`-w json`).
fn header_revision(stdout: &[u8]) -> Option<u64> {
    let answer: Value = serde_json::from_slice(stdout).ok()?;
    answer["header"]["revision"].as_u64()
}

/// A snapshot of the prefix: each key's value and the revision that last
/// changed it.
pub type Snapshot = BTreeMap<String, (Vec<u8>, u64)>;

/// Every key under `prefix` as the cluster has it now, read with
/// etcdctl; `None` if it does not answer.
pub fn snapshot(cluster: &Cluster, prefix: &str) -> Option<Snapshot> {
    let out = cluster.etcdctl(&["get", "--prefix", prefix, "-w", "json"]);
    if !out.status.success() {
        return None;
    }
    parse_snapshot(&out.stdout).ok()
}

fn parse_snapshot(stdout: &[u8]) -> Result<Snapshot, String> {
    let answer: Value = serde_json::from_slice(stdout).map_err(|e| e.to_string())?;
    let mut found = Snapshot::new();
    for kv in answer["kvs"].as_array().into_iter().flatten() {
        let key = String::from_utf8(decode(kv["key"].as_str().unwrap_or_default())?)
            .map_err(|_| "a key not UTF-8".to_owned())?;
        let value = decode(kv["value"].as_str().unwrap_or_default())?;
        let revision = kv["mod_revision"].as_u64().unwrap_or(0);
        found.insert(key, (value, revision));
    }
    Ok(found)
}

/// Standard base64 (Go's encoding of bytes in JSON), padded.
fn decode(text: &str) -> Result<Vec<u8>, String> {
    let value = |c: u8| -> Result<u32, String> {
        Ok(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return Err(format!("not base64: {text:?}")),
        } as u32)
    };
    let bytes = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        let whole = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        match chunk.len() {
            4 => out.extend_from_slice(&whole),
            3 => out.extend_from_slice(&whole[..2]),
            2 => out.push(whole[0]),
            _ => return Err(format!("not base64: {text:?}")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_decoded() {
        assert_eq!(decode("L2E=").unwrap(), b"/a");
        assert_eq!(decode("MQ==").unwrap(), b"1");
        assert_eq!(decode("YWJj").unwrap(), b"abc");
        assert_eq!(decode("").unwrap(), b"");
        assert!(decode("a").is_err());
        assert!(decode("L2*=").is_err());
    }

    #[test]
    fn a_watch_answer_gives_its_puts_and_deletions_by_revision() {
        // As etcdctl 3.4 prints it: a put's type left out, a deletion's 1.
        let line = r#"{"Header":{"revision":4},"Events":[{"kv":{"key":"L2E=","create_revision":2,"mod_revision":2,"version":1,"value":"MQ=="}},{"type":1,"kv":{"key":"L2E=","mod_revision":4}}],"CompactRevision":0,"Canceled":false,"Created":false}"#;
        assert_eq!(
            parse_watch(line).unwrap(),
            Watched::Changes(vec![
                (2, "/a".to_owned(), Some(b"1".to_vec())),
                (4, "/a".to_owned(), None)
            ])
        );
        let compacted = r#"{"Header":{"revision":9},"Events":null,"CompactRevision":7,"Canceled":true,"Created":false}"#;
        assert_eq!(parse_watch(compacted).unwrap(), Watched::Compacted(7));
        assert!(parse_watch("{not json").is_err());
    }

    #[test]
    fn a_snapshot_gives_each_key_its_value_and_revision() {
        let out = br#"{"header":{"revision":9},"kvs":[{"key":"L2E=","create_revision":2,"mod_revision":5,"version":2,"value":"MQ=="}],"count":1}"#;
        let found = parse_snapshot(out).unwrap();
        assert_eq!(found.get("/a"), Some(&(b"1".to_vec(), 5)));
    }
}
