//! The node's metrics, as its daemon serves them: the commands' counts
//! read as the allocator's processes leave them, written in Prometheus'
//! text format, and the endpoint that answers a scrape with the last
//! text made, so that a scrape never waits on a store.

use std::fmt::Write as _;
use std::io::{BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::counts::{Tail, BUCKETS};
use crate::http::{self, Status};

/// The text format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a scrape's request may hold.
const LIMITS: http::Limits = http::Limits {
    line: 4096,
    headers: 64,
    body: 0,
};

/// How long a scraper may take, in all, to send its request and read the
/// answer.
const PATIENCE: Duration = Duration::from_secs(5);

/// A label value as the exposition format escapes it.
pub fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes the `# HELP` and `# TYPE` lines of metric `ipam_da_pool_NAME`.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(
        out,
        "# HELP ipam_da_pool_{name} {help}\n# TYPE ipam_da_pool_{name} {kind}"
    );
}

/// The disk space the files under `dir` take, in bytes, as `du` counts
/// it; 0 where there is no `dir`.
pub fn disk_usage(dir: &Path) -> std::io::Result<u64> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut bytes = std::fs::symlink_metadata(dir)?.blocks() * 512;
    for entry in entries {
        let entry = entry?;
        let metadata = match entry.metadata() {
            Ok(metadata) => metadata,
            // Removed since it was listed: a DEL or a GC going on.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        bytes += if metadata.is_dir() {
            disk_usage(&entry.path())?
        } else {
            metadata.blocks() * 512
        };
    }
    Ok(bytes)
}

/// The commands' counters and latency histograms of `tails`, in the text
/// format.
pub fn render_counts(tails: &[Tail], out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP ipam_da_pool_operations_total Commands run by the allocator on this node, by CNI result code (0: success).\n# TYPE ipam_da_pool_operations_total counter"
    );
    for tail in tails {
        for (command, totals) in &tail.totals.commands {
            for (code, count) in &totals.by_code {
                let _ = writeln!(
                    out,
                    "ipam_da_pool_operations_total{{network=\"{}\",command=\"{command}\",code=\"{code}\"}} {count}",
                    label(&tail.network)
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "# HELP ipam_da_pool_operation_duration_seconds How long the allocator's commands took on this node.\n# TYPE ipam_da_pool_operation_duration_seconds histogram"
    );
    for tail in tails {
        for (command, totals) in &tail.totals.commands {
            let labels = format!("network=\"{}\",command=\"{command}\"", label(&tail.network));
            for (bound, count) in BUCKETS.iter().zip(totals.buckets) {
                let _ = writeln!(
                    out,
                    "ipam_da_pool_operation_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {count}"
                );
            }
            let all: u64 = totals.by_code.values().sum();
            let _ = writeln!(
                out,
                "ipam_da_pool_operation_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {all}\nipam_da_pool_operation_duration_seconds_sum{{{labels}}} {}\nipam_da_pool_operation_duration_seconds_count{{{labels}}} {all}",
                totals.seconds
            );
        }
    }
    header(
        out,
        "counts_skipped_total",
        "counter",
        "Lines of the commands' counts files that were not a count (garbled, or of another version).",
    );
    for tail in tails {
        let _ = writeln!(
            out,
            "ipam_da_pool_counts_skipped_total{{network=\"{}\"}} {}",
            label(&tail.network),
            tail.totals.skipped
        );
    }
    let _ = writeln!(
        out,
        "# HELP ipam_da_pool_etcd_requests_total Requests the allocator's commands made to etcd on this node.\n# TYPE ipam_da_pool_etcd_requests_total counter\n# HELP ipam_da_pool_etcd_request_failures_total Requests to etcd that failed: unreached, out of time or refused.\n# TYPE ipam_da_pool_etcd_request_failures_total counter"
    );
    for tail in tails {
        let _ = writeln!(
            out,
            "ipam_da_pool_etcd_requests_total{{network=\"{0}\"}} {1}\nipam_da_pool_etcd_request_failures_total{{network=\"{0}\"}} {2}",
            label(&tail.network), tail.totals.requests, tail.totals.failures
        );
    }
}

/// The metrics' text last made, and when.
#[derive(Debug)]
pub struct Latest {
    text: String,
    made: Instant,
}

impl Latest {
    /// No text yet.
    pub fn new() -> Latest {
        Latest {
            text: String::new(),
            made: Instant::now(),
        }
    }

    /// `text`, made now.
    pub fn set(latest: &Mutex<Latest>, text: String) {
        let new = Latest {
            text,
            made: Instant::now(),
        };
        match latest.lock() {
            Ok(mut held) => *held = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }
}

/// Answers every scrape on `listener` with the text `latest` holds, one
/// connection at a time, each given [`PATIENCE`] in all to send its
/// request and read the answer: the text is made elsewhere, so an answer
/// never waits on a store. A text older than `stale_after` (the thread
/// that makes it stopped) is answered 503, never passed off as current.
pub fn serve(listener: &TcpListener, latest: &Mutex<Latest>, stale_after: Duration) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            // Out of descriptors, say: not a loop that spins.
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let until = Instant::now() + PATIENCE;
        let mut reader = BufReader::new(Deadline {
            stream: &stream,
            until,
        });
        let Ok(Some(request)) = http::read_request(&mut reader, LIMITS) else {
            continue;
        };
        let (status, body) = match (request.method.as_str(), request.path.as_str()) {
            ("GET", "/metrics") => current(latest, stale_after),
            _ => (Status::NotFound, "only GET /metrics is served\n".to_owned()),
        };
        let left = until.saturating_duration_since(Instant::now());
        if stream.set_write_timeout(Some(left.max(MOMENT))).is_ok() {
            let mut writer = &stream;
            let _ = http::write_response(&mut writer, status, CONTENT_TYPE, body.as_bytes(), true);
        }
    }
}

/// The shortest timeout a socket is given: zero would mean none.
const MOMENT: Duration = Duration::from_millis(1);

/// A connection read until a deadline, however slowly its peer sends.
struct Deadline<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left.max(MOMENT)))?;
        let mut stream = self.stream;
        stream.read(buffer)
    }
}

