//! The run's figures, for its summary line: the faults by kind, and the
//! operations that succeeded per second while a lasting fault was on and
//! while none was.

use std::collections::BTreeMap;

use crate::faults::{KINDS, LASTING};
use crate::history::History;

/// How many faults of each kind (a fence by reclaim counted as
/// "reclaim"; the end of a lasting fault, a fence seen and a readmission,
/// not at all).
pub fn faults(history: &History) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for event in &history.events {
        let kind = event.kind.as_str();
        if kind == "readmitted"
            || kind == "fence-seen"
            || LASTING.iter().any(|(_, end)| *end == kind)
        {
            continue;
        }
        let kind = if kind == "fenced" { "reclaim" } else { kind };
        *kinds.entry(kind.to_owned()).or_default() += 1;
    }
    kinds
}

/// The kinds of fault every run must have and this one (`counted`) did
/// not.
pub fn missing(counted: &BTreeMap<String, usize>) -> Vec<&'static str> {
    KINDS
        .iter()
        .copied()
        .filter(|kind| counted.get(*kind).copied().unwrap_or(0) == 0)
        .collect()
}

/// Operations that succeeded per second, among those that ended before
/// `until` (ms): (while a lasting fault was on, while none was).
pub fn throughput(history: &History, until: u64) -> (f64, f64) {
    // Lasting faults come one at a time: each window runs from a start to
    // the next end.
    let mut windows: Vec<(u64, u64)> = Vec::new();
    let mut events: Vec<_> = history.events.iter().collect();
    events.sort_by_key(|e| e.at);
    let mut open: Option<u64> = None;
    for event in events {
        if LASTING.iter().any(|(start, _)| *start == event.kind) {
            open.get_or_insert(event.at);
        } else if LASTING.iter().any(|(_, end)| *end == event.kind) {
            if let Some(start) = open.take() {
                windows.push((start, event.at));
            }
        }
    }
    if let Some(start) = open {
        windows.push((start, until));
    }
    let faulty: u64 = windows
        .iter()
        .map(|(s, e)| e.min(&until) - s.min(&until))
        .sum();
    let calm = until.saturating_sub(faulty);
    let (mut during, mut between) = (0u64, 0u64);
    for op in history
        .operations
        .iter()
        .filter(|op| op.succeeded() && op.end <= until)
    {
        if windows.iter().any(|(s, e)| *s <= op.end && op.end < *e) {
            during += 1;
        } else {
            between += 1;
        }
    }
    let rate = |n: u64, millis: u64| n as f64 * 1_000.0 / millis.max(1) as f64;
    (rate(during, faulty), rate(between, calm))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Event, Operation};

    fn event(kind: &str, at: u64) -> Event {
        Event {
            at,
            kind: kind.into(),
            target: "n1".into(),
            detail: String::new(),
        }
    }

    fn ok(end: u64) -> Operation {
        Operation {
            node: "n1".into(),
            command: "ADD".into(),
            container: format!("c{end}"),
            workload: None,
            start: end.saturating_sub(5),
            end,
            status: Some(0),
            addresses: vec![],
            said: String::new(),
        }
    }

    #[test]
    fn faults_are_counted_by_kind_once_each() {
        let history = History {
            operations: vec![],
            events: vec![
                event("partition", 0),
                event("healed", 10),
                event("kill-add", 12),
                event("fenced", 15),
                event("readmitted", 20),
                event("kill-add", 30),
            ],
        };
        let kinds: Vec<(String, usize)> = faults(&history).into_iter().collect();
        assert_eq!(
            kinds,
            [
                ("kill-add".to_owned(), 2),
                ("partition".to_owned(), 1),
                ("reclaim".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn a_kind_of_fault_the_run_did_not_have_is_missing() {
        let mut counted: BTreeMap<String, usize> =
            KINDS.iter().map(|k| (k.to_string(), 1)).collect();
        assert_eq!(missing(&counted), Vec::<&str>::new());
        counted.remove("clock-behind");
        counted.insert("quorum-lost".into(), 0);
        assert_eq!(missing(&counted), ["quorum-lost", "clock-behind"]);
    }

    #[test]
    fn operations_are_counted_in_and_out_of_lasting_faults() {
        // A partition over the first second of two: 3 operations in it, 1
        // after; one past the end is not counted.
        let history = History {
            operations: vec![ok(100), ok(500), ok(900), ok(1_500), ok(2_500)],
            events: vec![event("partition", 0), event("healed", 1_000)],
        };
        assert_eq!(throughput(&history, 2_000), (3.0, 1.0));
    }
}
