//! Test harness: a private CNI_PATH of scripted and real delegates, the
//! built plugin run against it, and what each delegate recorded.

pub mod etcd;
pub mod neutron;

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use serde_json::Value;

/// The plugin binary cargo built for these tests.
pub const PLUGIN: &str = env!("CARGO_BIN_EXE_ipam-delegated");
/// The selector and the allocator, built with it.
pub const SELECTOR: &str = env!("CARGO_BIN_EXE_ipam-ds-static");
pub const ALLOCATOR: &str = env!("CARGO_BIN_EXE_ipam-da-pool");
/// The allocator whose addresses are a network controller's ports.
pub const PORT_ALLOCATOR: &str = env!("CARGO_BIN_EXE_ipam-da-neutron");

pub use tempfile::TempDir;

/// Where Debian's libfaketime is, to run a program on a skewed clock
/// (`LD_PRELOAD`, with `FAKETIME` the offset).
pub fn libfaketime() -> PathBuf {
    let found = fs::read_dir("/usr/lib")
        .unwrap()
        .filter_map(|entry| Some(entry.ok()?.path().join("faketime/libfaketime.so.1")))
        .find(|path| path.exists());
    found.expect("libfaketime (Debian's package faketime) is installed")
}

/// A new directory named after `tag`, removed when dropped; readable by
/// every user, as the runtimes' directories are (a test runs the plugin as
/// another user).
pub fn temp_dir(tag: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("ipam-delegated-test-{tag}-"))
        .permissions(fs::Permissions::from_mode(0o755))
        .tempdir()
        .expect("a temporary directory")
}

/// What one plugin run produced.
pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl std::fmt::Debug for Outcome {
    /// Stdout as text, so that a failure message can be read.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("status", &self.status)
            .field("stdout", &String::from_utf8_lossy(&self.stdout))
            .field("stderr", &self.stderr)
            .finish()
    }
}

