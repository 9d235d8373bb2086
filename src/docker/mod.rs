//! `ipam-delegated docker-plugin` (the `ipam-delegated-docker` binary):
//! the CNI stack as a libnetwork remote IPAM driver, so that Docker
//! networks draw their addresses from the same stack (and pools, and etcd
//! cluster) as the CNI runtimes. It is built on ipam-delegated's agent
//! mode (`delegated::agent`): every address Docker asks for is an
//! attachment agent mode runs through the stack and keeps in its state.
//! This module owns its command line (`docker-plugin`, defined and read
//! here, and added by ipam-delegated's binary to its own, where it runs
//! this one) and the socket: where it is, who may use it, serving each
//! connection in a thread of its own, and stopping cleanly on SIGTERM.

mod attachments;
mod driver;
mod error;
mod leftovers;
mod networks;
mod pool_ids;

use std::ffi::OsString;
use std::io::{self, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use crate::args::{self, Opt, Program, Verb};
use crate::dir::{Dir, DirError};
use crate::http::{self, Status};
use crate::netd::ConfigFileError;
use crate::sys::{poll, pollfd, Lock};
use crate::{cni, signals};
use driver::Driver;
pub use error::DockerError;

/// Where Docker looks for plugins' sockets.
const PLUGIN_DIR: &str = "/run/docker/plugins";

/// The most connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 256;

/// How often the threads that wait look for a termination request that
/// another thread read from the signalfd.
const LOOK_FOR_STOP: Duration = Duration::from_secs(1);

/// How often, beyond each network's next request, the driver undoes what
/// requests left to undo (releases that failed, ADDs cut short).
const UNDO_EVERY: Duration = Duration::from_secs(10);

/// How long writing an answer may block on a client that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a request may be: Docker's are a few hundred bytes.
const LIMITS: http::Limits = http::Limits {
    line: 8 * 1024,
    headers: 128,
    body: 1 << 20,
};

/// What the plugin API's answers are.
const CONTENT_TYPE: &str = "application/vnd.docker.plugins.v1+json";

/// The driver's command line: the options of `ipam-delegated
/// docker-plugin`, after the binary's name.
pub const PROGRAM: Program = Program {
    name: "ipam-delegated-docker",
    purpose: "the CNI stack of ipam-delegated as a Docker (libnetwork) remote IPAM driver",
    description: "\
`ipam-delegated docker-plugin` runs it, with the same options.
",
    verbs: &[],
    notes: "",
    command: Some(&COMMAND),
};

/// The driver's binary, installed beside ipam-delegated.
const BINARY: &str = "ipam-delegated-docker";

/// `ipam-delegated docker-plugin`: its options checked as the driver
/// reads them, then the driver's binary run with them.
pub const DOCKER_PLUGIN: Verb = Verb {
    name: "docker-plugin",
    synopsis: "--config PATH [--name NAME | --socket PATH]",
    options: &[
        Opt::value("--config"),
        Opt::value("--name"),
        Opt::value("--socket"),
    ],
    operands: false,
    help: "\
Serve Docker as a remote IPAM driver on
/run/docker/plugins/NAME.sock (NAME ipam-delegated by default)
or on the socket given, for the networks in PATH (a file, or a
directory of them, such as /etc/cni/net.d), until SIGTERM.
Docker networks use it with --ipam-driver NAME
[--ipam-opt network=CNI-NETWORK].
",
    run: |given| Ok(run_driver(given)),
};

/// The driver's one command: `docker-plugin`, served.
const COMMAND: Verb = Verb {
    run: |given| {
        let options = options(given)?;
        Ok(match serve(&options) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        })
    },
    ..DOCKER_PLUGIN
};

/// Runs the command line `args` (without the program name), the options
/// of `ipam-delegated docker-plugin`: serves until asked to stop, exit 0;
/// 1 (after saying why on stderr) if it cannot serve; 2 for a bad command
/// line.
pub fn command_line(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    PROGRAM.main(args)
}

