//! The plugin's own cost, measured side by side in one run: N sequential
//! ADDs of a static no-op delegate called directly, and of ipam-delegated
//! running 1 and 16 of them, as ratios to the first (each ratio taken
//! within a round, the variants interleaved so that machine noise falls on
//! all of them alike, and the median of the rounds' ratios reported), for
//! the binary cargo built for the bench (dynamically linked) and for a
//! statically linked one the bench builds (`-C target-feature=+crt-static`);
//! what each delegate after the first costs; the plugin with one delegate
//! against the floor, a program that only forwards to one; the start-up
//! of each plugin of the package (VERSION) against the no-op; the peak RSS
//! of one ADD, and of chains of delegates printing results near the 4 MiB
//! cap; the stripped binaries' sizes; and, for information, host-local
//! with and without the plugin in front. Each figure with a target prints
//! it. Run with `cargo bench --bench overhead`.

#[path = "support/static_build.rs"]
mod static_build;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Calls per measurement.
const CALLS: usize = 100;
/// Measurements per variant, one per round; medians are reported.
const ROUNDS: usize = 15;

const PLUGIN: &str = env!("CARGO_BIN_EXE_ipam-delegated");

/// One way of running an ADD: a program, its stdin, and the environment.
struct Variant {
    label: &'static str,
    program: PathBuf,
    stdin: String,
    env: Vec<(&'static str, String)>,
    /// Set CNI_CONTAINERID per call (host-local keeps one address per ID).
    per_call_id: bool,
    target: Option<f64>,
}

fn main() {
    let work = std::env::temp_dir().join(format!("ipam-delegated-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("bin")).expect("bench directory");
    let noop = build_noop(&work);
    for i in 1..=16 {
        std::os::unix::fs::symlink(&noop, work.join(format!("bin/noop-{i}"))).expect("link");
    }
    let host_local = Path::new("/usr/lib/cni/host-local");

    let large = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/large-result-delegate");
    for i in 1..=32 {
        std::os::unix::fs::symlink(&large, work.join(format!("bin/large-{i}"))).expect("link");
    }
    let stack_of = |name: &str, n: usize| {
        let names: Vec<String> = (1..=n).map(|i| format!("{name}-{i}")).collect();
        serde_json::json!({"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "ipam-delegated", "delegates": names}})
            .to_string()
    };
    let stack = |n: usize| {
        let names: Vec<String> = (1..=n).map(|i| format!("noop-{i}")).collect();
        serde_json::json!({"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "ipam-delegated", "delegates": names}})
            .to_string()
    };
    let env = |cni_path: &Path| {
        vec![
            ("CNI_COMMAND", "ADD".to_string()),
            ("CNI_CONTAINERID", "bench".to_string()),
            ("CNI_NETNS", "/var/run/netns/bench".to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", cni_path.display().to_string()),
        ]
    };
    let mut variants = vec![
        Variant {
            label: "no-op delegate alone",
            program: noop.clone(),
            stdin: stack(1),
            env: env(&work.join("bin")),
            per_call_id: false,
            target: None,
        },
        Variant {
            label: "ipam-delegated, 1 no-op delegate",
            program: PLUGIN.into(),
            stdin: stack(1),
            env: env(&work.join("bin")),
            per_call_id: false,
            target: Some(2.6),
        },
        Variant {
            label: "ipam-delegated, 16 no-op delegates",
            program: PLUGIN.into(),
            stdin: stack(16),
            env: env(&work.join("bin")),
            per_call_id: false,
            target: Some(18.5),
        },
    ];
    let static_plugin = static_build::build_static().join("ipam-delegated");
    for (label, n, target) in [
        ("ipam-delegated static, 1 no-op delegate", 1, 2.6),
        ("ipam-delegated static, 16 no-op delegates", 16, 18.5),
    ] {
        variants.push(Variant {
            label,
            program: static_plugin.clone(),
            stdin: stack(n),
            env: env(&work.join("bin")),
            per_call_id: false,
            target: Some(target),
        });
    }
    // The floor: a program that only hands its stdin to one child.
    let forwarder = build_forwarder(&work);
    let mut forward_env = env(&work.join("bin"));
    forward_env.push(("FORWARD_TO", noop.display().to_string()));
    variants.push(Variant {
        label: "minimal static Rust forwarder, 1 no-op (floor)",
        program: forwarder,
        stdin: stack(1),
        env: forward_env,
        per_call_id: false,
        target: None,
    });
    let host_local_config = |delegated: bool, round_dir: &str| {
        let data = work.join(round_dir).display().to_string();
        let ipam = if delegated {
            serde_json::json!({"type": "ipam-delegated", "delegates": ["host-local"], "ranges": [[{"subnet": "10.250.0.0/16"}]], "dataDir": data})
        } else {
            serde_json::json!({"type": "host-local", "ranges": [[{"subnet": "10.250.0.0/16"}]], "dataDir": data})
        };
        serde_json::json!({"cniVersion": "1.0.0", "name": "bench", "ipam": ipam}).to_string()
    };
    if host_local.exists() {
        variants.push(Variant {
            label: "host-local alone (for information)",
            program: host_local.into(),
            stdin: host_local_config(false, "data-alone"),
            env: env(Path::new("/usr/lib/cni")),
            per_call_id: true,
            target: None,
        });
        variants.push(Variant {
            label: "ipam-delegated, host-local (for information)",
            program: PLUGIN.into(),
            stdin: host_local_config(true, "data-delegated"),
            env: env(Path::new("/usr/lib/cni")),
            per_call_id: true,
            target: None,
        });
    }

    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    for round in 0..ROUNDS {
        for (i, variant) in variants.iter().enumerate() {
            times[i].push(measure(variant, round));
        }
        // host-local's stores fill up: start each round empty.
        let _ = std::fs::remove_dir_all(work.join("data-alone"));
        let _ = std::fs::remove_dir_all(work.join("data-delegated"));
    }

    println!("{CALLS} sequential ADDs per measurement, median of {ROUNDS} rounds:");
    let medians: Vec<Duration> = times.iter_mut().map(|t| median(t)).collect();
    let by_label = |label: &str| {
        let i = variants
            .iter()
            .position(|v| v.label.starts_with(label))
            .expect("a variant");
        (&variants[i], medians[i])
    };
    let base = medians[0];
    for (variant, m) in variants.iter().zip(&medians) {
        let ratio = m.as_secs_f64() / base.as_secs_f64();
        let target = variant
            .target
            .map_or(String::new(), |t| format!("  (target <= {t})"));
        println!(
            "  {:<50} {:>8.1} ms  {:>6.3} ms/ADD  ratio {:>5.2}{target}",
            variant.label,
            m.as_secs_f64() * 1000.0,
            m.as_secs_f64() * 1000.0 / CALLS as f64,
            ratio
        );
    }
    if host_local.exists() {
        let (_, alone) = by_label("host-local alone");
        let (_, delegated) = by_label("ipam-delegated, host-local");
        println!(
            "  ipam-delegated + host-local / host-local alone: {:.2}",
            delegated.as_secs_f64() / alone.as_secs_f64()
        );
    }
    let (_, floor) = by_label("minimal static Rust forwarder");
    let (_, ours) = by_label("ipam-delegated static, 1 ");
    println!(
        "  ipam-delegated static, 1 no-op / the floor: {:.3}",
        ours.as_secs_f64() / floor.as_secs_f64()
    );
    for (label, prefix) in [
        ("dynamic", "ipam-delegated, 1 "),
        ("static", "ipam-delegated static, 1 "),
    ] {
        println!(
            "peak RSS of one ADD, {label}, 1 no-op delegate: {}  (target <= 3072 KiB)",
            peak_rss(by_label(prefix).0)
        );
    }
    // What bounds memory is the 4 MiB cap on what a delegate prints: the
    // plugin holds the input it feeds (the configuration and the previous
    // result) and the output it reads, whatever the chain's length.
    for (n, bytes) in [
        (1, 4_000_000),
        (2, 4_000_000),
        (32, 4_000_000),
        (1, 6_000_000),
    ] {
        let mut env = env(&work.join("bin"));
        env.push(("RESULT_BYTES", bytes.to_string()));
        let variant = Variant {
            label: "large results",
            program: static_plugin.clone(),
            stdin: stack_of("large", n),
            env,
            per_call_id: false,
            target: None,
        };
        let what = if bytes > 4 << 20 {
            "printing 6,000,000 bytes (stopped at the cap)".to_string()
        } else {
            format!("each printing a {bytes}-byte result")
        };
        println!(
            "peak RSS, static, {n} delegate(s) {what}: {}  (bound: about 2 x 4 MiB + the configuration + 2 MiB, whatever the chain's length)",
            peak_rss(&variant)
        );
    }
    for (label, binary) in [
        ("dynamic", Path::new(PLUGIN)),
        ("static", static_plugin.as_path()),
    ] {
        let size = std::fs::metadata(binary).map(|m| m.len()).unwrap_or(0);
        println!(
            "stripped binary, {label}: {size} bytes = {:.2} MiB  (target <= 1.5 MiB)",
            size as f64 / (1024.0 * 1024.0)
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// Builds fixtures/minimal-forwarder.rs, statically linked, with rustc as
/// cargo would call it for a release build.
fn build_forwarder(work: &Path) -> PathBuf {
    let out = work.join("minimal-forwarder");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/minimal-forwarder.rs");
    let built = Command::new("rustc")
        .args([
            "--edition",
            "2021",
            "-O",
            "-C",
            "target-feature=+crt-static",
            "-C",
            "panic=abort",
            "-o",
        ])
        .arg(&out)
        .arg(source)
        .status()
        .expect("rustc runs");
    assert!(built.success(), "building the minimal forwarder failed");
    out
}

/// Builds fixtures/noop-delegate.c, statically linked.
fn build_noop(work: &Path) -> PathBuf {
    let out = work.join("noop-delegate");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/noop-delegate.c");
    let built = Command::new("gcc")
        .args(["-O2", "-static", "-o"])
        .arg(&out)
        .arg(source)
        .status()
        .expect("gcc runs (apt-get install gcc libc6-dev)");
    assert!(built.success(), "gcc -O2 -static failed");
    out
}

/// Wall time of CALLS sequential ADDs of `variant`.
fn measure(variant: &Variant, round: usize) -> Duration {
    let started = Instant::now();
    for call in 0..CALLS {
        let mut cmd = Command::new(&variant.program);
        cmd.env_clear()
            .envs(variant.env.iter().map(|(k, v)| (*k, v)));
        if variant.per_call_id {
            cmd.env("CNI_CONTAINERID", format!("bench-{round}-{call}"));
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(variant.stdin.as_bytes())
            .expect("write stdin");
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{}: {}",
            variant.label,
            String::from_utf8_lossy(&out.stdout)
        );
    }
    started.elapsed()
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Peak RSS of one ADD, as /usr/bin/time reports it.
fn peak_rss(variant: &Variant) -> String {
    let mut child = match Command::new("/usr/bin/time")
        .args(["-f", "%M"])
        .arg(&variant.program)
        .env_clear()
        .envs(variant.env.iter().map(|(k, v)| (*k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(_) => return "n/a (apt-get install time)".into(),
    };
    let _ = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(variant.stdin.as_bytes());
    let out = child.wait_with_output().expect("wait");
    let text = String::from_utf8_lossy(&out.stderr);
    format!("{} KiB", text.lines().last().unwrap_or("?").trim())
}