/// What a scrape is answered: the text last made, unless it is older
/// than `stale_after`. A collector that panicked while holding it left a
/// whole text all the same, since it swaps in a finished one.
fn current(latest: &Mutex<Latest>, stale_after: Duration) -> (Status, String) {
    let held = match latest.lock() {
        Ok(held) => held,
        Err(poisoned) => poisoned.into_inner(),
    };
    let age = held.made.elapsed();
    if age > stale_after {
        let said = format!(
            "the metrics were last made {}s ago: their collector has stopped\n",
            age.as_secs()
        );
        return (Status::Unavailable, said);
    }
    (Status::Ok, held.text.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::da_pool::counts::{append, counted};

    #[test]
    fn counts_are_written_as_counters_and_a_histogram_per_command() {
        let dir = tempfile::tempdir().unwrap();
        let mut tail = Tail::new(dir.path(), "pods");
        append(&dir.path().join("pods"), &counted("ADD", 0)).unwrap();
        append(&dir.path().join("pods"), &counted("ADD", 110)).unwrap();
        tail.read_on().unwrap();
        let mut text = String::new();
        render_counts(&[tail], &mut text);
        for line in [
            "ipam_da_pool_operations_total{network=\"pods\",command=\"ADD\",code=\"110\"} 1",
            "ipam_da_pool_operation_duration_seconds_bucket{network=\"pods\",command=\"ADD\",le=\"0.002\"} 0",
            "ipam_da_pool_operation_duration_seconds_bucket{network=\"pods\",command=\"ADD\",le=\"0.005\"} 2",
            "ipam_da_pool_operation_duration_seconds_count{network=\"pods\",command=\"ADD\"} 2",
            "ipam_da_pool_etcd_requests_total{network=\"pods\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