/// `docker-plugin` for ipam-delegated: the driver, a binary of its own
/// beside it, so that the plugin every pod start runs carries none of it;
/// it is given the options as read. Only returns if it cannot be started.
fn run_driver(given: &args::Options) -> ExitCode {
    let options = given.to_args();
    let driver = std::env::current_exe().map(|exe| exe.with_file_name(BINARY));
    let error = match &driver {
        Ok(driver) => std::process::Command::new(driver).args(options).exec(),
        Err(e) => io::Error::new(e.kind(), e.to_string()),
    };
    let place = driver.map_or_else(|_| "beside it".into(), |d| d.display().to_string());
    let _ = writeln!(
        io::stderr(),
        "ipam-delegated: docker-plugin runs {place}, which cannot be started: {error} (install {BINARY} with ipam-delegated)"
    );
    ExitCode::FAILURE
}

/// What `docker-plugin` was asked for.
#[derive(Debug)]
struct Options {
    /// A configuration file, or a directory of them.
    config: PathBuf,
    /// The socket to serve.
    socket: PathBuf,
}

fn options(given: &args::Options) -> Result<Options, String> {
    let config = given.path("--config").ok_or("--config is required")?;
    let name = match given.value("--name") {
        Some(name) if !cni::is_identifier(name) => {
            return Err(format!("--name {name:?} {}", cni::IDENTIFIER_RULE))
        }
        name => name,
    };
    let socket = match (name, given.path("--socket")) {
        (Some(_), Some(_)) => return Err("--name and --socket exclude each other".into()),
        (_, Some(socket)) => socket,
        (name, None) => {
            Path::new(PLUGIN_DIR).join(format!("{}.sock", name.unwrap_or("ipam-delegated")))
        }
    };
    Ok(Options { config, socket })
}

/// Serves the driver on `options.socket` until SIGTERM or SIGINT, then
/// removes the socket and waits for the requests under way (whose
/// delegates are stopped, and an ADD rolled back, as the plugin's are).
fn serve(options: &Options) -> Result<(), DockerError> {
    crate::logging::for_service();
    // Before any thread: they all inherit the blocked signals.
    signals::watch()
        .map_err(|e| DockerError::Request(format!("SIGTERM and SIGINT cannot be taken: {e}")))?;
    let (networks, skipped) = networks::load(&options.config)?;
    for reason in &skipped {
        warn!("skipped {reason}");
    }
    if networks.is_empty() {
        let none = ConfigFileError::new(&options.config, "no network there uses ipam-delegated");
        return Err(none.into());
    }
    let listener = bind(&options.socket)?;
    let names: Vec<&str> = networks.iter().map(|n| n.name.as_str()).collect();
    info!(
        "serving {} for networks {}",
        options.socket.display(),
        names.join(", ")
    );
    let driver = Arc::new(Driver::new(options.config.clone()));
    let config = options.config.clone();
    // At start (what a driver killed mid-request left), then on a timer;
    // it ends with the process.
    std::thread::Builder::new()
        .name("leftovers".into())
        .spawn(move || loop {
            undo_leftovers(&config);
            std::thread::sleep(UNDO_EVERY);
        })
        .map_err(|e| DockerError::Request(format!("cannot start a thread: {e}")))?;
    let load = Arc::new(Load::default());
    let outcome = accept(&listener, &driver, &load);
    // Removed first, so that Docker stops coming while the rest finishes.
    if let Err(e) = std::fs::remove_file(&options.socket) {
        warn!("could not remove {}: {e}", options.socket.display());
    }
    load.wind_down();
    info!("stopped");
    outcome.map_err(|e| socket_error(&options.socket, e))
}

/// Undoes what requests of every network at `config` that has a state
/// directory left to undo.
fn undo_leftovers(config: &Path) {
    let networks = match networks::load(config) {
        Ok((networks, _)) => networks,
        Err(e) => return warn!("{e}"),
    };
    for net in &networks {
        match attachments::lock_existing(net) {
            Ok(Some(state)) => attachments::settle(net, &state),
            Ok(None) => {}
            Err(e) => warn!("network {}: {e}", net.name),
        }
    }
}

