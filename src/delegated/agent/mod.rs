//! Agent mode: an address for a node agent (a health endpoint, a DNS
//! cache) through the same stack, outside any container. `ensure` runs
//! CHECK, then DEL, then ADD for a fixed container ID, keeping the result;
//! `release` undoes it; and GC never frees what is kept.

pub mod state;

use std::path::{Path, PathBuf};

use serde_json::Value;
use tracing::warn;

use crate::cni::{self, Command, NetConf, Reportable};
use crate::delegated::config::Config;
use crate::delegated::delegate::{self, Chain, Delegate, Processes};
use crate::delegated::error::DelegatedError;
use state::{Attachment, Network};

/// What tells a plugin built on libcni 1.2 or later that CNI_NETNS being
/// its own namespace is meant.
const NETNS_OVERRIDE: &str = "CNI_NETNS_OVERRIDE";

/// The key under which CNI 1.1 runtimes list the attachments GC must keep.
const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";

/// One agent attachment: which network (from a configuration file), which
/// container ID and interface, and the namespace to report.
#[derive(Debug, Clone)]
pub struct Request {
    /// A conflist, one plugin's configuration, or a directory of them.
    pub config: PathBuf,
    /// Which network of `config` (needed when it has several).
    pub network: Option<String>,
    /// The fixed container ID this use of the address goes by.
    pub id: String,
    /// The interface name (eth0 unless given).
    pub ifname: String,
    /// The network namespace path delegates are given.
    pub netns: String,
    /// CNI_ARGS for the delegates, if any.
    pub args: Option<String>,
}

/// What `ensure`, `release` and the Docker driver work with: the
/// configuration, the directories delegates are found in, and a runner
/// that gives them the attachment's CNI_* variables, as a runtime would.
pub(crate) struct Setup<'a> {
    pub config: Config<'a>,
    path: Vec<PathBuf>,
    runner: Processes,
}

impl<'a> Setup<'a> {
    /// Checks the request and reads the configuration.
    pub fn new(request: &Request, stdin: &'a [u8]) -> Result<Self, DelegatedError> {
        cni::check_container_id("--id", &request.id)?;
        cni::check_ifname("--ifname", &request.ifname)?;
        let config = Config::parse(stdin)?;
        let cni_path = cni::path_outside_runtime(std::env::var_os("CNI_PATH"));
        let mut vars = vec![
            ("CNI_CONTAINERID", request.id.clone()),
            ("CNI_IFNAME", request.ifname.clone()),
            ("CNI_NETNS", request.netns.clone()),
            ("CNI_PATH", cni_path.clone()),
        ];
        // Plugins built on libcni 1.2 or later fail ADD and DEL (code 8)
        // when CNI_NETNS is their own namespace, unless told it is meant:
        // an agent's address is in its own namespace on purpose.
        if is_own_netns(&request.netns) {
            vars.push((NETNS_OVERRIDE, "1".into()));
        }
        if let Some(args) = &request.args {
            vars.push(("CNI_ARGS", args.clone()));
        }
        Ok(Setup {
            config,
            path: cni::search_path(&cni_path),
            runner: Processes::with_env(vars),
        })
    }

    /// The stack for `net` (the configuration, or it with a `prevResult`).
    pub fn chain<'c>(&'c self, net: &'c NetConf<'c>) -> Chain<'c, Processes> {
        Chain::new(net, &self.runner, self.config.timeout)
    }

    /// Every delegate, looked up; the first missing one is the error.
    pub fn find_all(&self) -> Result<Vec<Delegate>, DelegatedError> {
        delegate::all(self.find_each())
    }

    fn find_each(&self) -> Vec<Result<Delegate, DelegatedError>> {
        delegate::resolve_each(&self.config.delegates, &self.path)
    }

    /// DEL on the stack, with `kept` (a result) as `prevResult` if given.
    pub fn del(&self, kept: Option<&[u8]>) -> Result<(), DelegatedError> {
        let input = kept.map(|kept| self.config.net.with_prev_result(kept));
        match &input {
            Some(input) => self.chain(&NetConf::parse(input)?).del(self.find_each()),
            None => self.chain(&self.config.net).del(self.find_each()),
        }
    }

    /// The network's kept attachments, locked.
    pub fn network(&self) -> Result<Network, DelegatedError> {
        Network::lock(&state_root(&self.config), &self.config.net.name)
    }

    /// Keeps `result` for `attachment`; if it cannot, gives the address
    /// back, since unkept it would be lost to everyone.
    pub fn keep(
        &self,
        network: &Network,
        attachment: &Attachment,
        result: Vec<u8>,
    ) -> Result<Vec<u8>, DelegatedError> {
        match network.write(attachment, &result) {
            Ok(()) => Ok(result),
            Err(e) => {
                self.give_back(&result, "could not give back the address it failed to keep");
                Err(e)
            }
        }
    }

    /// Undoes the ADD that gave `result`, which cannot be kept: as a
    /// rollback, which only a second termination request stops, since
    /// unkept the address is lost to everyone. A failure is logged,
    /// prefixed with `failing`.
    fn give_back(&self, result: &[u8], failing: &str) {
        let failures = match self.find_all() {
            Ok(delegates) => self.chain(&self.config.net).undo(&delegates, result),
            Err(e) => vec![e],
        };
        for undo in failures {
            warn!("{failing}: {}", undo.summary());
        }
    }
}

