//! The node's metrics as an operator reads them: `node-keeper
//! --metrics-listen` on a real etcd, scraped by a real Prometheus
//! (Debian's `prometheus`) that the test starts on loopback, and asked
//! through its query API.
//!
//! Ignored unless asked for with --include-ignored (./.ci/test installs
//! etcd-server and prometheus, and does).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::etcd::Cluster;
use crate::common::{spawn_program, temp_dir, Env, ALLOCATOR};
use crate::operating::{add, cni, config_file, on_etcd, operator, pods, wait_for};
use serde_json::{json, Value};

/// A process killed when dropped.
struct Running(Child);

impl Running {
    /// Asks it to stop (SIGTERM), as a service manager would, and waits.
    fn stop(mut self) {
        let pid = self.0.id().to_string();
        let asked = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(asked.unwrap().success());
        assert!(self.0.wait().unwrap().success());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A node keeper of `config` serving its metrics on `port`.
fn keeper(config: &Path, port: u16) -> Running {
    let listen = format!("127.0.0.1:{port}");
    Running(spawn_program(
        ALLOCATOR,
        Path::new("/"),
        &[
            "node-keeper",
            "--config",
            config.to_str().unwrap(),
            "--metrics-listen",
            &listen,
        ],
        &Env(Vec::new()),
        Stdio::null(),
    ))
}

/// Debian's Prometheus, scraping `target` every second, its data under
/// `dir`, answering on `port`.
fn prometheus(dir: &Path, target: u16, port: u16) -> Running {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: ipam\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
        ),
    )
    .unwrap();
    let child = std::process::Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus runs (./.ci/test installs it)");
    Running(child)
}