/// Accepts connections until a termination request comes.
fn accept(listener: &UnixListener, driver: &Arc<Driver>, load: &Arc<Load>) -> io::Result<()> {
    let signals = signals::fd().map(|fd| fd.as_raw_fd());
    loop {
        let mut fds = [
            pollfd(Some(listener.as_raw_fd()), libc::POLLIN),
            pollfd(signals, libc::POLLIN),
        ];
        // Bounded: a worker's delegate supervision may read the request
        // from the signalfd first; its count is what tells.
        poll(&mut fds, Some(LOOK_FOR_STOP))?;
        if let Some(signal) = signals::received(1) {
            info!("signal {signal}: stopping");
            return Ok(());
        }
        if fds[0].revents == 0 {
            continue;
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                // Out of descriptors, say: the next one may do.
                warn!("accepting a connection failed: {e}");
                signals::wait(Duration::from_millis(100));
                continue;
            }
        };
        if !load.connection_opened() {
            continue;
        }
        let (driver, worker_load) = (Arc::clone(driver), Arc::clone(load));
        let spawned = std::thread::Builder::new().spawn(move || {
            serve_connection(stream, &driver, &worker_load);
            worker_load.connection_closed();
        });
        if let Err(e) = spawned {
            warn!("could not start a thread for a connection: {e}");
            load.connection_closed();
        }
    }
}

/// Answers the requests of one connection until the client closes it.
fn serve_connection(stream: UnixStream, driver: &Driver, load: &Load) {
    if let Err(e) = stream.set_nonblocking(false) {
        warn!("a connection cannot be served: {e}");
        return;
    }
    // No idle timeout: Docker's plugin client reuses its connections for
    // as long as it likes, and a close racing a reuse would fail a request.
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut writer = match stream.try_clone() {
        Ok(writer) => writer,
        Err(e) => {
            warn!("a connection cannot be served: {e}");
            return;
        }
    };
    let mut reader = BufReader::new(stream);
    loop {
        let request = match http::read_request(&mut reader, LIMITS) {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                warn!("a bad request: {e}");
                let body = serde_json::json!({"Err": e.to_string()}).to_string();
                let bad = Status::BadRequest;
                let _ = http::write_response(&mut writer, bad, CONTENT_TYPE, body.as_bytes(), true);
                return;
            }
            Err(_) => return,
        };
        let Some(_busy) = load.request_started() else {
            let body =
                br#"{"Error":"ipam-delegated is stopping: try again later (CNI error code 11)"}"#;
            let _ = http::write_response(&mut writer, Status::Ok, CONTENT_TYPE, body, true);
            return;
        };
        let answer = if request.method == "POST" {
            driver.answer(&request.path, &request.body)
        } else {
            driver::Answer {
                status: Status::NotFound,
                body: br#"{"Err":"only POST is served"}"#.to_vec(),
                undo: None,
            }
        };
        let written = http::write_response(
            &mut writer,
            answer.status,
            CONTENT_TYPE,
            &answer.body,
            request.close,
        );
        if written.is_err() {
            if let Some(undo) = answer.undo {
                driver.undo(undo);
            }
            return;
        }
        if request.close {
            return;
        }
    }
}

/// Connections and requests under way, and whether the driver stops.
#[derive(Default)]
struct Load {
    state: Mutex<Counts>,
    changed: Condvar,
}

#[derive(Default)]
struct Counts {
    connections: usize,
    requests: usize,
    stopping: bool,
}

/// A request under way, until dropped.
struct Busy<'a>(&'a Load);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.update(|counts| counts.requests -= 1);
    }
}