impl Outcome {
    /// Stdout as one JSON value; fails the test if it is anything else.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON value ({e}): {:?}",
                String::from_utf8_lossy(&self.stdout)
            )
        })
    }

    /// Asserts success with nothing on stdout.
    pub fn assert_silent_success(&self) {
        assert!(self.status.success(), "expected success: {self:?}");
        assert!(
            self.stdout.is_empty(),
            "expected no output: {:?}",
            String::from_utf8_lossy(&self.stdout)
        );
    }

    /// Asserts a failure reported as exactly one CNI error object with
    /// `code`, and returns it.
    pub fn assert_error(&self, code: u64) -> Value {
        assert!(!self.status.success(), "expected failure: {self:?}");
        let error = self.json();
        let keys: Vec<&str> = error
            .as_object()
            .expect("error is an object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["cniVersion", "code", "msg", "details"], "{error}");
        assert_eq!(error["code"], code, "{error}");
        assert!(
            error["msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{error}"
        );
        error
    }
}

/// The plugin's environment, built explicitly so tests control all of it.
#[derive(Clone, Debug)]
pub struct Env(pub Vec<(String, String)>);

impl Env {
    pub fn set(mut self, key: &str, value: &str) -> Env {
        self.0.retain(|(k, _)| k != key);
        self.0.push((key.into(), value.into()));
        self
    }

    pub fn unset(mut self, key: &str) -> Env {
        self.0.retain(|(k, _)| k != key);
        self
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Runs the plugin with exactly `env` and `stdin`.
pub fn run_plugin(env: &Env, stdin: &[u8]) -> Outcome {
    run_plugin_in(Path::new("/"), env, stdin)
}

/// Runs the plugin in working directory `cwd` with exactly `env` and `stdin`.
pub fn run_plugin_in(cwd: &Path, env: &Env, stdin: &[u8]) -> Outcome {
    run_command(cwd, &[], env, stdin)
}

/// Starts the plugin in `cwd` with `args`, exactly `env`, and `stderr`;
/// stdin and stdout are pipes, left to the caller.
pub fn spawn_plugin(cwd: &Path, args: &[&str], env: &Env, stderr: Stdio) -> std::process::Child {
    spawn_program(PLUGIN, cwd, args, env, stderr)
}

/// Starts `program` as [`spawn_plugin`] starts the plugin.
pub fn spawn_program(
    program: &str,
    cwd: &Path,
    args: &[&str],
    env: &Env,
    stderr: Stdio,
) -> std::process::Child {
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env.0.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr);
    // A binary a test has just copied may still be open for writing in a
    // child another test thread forked meanwhile, until that child execs:
    // ETXTBSY for a moment, not a failure.
    for _ in 0..100 {
        match command.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            started => return started.expect("plugin starts"),
        }
    }
    command.spawn().expect("plugin starts")
}

/// Starts the plugin with `env` and feeds it `stdin` (small enough for a
/// pipe), without waiting for it.
pub fn start_plugin(env: &Env, stdin: &[u8], stderr: Stdio) -> std::process::Child {
    let mut child = spawn_plugin(Path::new("/"), &[], env, stderr);
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child
}

/// Runs the plugin with `stdin` and `stdout` as its standard output (a
/// full device, a pipe nobody reads), returning its exit status and stderr.
pub fn run_plugin_to(env: &Env, stdin: &[u8], stdout: Stdio) -> (ExitStatus, String) {
    let mut child = Command::new(PLUGIN)
        .env_clear()
        .envs(env.0.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("plugin starts");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the binary's command line `args` with exactly `env`.
pub fn run_cli(args: &[&str], env: &Env) -> Outcome {
    run_command(Path::new("/"), args, env, b"")
}

fn run_command(cwd: &Path, args: &[&str], env: &Env, stdin: &[u8]) -> Outcome {
    run_program(PLUGIN, cwd, args, env, stdin)
}

/// Runs `program` as [`run_program`] does, under umask `umask` (an octal
/// string): what a hostile or careless umask makes of what it creates.
pub fn run_under_umask(
    umask: &str,
    program: &str,
    args: &[&str],
    env: &Env,
    stdin: &[u8],
) -> Outcome {
    let script = format!("umask {umask}; exec \"$0\" \"$@\"");
    let mut all = vec!["-c", script.as_str(), program];
    all.extend_from_slice(args);
    run_program("/bin/sh", Path::new("/"), &all, env, stdin)
}

/// The permission bits of `path`.
pub fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Runs `program` in `cwd` with `args`, exactly `env`, and `stdin`.
pub fn run_program(program: &str, cwd: &Path, args: &[&str], env: &Env, stdin: &[u8]) -> Outcome {
    let mut child = spawn_program(program, cwd, args, env, Stdio::piped());
    // Written from a thread: a large input must not block reading the output.
    let mut pipe = child.stdin.take().unwrap();
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    Outcome {
        status: out.status,
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A private CNI_PATH directory of delegates, and the directory where
/// scripted delegates record their calls and read their answers.
pub struct Stack {
    pub dir: TempDir,
}

/// How a scripted delegate answers one command.
#[derive(Default, Clone)]
pub struct Answer {
    /// A shell snippet the delegate runs before it answers.
    pub run: Option<String>,
    pub stdout: Option<Vec<u8>>,
    pub stderr: Option<String>,
    pub exit: Option<i32>,
    pub signal: Option<&'static str>,
}

impl Answer {
    pub fn prints(stdout: impl AsRef<[u8]>) -> Answer {
        Answer {
            stdout: Some(stdout.as_ref().to_vec()),
            ..Answer::default()
        }
    }

    pub fn fails(exit: i32, stdout: impl AsRef<[u8]>) -> Answer {
        Answer {
            stdout: Some(stdout.as_ref().to_vec()),
            exit: Some(exit),
            ..Answer::default()
        }
    }

    /// Runs `snippet` (sh), then answers as `self` says.
    pub fn after(self, snippet: &str) -> Answer {
        Answer {
            run: Some(snippet.into()),
            ..self
        }
    }

    pub fn killed(signal: &'static str) -> Answer {
        Answer {
            signal: Some(signal),
            ..Answer::default()
        }
    }
}

/// A delegate's call as recorded: its position in the whole run, name and command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub n: usize,
    pub name: String,
    pub command: String,
}

impl Stack {
    pub fn new() -> Stack {
        let dir = temp_dir("stack");
        fs::create_dir(dir.path().join("bin")).unwrap();
        fs::create_dir(dir.path().join("rec")).unwrap();
        Stack { dir }
    }

    /// A stack of scripted delegates with these names.
    pub fn of(names: &[&str]) -> Stack {
        let stack = Stack::new();
        for name in names {
            stack.fake(name);
        }
        stack
    }

    pub fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    pub fn rec(&self) -> PathBuf {
        self.dir.path().join("rec")
    }

    /// Adds the scripted delegate under `name`.
    pub fn fake(&self, name: &str) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-delegate");
        symlink(script, self.bin().join(name)).unwrap();
    }

    /// Adds the crate's selector and allocator under their names.
    pub fn with_pool_plugins(self) -> Stack {
        self.link("ipam-ds-static", Path::new(SELECTOR));
        self.link("ipam-da-pool", Path::new(ALLOCATOR));
        self
    }

    /// Adds the crate's selector and port allocator under their names.
    pub fn with_neutron_plugins(self) -> Stack {
        self.link("ipam-ds-static", Path::new(SELECTOR));
        self.link("ipam-da-neutron", Path::new(PORT_ALLOCATOR));
        self
    }

    /// Adds `target` (a real plugin) under `name`.
    pub fn link(&self, name: &str, target: &Path) {
        symlink(target, self.bin().join(name)).unwrap();
    }

    /// Adds an executable file with this content under `name`.
    pub fn file(&self, name: &str, content: &str, mode: u32) {
        let path = self.bin().join(name);
        fs::write(&path, content).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Tells scripted delegate `name` how to answer `command`.
    pub fn answer(&self, name: &str, command: &str, answer: Answer) {
        write_answer(&self.rec(), name, command, answer);
    }

    /// A full ADD environment pointing at this stack.
    pub fn env(&self, command: &str) -> Env {
        Env(vec![
            ("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into()),
            ("CNI_COMMAND".into(), command.into()),
            ("CNI_CONTAINERID".into(), "ctr-0123".into()),
            ("CNI_NETNS".into(), "/var/run/netns/test".into()),
            ("CNI_IFNAME".into(), "eth0".into()),
            ("CNI_PATH".into(), self.bin().display().to_string()),
            ("CNI_ARGS".into(), "IgnoreUnknown=1;K8S_POD_NAME=p".into()),
            ("FAKE_DELEGATE_DIR".into(), self.rec().display().to_string()),
            // The verbose flavour logs here, not to the machine's /var/log.
            (
                "IPAM_DELEGATED_LOG_FILE".into(),
                self.dir.path().join("plugin.log").display().to_string(),
            ),
        ])
    }

    pub fn run(&self, command: &str, stdin: &[u8]) -> Outcome {
        run_plugin(&self.env(command), stdin)
    }

    /// Every call the scripted delegates recorded, in order.
    pub fn calls(&self) -> Vec<Call> {
        recorded_calls(&self.rec())
    }

    /// The calls as "name COMMAND" strings, for compact assertions.
    pub fn call_list(&self) -> Vec<String> {
        self.calls()
            .iter()
            .map(|c| format!("{} {}", c.name, c.command))
            .collect()
    }

    /// What call `call` read on stdin.
    pub fn stdin_of(&self, call: &Call) -> Vec<u8> {
        recorded_stdin(&self.rec(), call)
    }

    /// The environment call `call` ran with.
    pub fn env_of(&self, call: &Call) -> HashMap<String, String> {
        recorded_env(&self.rec(), call)
    }
}

/// The calls scripted delegates recorded in `rec`, in order.
pub fn recorded_calls(rec: &Path) -> Vec<Call> {
    let text = fs::read_to_string(rec.join("calls")).unwrap_or_default();
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let (name, command) = line.split_once(' ').unwrap();
            Call {
                n: i + 1,
                name: name.into(),
                command: command.into(),
            }
        })
        .collect()
}

/// What call `call`, recorded in `rec`, read on stdin.
pub fn recorded_stdin(rec: &Path, call: &Call) -> Vec<u8> {
    fs::read(rec.join(format!("{}.{}.{}.stdin", call.n, call.name, call.command))).unwrap()
}

/// The environment call `call`, recorded in `rec`, ran with.
pub fn recorded_env(rec: &Path, call: &Call) -> HashMap<String, String> {
    let raw = fs::read(rec.join(format!("{}.{}.{}.env", call.n, call.name, call.command))).unwrap();
    raw.split(|b| *b == 0)
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

/// A configuration for a stack of these delegates, with extra ipam keys.
pub fn config(version: &str, delegates: &[&str]) -> String {
    serde_json::json!({
        "cniVersion": version,
        "name": "testnet",
        "type": "bridge",
        "ipam": {"type": "ipam-delegated", "delegates": delegates},
    })
    .to_string()
}

/// A network configuration whose stack is the crate's selector, then its
/// allocator, with these settings (`ipam.static`, `ipam.pool`).
pub fn pool_config(name: &str, version: &str, selector: Value, allocator: Value) -> String {
    serde_json::json!({
        "cniVersion": version,
        "name": name,
        "type": "bridge",
        "ipam": {
            "type": "ipam-delegated",
            "delegates": ["ipam-ds-static", "ipam-da-pool"],
            "static": selector,
            "pool": allocator,
        },
    })
    .to_string()
}

/// `config` with `ipam.stateDir` in `stack`'s own directory: GC takes
/// agent mode's lock there, not under the machine's /var/lib.
pub fn with_state_dir(stack: &Stack, config: &str) -> String {
    let mut value: Value = serde_json::from_str(config).unwrap();
    value["ipam"]["stateDir"] = serde_json::json!(stack.dir.path().join("state"));
    value.to_string()
}

/// The input with `prevResult` set as the plugin must build it: compact,
/// keys in order, `result` inserted as printed.
pub fn with_prev(input: &str, result: &str) -> Vec<u8> {
    let mut v: serde_json::Map<String, Value> = serde_json::from_str(input).unwrap();
    v.insert("prevResult".into(), serde_json::from_str(result).unwrap());
    serde_json::to_vec(&v).unwrap()
}

/// Tells scripted delegate `name`, recording in `rec`, how to answer `command`.
pub fn write_answer(rec: &Path, name: &str, command: &str, answer: Answer) {
    let plan = |ext: &str| rec.join(format!("{name}.{command}.{ext}"));
    if let Some(run) = answer.run {
        fs::write(plan("run"), run).unwrap();
    }
    if let Some(stdout) = answer.stdout {
        fs::write(plan("stdout"), stdout).unwrap();
    }
    if let Some(stderr) = answer.stderr {
        fs::write(plan("stderr"), stderr).unwrap();
    }
    if let Some(exit) = answer.exit {
        fs::write(plan("exit"), exit.to_string()).unwrap();
    }
    if let Some(signal) = answer.signal {
        fs::write(plan("signal"), signal).unwrap();
    }
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Where Debian installs the real CNI plugins (CNI_PLUGINS_DIR says
/// otherwise). Tests that use them are marked `#[ignore = "needs …"]`:
/// run with --include-ignored, they fail, saying so, when the plugins are
/// missing.
pub fn real_plugins() -> PathBuf {
    let dir =
        PathBuf::from(std::env::var("CNI_PLUGINS_DIR").unwrap_or_else(|_| "/usr/lib/cni".into()));
    assert!(
        dir.join("host-local").is_file() && dir.join("static").is_file(),
        "Debian's CNI plugins are not in {} (apt-get install containernetworking-plugins; ./.ci/test installs them)",
        dir.display()
    );
    dir
}

/// Holds `address` for container `id` while `hold` runs, as a marker file
/// in `dir` that only one holder can make: a second holder of the same
/// address at the same time fails the test. The stress tests call it from
/// an ADD's answer to the start of its DEL, the span in which the
/// container surely holds the address.
pub fn while_held(dir: &Path, address: &str, id: &str, hold: impl FnOnce()) {
    let marker = dir.join(address.replace('/', "_"));
    let made = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&marker);
    assert!(
        made.is_ok(),
        "{address} given to {id} while another holds it"
    );
    hold();
    fs::remove_file(&marker).unwrap();
}

/// A cgroup name under every hierarchy, its whole tree removed when dropped.
pub struct Cgroups(pub String);

impl Drop for Cgroups {
    fn drop(&mut self) {
        fn remove_tree(dir: &Path) {
            for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_tree(&entry.path());
                }
            }
            let _ = fs::remove_dir(dir);
        }
        remove_tree(&Path::new("/sys/fs/cgroup").join(&self.0));
        for hierarchy in fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            remove_tree(&hierarchy.path().join(&self.0));
        }
    }
}