/// The value of the instant query `query` on the Prometheus at `port`:
/// its first sample's, if it has one.
fn query(port: u16, query: &str) -> Option<f64> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    write!(stream, "GET /api/v1/query?query={encoded} HTTP/1.0\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1)?).ok()?;
    body["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// Waits until `query` answers `want` (within 40 s: a scrape a second,
/// and the daemon's own refresh every 10 s).
fn wait_for_value(port: u16, what: &str, want: f64) {
    wait_for(what, Duration::from_secs(40), || {
        query(port, what) == Some(want)
    });
}

/// What `node-keeper`'s endpoint at `port` answers to `GET path`: its
/// status line and body, and how long it took; `None` if it cannot be
/// reached (not listening yet).
fn get(port: u16, path: &str) -> Option<(String, String, Duration)> {
    let began = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.lines().next().unwrap().to_owned();
    Some((status, body.to_owned(), began.elapsed()))
}

/// The value of sample `series` (its name and labels, as written) in the
/// metrics' `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.parse().unwrap())
}

/// Waits until the endpoint at `port` serves `series` at `want`.
fn wait_for_sample(port: u16, series: &str, want: f64) -> String {
    let mut text = String::new();
    wait_for(series, Duration::from_secs(30), || {
        text = get(port, "/metrics")
            .map(|(_, body, _)| body)
            .unwrap_or_default();
        sample(&text, series) == Some(want)
    });
    text
}

/// `check --format prometheus`'s count of findings.
fn check_findings(file: &Path) -> f64 {
    let out = operator(&[
        "check",
        "--config",
        file.to_str().unwrap(),
        "--format",
        "prometheus",
    ]);
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    let found = sample(&text, "ipam_da_pool_check_findings{network=\"pods\"}").unwrap();
    assert_eq!(out.status.success(), found == 0.0, "{out:?}");
    assert!(
        sample(
            &text,
            "ipam_da_pool_check_timestamp_seconds{network=\"pods\"}"
        )
        .unwrap()
            > 1e9
    );
    found
}

#[test]
#[ignore = "needs etcd-server and prometheus"]
fn a_real_prometheus_sees_the_pools_use_the_adds_failures_and_a_fenced_node() {
    let cluster = Cluster::start_with(1, None, &["--quota-backend-bytes=104857600"]);
    let dir = temp_dir("metrics");
    let counts = dir.path().join("counts");
    let mut store = on_etcd(&cluster);
    store["counts"] = json!(counts);
    // .2 to .14: 13 addresses.
    let config = pods(&store, "node-a", json!({}));
    let file = config_file(dir.path(), "pods.conflist", &config);
    let (metrics, api) = (free_port(), free_port());
    let mut node = keeper(&file, metrics);
    let _prometheus = prometheus(dir.path(), metrics, api);
    for n in 0..3 {
        add(&config, &format!("c{n}"), "");
    }
    wait_for_value(api, "ipam_da_pool_used{pool=\"pods\"}", 3.0);
    wait_for_value(api, "ipam_da_pool_free{pool=\"pods\"}", 10.0);
    wait_for_value(
        api,
        "ipam_da_pool_node_used{pool=\"pods\",node=\"node-a\"}",
        3.0,
    );
    // Renewed within the last minute; etcd's quota as it was started.
    wait_for_value(
        api,
        "time() - ipam_da_pool_keeper_last_renewal_timestamp_seconds < bool 60",
        1.0,
    );
    wait_for_value(api, "ipam_da_pool_etcd_quota_bytes", 104857600.0);
    wait_for_value(api, "ipam_da_pool_etcd_db_size_bytes > bool 0", 1.0);
    wait_for_value(api, "ipam_da_pool_etcd_alarms", 0.0);
    wait_for_value(api, "ipam_da_pool_etcd_requests_total > bool 2", 1.0);
    // The text as served passes Prometheus' own linter.
    let (_, text, _) = get(metrics, "/metrics").unwrap();
    let mut lint = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    lint.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let linted = lint.wait_with_output().unwrap();
    assert!(linted.status.success(), "{linted:?}\n{text}");
    assert_eq!(check_findings(&file), 0.0);
    for n in 3..13 {
        add(&config, &format!("c{n}"), "");
    }
    cni("ADD", &config, "c13", "").assert_error(110);
    wait_for_value(
        api,
        "ipam_da_pool_operations_total{command=\"ADD\",code=\"110\"}",
        1.0,
    );
    wait_for_value(api, "ipam_da_pool_node_fenced{node=\"node-a\"}", 0.0);
    // The node gone (its keeper stopped: its registration withdrawn),
    // reclaimed; its keeper back.
    node.stop();
    let reclaimed = operator(&[
        "reclaim",
        "--config",
        file.to_str().unwrap(),
        "--node",
        "node-a",
    ]);
    assert!(reclaimed.status.success(), "{reclaimed:?}");
    node = keeper(&file, metrics);
    wait_for_value(api, "ipam_da_pool_node_fenced{node=\"node-a\"}", 1.0);
    assert_eq!(check_findings(&file), 1.0, "the fence");
    // etcd gone: the store is a gauge at 0, and a scrape still answers
    // at once.
    wait_for_sample(metrics, "ipam_da_pool_store_up{network=\"pods\"}", 1.0);
    drop(cluster);
    let text = wait_for_sample(metrics, "ipam_da_pool_store_up{network=\"pods\"}", 0.0);
    assert!(
        text.contains(
            "ipam_da_pool_operations_total{network=\"pods\",command=\"ADD\",code=\"110\"} 1\n"
        ),
        "{text}"
    );
    for _ in 0..3 {
        let (status, _, took) = get(metrics, "/metrics").unwrap();
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(took < Duration::from_secs(1), "a scrape took {took:?}");
    }
    drop(node);
}

#[test]
#[ignore = "needs the allocator's daemon listening on loopback"]
fn a_keeper_on_a_local_store_serves_the_pools_and_the_counts_alone() {
    let dir = temp_dir("metrics-local");
    let counts = dir.path().join("counts");
    let store = json!({"dataDir": dir.path().join("store"), "counts": counts});
    let config = pods(
        &store,
        "node-a",
        json!({"pools": {"pods": {"ranges": [{"subnet": "10.70.0.0/28"}], "reserved": ["10.70.0.14"]}}}),
    );
    let file = config_file(dir.path(), "pods.conflist", &config);
    let metrics = free_port();
    let node = keeper(&file, metrics);
    let text = wait_for_sample(
        metrics,
        "ipam_da_pool_used{network=\"pods\",pool=\"pods\"}",
        0.0,
    );
    assert_eq!(
        sample(&text, "ipam_da_pool_local_store_bytes{network=\"pods\"}"),
        Some(0.0),
        "{text}"
    );
    for n in 0..2 {
        add(&config, &format!("c{n}"), "");
    }
    cni("DEL", &config, "c0", "");
    let text = wait_for_sample(
        metrics,
        "ipam_da_pool_used{network=\"pods\",pool=\"pods\"}",
        1.0,
    );
    for (series, want) in [
        ("ipam_da_pool_size{network=\"pods\",pool=\"pods\"}", 12.0),
        ("ipam_da_pool_reserved{network=\"pods\",pool=\"pods\"}", 1.0),
        ("ipam_da_pool_free{network=\"pods\",pool=\"pods\"}", 11.0),
        (
            "ipam_da_pool_node_used{network=\"pods\",pool=\"pods\",node=\"node-a\"}",
            1.0,
        ),
        (
            "ipam_da_pool_node_info{network=\"pods\",node=\"node-a\"}",
            1.0,
        ),
        ("ipam_da_pool_store_up{network=\"pods\"}", 1.0),
        (
            "ipam_da_pool_operations_total{network=\"pods\",command=\"ADD\",code=\"0\"}",
            2.0,
        ),
        (
            "ipam_da_pool_operations_total{network=\"pods\",command=\"DEL\",code=\"0\"}",
            1.0,
        ),
        (
            "ipam_da_pool_operation_duration_seconds_count{network=\"pods\",command=\"ADD\"}",
            2.0,
        ),
        ("ipam_da_pool_etcd_requests_total{network=\"pods\"}", 0.0),
        ("ipam_da_pool_counts_skipped_total{network=\"pods\"}", 0.0),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
    assert!(sample(&text, "ipam_da_pool_local_store_bytes{network=\"pods\"}").unwrap() > 0.0);
    assert!(
        !text.contains("ipam_da_pool_node_registered"),
        "nothing to register on files"
    );
    assert_eq!(get(metrics, "/").unwrap().0, "HTTP/1.1 404 Not Found");
    node.stop();
}