impl Load {
    fn update(&self, change: impl FnOnce(&mut Counts)) {
        let mut counts = self.state.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut counts);
        self.changed.notify_all();
    }

    /// Counts a new connection, once fewer than the most are open; false
    /// if a termination request comes first.
    fn connection_opened(&self) -> bool {
        let mut counts = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while counts.connections >= MAX_CONNECTIONS {
            if signals::received(1).is_some() {
                return false;
            }
            counts = match self.changed.wait_timeout(counts, LOOK_FOR_STOP) {
                Ok((counts, _)) => counts,
                Err(e) => e.into_inner().0,
            };
        }
        counts.connections += 1;
        true
    }

    fn connection_closed(&self) {
        self.update(|counts| counts.connections -= 1);
    }

    /// Counts a request under way; none once the driver stops.
    fn request_started(&self) -> Option<Busy<'_>> {
        let mut counts = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if counts.stopping {
            return None;
        }
        counts.requests += 1;
        Some(Busy(self))
    }

    /// Stops new requests and waits for those under way. Idle connections
    /// are left to end with the process.
    fn wind_down(&self) {
        let mut counts = self.state.lock().unwrap_or_else(|e| e.into_inner());
        counts.stopping = true;
        drop(
            self.changed
                .wait_while(counts, |c| c.requests > 0)
                .unwrap_or_else(|e| e.into_inner()),
        );
    }
}

/// Listens on `socket`, only for its owner and group. A socket left by a
/// driver that is gone is replaced; one a driver still serves, or a file
/// that is not a socket, is an error. The directory is locked meanwhile,
/// so that two drivers starting at once cannot both take the name, and
/// the socket is made under a temporary name and renamed into place once
/// its permissions are set.
fn bind(socket: &Path) -> Result<UnixListener, DockerError> {
    let fail = |e: io::Error| socket_error(socket, e);
    let (Some(dir), Some(name)) = (socket.parent(), socket.file_name()) else {
        return Err(fail(io::ErrorKind::InvalidInput.into()));
    };
    crate::dir::make_all(dir, crate::dir::SHARED_DIR).map_err(fail)?;
    let locked = Dir::open(dir).map_err(fail)?;
    locked.lock(Lock::Exclusive, None)?;
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(socket).is_ok() {
                return Err(fail(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "another driver serves it",
                )));
            }
            info!("replacing the stale socket {}", socket.display());
        }
        Ok(_) => {
            return Err(fail(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "it exists and is not a socket",
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    let temporary = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    match std::fs::remove_file(&temporary) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(fail(e)),
        _ => {}
    }
    let listener = UnixListener::bind(&temporary).map_err(fail)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o660))
        .and_then(|()| std::fs::rename(&temporary, socket))
        .map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            fail(e)
        })?;
    listener.set_nonblocking(true).map_err(fail)?;
    Ok(listener)
}

fn socket_error(socket: &Path, error: io::Error) -> DockerError {
    DirError::io(socket, error).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_options(list: &[&str]) -> Result<Options, String> {
        DOCKER_PLUGIN
            .parse_words(list)
            .and_then(|given| options(&given))
    }

    #[test]
    fn its_synopsis_names_the_options_it_takes() {
        let program = Program {
            verbs: &[DOCKER_PLUGIN],
            command: None,
            ..PROGRAM
        };
        crate::args::assert_synopses(&program);
    }

    #[test]
    fn docker_plugin_serves_docker_s_directory_unless_told_otherwise() {
        let options = parse_options(&["--config", "/etc/cni/net.d"]).unwrap();
        assert_eq!(options.config, PathBuf::from("/etc/cni/net.d"));
        assert_eq!(
            options.socket,
            PathBuf::from("/run/docker/plugins/ipam-delegated.sock")
        );
        let named = parse_options(&["--name=cni", "--config=f"]).unwrap();
        assert_eq!(named.socket, PathBuf::from("/run/docker/plugins/cni.sock"));
        let at = parse_options(&["--config", "f", "--socket", "/x/y.sock"]).unwrap();
        assert_eq!(at.socket, PathBuf::from("/x/y.sock"));
        for (list, problem) in [
            (&["--name", "x"][..], "--config is required"),
            (
                &["--config", "f", "--name", "../x"],
                "--name \"../x\" must start",
            ),
            (
                &["--config", "f", "--name", "a", "--socket", "s"],
                "exclude each other",
            ),
            (&["--config"], "--config needs a value"),
            (
                &["--config", "f", "--bogus", "1"],
                "unknown option \"--bogus\"",
            ),
        ] {
            let problem_found = parse_options(list).unwrap_err();
            assert!(problem_found.contains(problem), "{list:?}: {problem_found}");
        }
    }
}
