//! The plugin's own cost, measured side by side in one run: N sequential
//! ADDs of a static no-op delegate called directly, and of ipam-delegated
//! running 1 and 16 of them, as ratios to the first (each ratio taken
//! within a round, the variants interleaved in an order rotated each round, so that machine noise falls on
//! all of them alike, and the median of the rounds' ratios reported), for
//! the binary cargo built for the bench (dynamically linked) and for a
//! statically linked one the bench builds (as the README's Install does);
//! what each delegate after the first costs; the plugin with one delegate
//! against the floor, a program that only forwards to one; the start-up
//! of each plugin of the package (VERSION) against the no-op; the
//! allocator's ADD on a local store with its count left for the node's
//! metrics against one without; the peak RSS
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

/// One way of running a call: a program, its stdin, and the environment.
struct Variant {
    label: &'static str,
    program: PathBuf,
    stdin: String,
    env: Vec<(&'static str, String)>,
    /// Set CNI_CONTAINERID per call (host-local keeps one address per ID).
    per_call_id: bool,
}

fn main() {
    let work = std::env::temp_dir().join(format!("ipam-delegated-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("bin")).expect("bench directory");
    let noop = static_build::build_noop(&work, "gcc");
    // Hard links: the very file the baseline calls, at a path with no
    // symbolic link to resolve (three resolutions, lookup and exec, cost a
    // delegate about 0.05 no-ops here, nothing to do with the plugin).
    for i in 1..=16 {
        std::fs::hard_link(&noop, work.join(format!("bin/noop-{i}"))).expect("link");
    }
    let large = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/large-result-delegate");
    for i in 1..=32 {
        std::os::unix::fs::symlink(&large, work.join(format!("bin/large-{i}"))).expect("link");
    }
    let host_local = Path::new("/usr/lib/cni/host-local");
    let built = install(
        &static_build::build_static(),
        &[
            "ipam-delegated",
            "ipam-ds-static",
            "ipam-da-pool",
            "ipam-delegated-docker",
        ],
        &work.join("static"),
    );
    let static_plugin = built.join("ipam-delegated");
    let forwarder = build_forwarder(&work);
    let dynamic = install(
        Path::new(PLUGIN).parent().expect("a directory"),
        &["ipam-delegated"],
        &work.join("dynamic"),
    )
    .join("ipam-delegated");

    let stack_of = |name: &str, n: usize| {
        let names: Vec<String> = (1..=n).map(|i| format!("{name}-{i}")).collect();
        serde_json::json!({"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "ipam-delegated", "delegates": names}})
            .to_string()
    };
    let env = |command: &str, cni_path: &Path| {
        vec![
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", "bench".to_string()),
            ("CNI_NETNS", "/var/run/netns/bench".to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", cni_path.display().to_string()),
        ]
    };
    let bin = work.join("bin");
    let add = |label, program: &Path, delegates: usize| Variant {
        label,
        program: program.to_owned(),
        stdin: stack_of("noop", delegates),
        env: env("ADD", &bin),
        per_call_id: false,
    };
    let version = |label, program: PathBuf| Variant {
        label,
        program,
        stdin: r#"{"cniVersion": "1.0.0"}"#.into(),
        env: vec![("CNI_COMMAND", "VERSION".into())],
        per_call_id: false,
    };
    let mut forward = add(
        "minimal static Rust forwarder, 1 no-op (the floor)",
        &forwarder,
        1,
    );
    forward.env.push(("FORWARD_TO", noop.display().to_string()));
    let mut variants = vec![
        add("no-op delegate alone", &noop, 1),
        add("ipam-delegated, 1 no-op delegate", &dynamic, 1),
        add("ipam-delegated, 16 no-op delegates", &dynamic, 16),
        add("ipam-delegated static, 1 no-op delegate", &static_plugin, 1),
        add(
            "ipam-delegated static, 16 no-op delegates",
            &static_plugin,
            16,
        ),
        forward,
        version("ipam-delegated static, VERSION", static_plugin.clone()),
        version(
            "ipam-ds-static static, VERSION",
            built.join("ipam-ds-static"),
        ),
        version("ipam-da-pool static, VERSION", built.join("ipam-da-pool")),
    ];
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
        for (label, program, delegated, data) in [
            ("host-local alone", host_local, false, "data-alone"),
            (
                "ipam-delegated, host-local",
                dynamic.as_path(),
                true,
                "data-delegated",
            ),
        ] {
            variants.push(Variant {
                label,
                program: program.to_owned(),
                stdin: host_local_config(delegated, data),
                env: env("ADD", Path::new("/usr/lib/cni")),
                per_call_id: true,
            });
        }
    }

    // The allocator's ADD on a local store, with its count left for the
    // node's metrics and without: each round's stores start empty.
    let pool_config = |counts: serde_json::Value, data: &str| {
        serde_json::json!({"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "ipam-da-pool", "pool": {
            "dataDir": work.join(data), "node": "bench", "default": "p",
            "pools": {"p": [{"subnet": "10.251.0.0/16"}]}, "counts": counts}}})
        .to_string()
    };
    for (label, counts, data) in [
        (
            "ipam-da-pool static, ADD, counting off",
            serde_json::json!(false),
            "data-uncounted",
        ),
        (
            "ipam-da-pool static, ADD, counting on",
            serde_json::json!(work.join("counts")),
            "data-counted",
        ),
    ] {
        variants.push(Variant {
            label,
            program: built.join("ipam-da-pool"),
            stdin: pool_config(counts, data),
            env: env("ADD", &bin),
            per_call_id: true,
        });
    }

    // times[v][round]: one measurement of every variant per round.
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..ROUNDS {
        // Each round starts one variant further on, so that no variant
        // always follows the same one (a heavy one leaves caches and
        // frequencies behind it).
        let n = variants.len();
        for i in (0..n).map(|k| (k + round) % n) {
            let time = measure(&variants[i], round).as_secs_f64() / CALLS as f64;
            times[i].push(time);
        }
        // host-local's stores fill up: start each round empty.
        let _ = std::fs::remove_dir_all(work.join("data-alone"));
        let _ = std::fs::remove_dir_all(work.join("data-delegated"));
        let _ = std::fs::remove_dir_all(work.join("data-uncounted"));
        let _ = std::fs::remove_dir_all(work.join("data-counted"));
    }
    let of = |label: &str| {
        let i = variants.iter().position(|v| v.label == label);
        &times[i.expect("a variant")]
    };
    // The median over the rounds of f(round).
    let per_round = |f: &dyn Fn(usize) -> f64| median((0..ROUNDS).map(f).collect());
    let noop_time = of("no-op delegate alone");
    let ratio = |label: &str| per_round(&|r| of(label)[r] / noop_time[r]);

    println!(
        "{CALLS} sequential calls per measurement, {ROUNDS} rounds; ratios to the no-op delegate called directly in the same round, median of the rounds:"
    );
    let targets = [
        ("ipam-delegated static, 1 no-op delegate", "<= 2.6"),
        ("ipam-delegated static, 16 no-op delegates", "<= 18.0"),
    ];
    for (variant, times) in variants.iter().zip(&times) {
        let target = targets
            .iter()
            .find(|(label, _)| *label == variant.label)
            .map_or(String::new(), |(_, t)| format!("  (target {t})"));
        println!(
            "  {:<52} {:>6.3} ms/call  ratio {:>5.2}{target}",
            variant.label,
            median(times.clone()) * 1000.0,
            ratio(variant.label)
        );
    }
    println!("each delegate after the first, in no-op delegates called directly (16 delegates against 1, over 15):");
    for (flavour, prefix, target) in [
        ("static", "ipam-delegated static", "  (target <= 1.05)"),
        ("dynamic", "ipam-delegated", ""),
    ] {
        let (one, sixteen) = (
            of(&format!("{prefix}, 1 no-op delegate")),
            of(&format!("{prefix}, 16 no-op delegates")),
        );
        let extra = per_round(&|r| (sixteen[r] - one[r]) / 15.0 / noop_time[r]);
        println!("  {flavour:<8} {extra:.3}{target}");
    }
    let (ours, floor) = (
        of("ipam-delegated static, 1 no-op delegate"),
        of("minimal static Rust forwarder, 1 no-op (the floor)"),
    );
    println!(
        "ipam-delegated static, 1 no-op / the floor: {:.3}  (target <= 1.05)",
        per_round(&|r| ours[r] / floor[r])
    );
    let (counted, uncounted) = (
        of("ipam-da-pool static, ADD, counting on"),
        of("ipam-da-pool static, ADD, counting off"),
    );
    println!(
        "ipam-da-pool ADD, its count left for the metrics / not: {:.3}  (target <= 1.02)",
        per_round(&|r| counted[r] / uncounted[r])
    );
    if host_local.exists() {
        let (alone, delegated) = (of("host-local alone"), of("ipam-delegated, host-local"));
        println!(
            "ipam-delegated + host-local / host-local alone (for information): {:.2}",
            per_round(&|r| delegated[r] / alone[r])
        );
    }
    for (flavour, program) in [("dynamic", &dynamic), ("static", &static_plugin)] {
        println!(
            "peak RSS of one ADD, {flavour}, 1 no-op delegate: {}  (target <= 3072 KiB)",
            peak_rss(&add("one ADD", program, 1))
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
        let mut env = env("ADD", &bin);
        env.push(("RESULT_BYTES", bytes.to_string()));
        let variant = Variant {
            label: "large results",
            program: static_plugin.clone(),
            stdin: stack_of("large", n),
            env,
            per_call_id: false,
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
        ("ipam-delegated, dynamic", dynamic.as_path()),
        ("ipam-delegated, static", static_plugin.as_path()),
    ] {
        let size = std::fs::metadata(binary).map(|m| m.len()).unwrap_or(0);
        println!(
            "stripped binary, {label}: {size} bytes = {:.2} MiB  (target <= 1.5 MiB)",
            size as f64 / (1024.0 * 1024.0)
        );
    }
    for name in ["ipam-ds-static", "ipam-da-pool", "ipam-delegated-docker"] {
        let size = std::fs::metadata(built.join(name))
            .map(|m| m.len())
            .unwrap_or(0);
        println!("stripped binary, {name}, static: {size} bytes");
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// Builds fixtures/minimal-forwarder.rs, statically linked with the flags
/// and the target of the plugin's static build, with rustc as cargo would call it for a
/// release build.
fn build_forwarder(work: &Path) -> PathBuf {
    let out = work.join("build/minimal-forwarder");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/minimal-forwarder.rs");
    let built = Command::new("rustc")
        .args(["--edition", "2021", "-O", "-C", "panic=abort"])
        .args(static_build::STATIC_RUSTFLAGS)
        .args(["--target", static_build::STATIC_TARGET])
        .arg("-o")
        .arg(&out)
        .arg(source)
        .status()
        .expect("rustc runs");
    assert!(built.success(), "building the minimal forwarder failed");
    install(&work.join("build"), &["minimal-forwarder"], work).join("minimal-forwarder")
}

/// Copies the programs `names` from `from` into `to`, as an installation
/// does (`cp`, `install`, a package), and returns `to`. Every program is
/// measured as installed, never as its linker left it: on this machine's
/// kernel (6.18, ext4) a program runs from the page cache that wrote it,
/// and one the linker wrote runs about 10% slower than a copy of it (the
/// no-op 370 µs against 337 µs; the floor 880 µs against 795 µs), by as
/// much as the plugin's own cost.
fn install(from: &Path, names: &[&str], to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).expect("install directory");
    for name in names {
        std::fs::copy(from.join(name), to.join(name)).expect("install a program");
    }
    to.to_owned()
}

/// Wall time of CALLS sequential calls of `variant`.
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

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
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