/// Makes sure the attachment holds an address and prints it: the kept
/// result if the stack still confirms it (CHECK), else a fresh ADD after a
/// DEL that frees whatever an earlier run may have left behind, even if
/// its state was lost. A failed ADD keeps no state, unless the DEL before
/// it failed too (the kept result may still hold an address). No verdict
/// from CHECK (timeout, signal, code 11) is the answer, the state kept.
pub fn ensure(request: &Request, stdin: &[u8]) -> Result<Vec<u8>, DelegatedError> {
    let setup = Setup::new(request, stdin)?;
    // Found before the state is touched: a stack that cannot run makes
    // no directory for its network.
    let delegates = setup.find_all()?;
    let network = setup.network()?;
    let attachment = attachment(request);
    let stored = network.read(&attachment)?;

    let version = setup.config.net.cni_version;
    // Kept in the version of the configuration it was made with, which
    // may have changed since: given, checked and deleted in today's.
    let kept = match stored.clone().map(|kept| cni::in_version(kept, version)) {
        Some(Err(e)) => {
            warn!("the kept result cannot be given in cniVersion {version} ({e}): making it again");
            None
        }
        Some(Ok(kept)) => Some(kept),
        None => None,
    };
    // Before 0.4.0 there is no CHECK: the attachment is simply re-made.
    let checkable = cni::check_command(Command::Check, version).is_ok();
    if let Some(kept) = kept.as_ref().filter(|_| checkable) {
        let checking = setup.config.net.with_prev_result(kept);
        match setup.chain(&NetConf::parse(&checking)?).check(&delegates) {
            Ok(()) => return Ok(kept.clone()),
            // No verdict (a timeout, a request to stop, "try again
            // later"): the address may well still be held, and its
            // state keeps it safe from GC; ask again later.
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => warn!(
                "kept result no longer holds, making it again: {}",
                e.summary()
            ),
        }
    }
    // With what was kept, as it is if it cannot be given in today's
    // version: a delegate may still find in it what to free.
    let deleted = setup.del(kept.as_deref().or(stored.as_deref()));
    if let Err(e) = &deleted {
        warn!("DEL before ADD failed, adding anyway: {}", e.summary());
    }
    let added = setup.chain(&setup.config.net).add(&delegates);
    match added {
        Ok(result) => setup.keep(&network, &attachment, result),
        Err(e) => {
            // The state goes only when nothing can still be held. If the
            // DEL before the ADD failed, the kept result may still hold an
            // address: it stays, safe from GC, for the next run's DEL.
            if stored.is_none() || deleted.is_ok() {
                if let Err(forget) = network.remove(&attachment) {
                    warn!(
                        "could not forget the failed attachment: {}",
                        forget.summary()
                    );
                }
            }
            Err(e)
        }
    }
}

/// Gives the attachment's address back (DEL, with the kept result as
/// prevResult if there is one) and forgets it. Releasing what is not held
/// succeeds, as DEL does; a failed DEL keeps the state, to try again.
pub fn release(request: &Request, stdin: &[u8]) -> Result<(), DelegatedError> {
    let setup = Setup::new(request, stdin)?;
    let network = setup.network()?;
    let attachment = attachment(request);
    let stored = network.read(&attachment)?;
    setup.del(stored.as_deref())?;
    network.remove(&attachment)
}

/// What lets GC leave agent mode's attachments alone: the GC input with
/// each kept attachment added to `cni.dev/valid-attachments`, and the
/// network's lock, held until the delegates finish so that `ensure` cannot
/// allocate in between.
pub struct Protected {
    _kept: state::Kept,
    /// `None` when nothing is kept: the runtime's input stands.
    input: Option<Vec<u8>>,
}

impl Protected {
    /// What the delegates' GC gets.
    pub fn input<'a>(&'a self, net: &'a NetConf) -> &'a [u8] {
        self.input.as_deref().unwrap_or(net.raw)
    }
}

/// Keeps agent mode's attachments for `config`'s network from the GC about
/// to run. Creates nothing; waits for the lock no longer than
/// `ipam.timeout` when set.
pub fn protect_from_gc(config: &Config) -> Result<Protected, DelegatedError> {
    let mut valid: Vec<Value> = match config.net.member(VALID_ATTACHMENTS) {
        Some(raw) => serde_json::from_str(raw.get()).map_err(|_| {
            cni::Error::InvalidConfig(format!("\"{VALID_ATTACHMENTS}\" must be an array"))
        })?,
        None => Vec::new(),
    };
    let kept = state::kept_for_gc(&state_root(config), &config.net.name, config.timeout)?;
    if kept.attachments.is_empty() {
        return Ok(Protected {
            _kept: kept,
            input: None,
        });
    }
    for attachment in &kept.attachments {
        let entry = serde_json::json!({"containerID": attachment.id, "ifname": attachment.ifname});
        if !valid.contains(&entry) {
            valid.push(entry);
        }
    }
    let list = Value::Array(valid).to_string();
    let input = config.net.with_member(VALID_ATTACHMENTS, list.as_bytes());
    Ok(Protected {
        _kept: kept,
        input: Some(input),
    })
}

/// Whether `netns` is the network namespace this process runs in (as
/// libcni compares them: the same namespace file, however named).
fn is_own_netns(netns: &str) -> bool {
    delegate::same_file(Path::new(netns), Path::new("/proc/self/ns/net"))
}

/// Where agent mode keeps its attachments for `config`.
pub fn state_root(config: &Config) -> PathBuf {
    config
        .state_dir
        .clone()
        .unwrap_or_else(|| state::DEFAULT_DIR.into())
}

fn attachment(request: &Request) -> Attachment {
    Attachment {
        id: request.id.clone(),
        ifname: request.ifname.clone(),
    }
}
