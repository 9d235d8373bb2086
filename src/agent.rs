//! Agent mode: an address for a node agent (a health endpoint, a DNS
//! cache) through the same stack, outside any container. `ensure` runs
//! CHECK, then DEL, then ADD for a fixed container ID, keeping the result;
//! `release` undoes it; and GC never frees what is kept.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tracing::warn;

use crate::config::Config;
use crate::delegate;
use crate::environment::{self, Command};
use crate::error::Error;
use crate::state::{self, Attachment, Network};
use crate::version;

/// What tells a plugin built on libcni 1.2 or later that CNI_NETNS being
/// its own namespace is meant.
const NETNS_OVERRIDE: &str = "CNI_NETNS_OVERRIDE";

/// Where delegates are looked for when CNI_PATH is not set.
pub const DEFAULT_CNI_PATH: &str = "/opt/cni/bin";

/// The key under which CNI 1.1 runtimes list the attachments GC must keep.
const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";

/// One agent attachment: which network (from a configuration file), which
/// container ID and interface, and the namespace to report.
#[derive(Debug, Clone)]
pub struct Request {
    /// A conflist, or one plugin's configuration.
    pub config: PathBuf,
    /// The fixed container ID this use of the address goes by.
    pub id: String,
    /// The interface name (eth0 unless given).
    pub ifname: String,
    /// The network namespace path delegates are given.
    pub netns: String,
}

/// Makes sure the attachment holds an address and prints it: the kept
/// result if the stack still confirms it (CHECK), else a fresh ADD after a
/// DEL that frees whatever an earlier run may have left behind, even if
/// its state was lost. A failed ADD keeps no state, unless the DEL before
/// it failed too (the kept result may still hold an address). No verdict
/// from CHECK (timeout, signal, code 11) is the answer, the state kept.
pub fn ensure(request: &Request, stdin: &[u8]) -> Result<Vec<u8>, Error> {
    let (config, dirs) = prepare(request, stdin)?;
    let network = Network::lock(&state_root(&config), &config.name)?;
    let attachment = attachment(request);
    let stored = network.read(&attachment)?;
    let delegates = delegate::resolve(&config.delegates, &dirs)?;

    if let Some(stored) = &stored {
        // Before 0.4.0 there is no CHECK: the attachment is simply re-made.
        if version::check_command(Command::Check, config.cni_version).is_ok() {
            let checking = config.with_prev_result(stored);
            match delegate::check(&Config::parse(&checking)?, &delegates) {
                Ok(()) => return Ok(stored.clone()),
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
    }
    let deleting = stored
        .as_deref()
        .map_or_else(|| stdin.to_vec(), |s| config.with_prev_result(s));
    let deleted = delegate::del(&Config::parse(&deleting)?, find_each(&config, &dirs));
    if let Err(e) = &deleted {
        warn!("DEL before ADD failed, adding anyway: {}", e.summary());
    }
    match delegate::add(&config, &delegates) {
        Ok(result) => match network.write(&attachment, &result) {
            Ok(()) => Ok(result),
            Err(e) => {
                // Unkept, the address would be lost to everyone: give it back.
                let giving_back = config.with_prev_result(&result);
                let undone = Config::parse(&giving_back)
                    .and_then(|c| delegate::del(&c, find_each(&config, &dirs)));
                if let Err(undo) = undone {
                    warn!(
                        "could not give back the address it failed to keep: {}",
                        undo.summary()
                    );
                }
                Err(e)
            }
        },
        Err(e) => {
            // Forgotten only if nothing can still be held: what the DEL
            // could not free stays kept, safe from GC, for the next run to DEL.
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
pub fn release(request: &Request, stdin: &[u8]) -> Result<(), Error> {
    let (config, dirs) = prepare(request, stdin)?;
    let network = Network::lock(&state_root(&config), &config.name)?;
    let attachment = attachment(request);
    let stored = network.read(&attachment)?;
    let deleting = stored.map_or_else(|| stdin.to_vec(), |s| config.with_prev_result(&s));
    delegate::del(&Config::parse(&deleting)?, find_each(&config, &dirs))?;
    network.remove(&attachment)
}

/// GC's input with every attachment kept for the network added to the
/// runtime's `cni.dev/valid-attachments`, so that GC frees none of them
/// (`None` when nothing is kept: the runtime's input stands), and the lock
/// to hold until the delegates are done (an `ensure` could otherwise
/// allocate between the listing and the GC). Creates nothing; waits for
/// the lock no longer than `ipam.timeout` when set.
pub fn gc_input(config: &Config) -> Result<(state::Kept, Option<Vec<u8>>), Error> {
    let mut valid: Vec<Value> = match config.member(VALID_ATTACHMENTS) {
        Some(raw) => serde_json::from_str(raw.get()).map_err(|_| {
            Error::InvalidConfig(format!("\"{VALID_ATTACHMENTS}\" must be an array"))
        })?,
        None => Vec::new(),
    };
    let kept = state::kept_for_gc(&state_root(config), &config.name, config.timeout)?;
    if kept.attachments.is_empty() {
        return Ok((kept, None));
    }
    for attachment in &kept.attachments {
        let entry = serde_json::json!({"containerID": attachment.id, "ifname": attachment.ifname});
        if !valid.contains(&entry) {
            valid.push(entry);
        }
    }
    let list = Value::Array(valid).to_string();
    let input = config.with_member(VALID_ATTACHMENTS, list.as_bytes());
    Ok((kept, Some(input)))
}

/// The stdin a main plugin would give the plugin for `file`: from a list,
/// the one plugin whose `ipam.type` is ipam-delegated, with the list's
/// cniVersion and name, as libcni derives it; or the file's own object.
pub fn load(file: &Path) -> Result<Vec<u8>, Error> {
    let fail = |reason: String| Error::ConfigFile {
        path: file.to_owned(),
        reason,
    };
    let text = std::fs::read(file).map_err(|e| fail(format!("cannot be read: {e}")))?;
    let value: Value =
        serde_json::from_slice(&text).map_err(|e| fail(format!("is not JSON: {e}")))?;
    let Value::Object(object) = value else {
        return Err(fail("is not a JSON object".into()));
    };
    let is_ours = |plugin: &Value| plugin["ipam"]["type"] == "ipam-delegated";
    let plugin = match object.get("plugins") {
        Some(Value::Array(plugins)) => {
            let ours: Vec<&Value> = plugins.iter().filter(|p| is_ours(p)).collect();
            let [plugin] = ours.as_slice() else {
                return Err(fail(format!(
                    "a list needs exactly one plugin whose ipam.type is ipam-delegated; it has {}",
                    ours.len()
                )));
            };
            let Value::Object(plugin) = plugin else {
                return Err(fail("its ipam-delegated plugin is not an object".into()));
            };
            let mut built = Map::new();
            for key in ["cniVersion", "name"] {
                if let Some(value) = object.get(key) {
                    built.insert(key.into(), value.clone());
                }
            }
            for (key, value) in plugin {
                built.entry(key.clone()).or_insert_with(|| value.clone());
            }
            built
        }
        Some(_) => return Err(fail("\"plugins\" is not an array".into())),
        None if is_ours(&Value::Object(object.clone())) => object,
        None => return Err(fail("its ipam.type is not ipam-delegated".into())),
    };
    Ok(Value::Object(plugin).to_string().into_bytes())
}

/// Checks the request, sets the environment every delegate will inherit,
/// and reads the configuration.
fn prepare<'a>(request: &Request, stdin: &'a [u8]) -> Result<(Config<'a>, Vec<PathBuf>), Error> {
    environment::check_container_id("--id", &request.id)?;
    environment::check_ifname("--ifname", &request.ifname)?;
    let config = Config::parse(stdin)?;
    let path = std::env::var("CNI_PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_CNI_PATH.into());
    // The plugin is single-threaded: its own environment is what the
    // delegates it starts inherit, as they would from a runtime.
    for (name, value) in [
        ("CNI_CONTAINERID", request.id.as_str()),
        ("CNI_IFNAME", request.ifname.as_str()),
        ("CNI_NETNS", request.netns.as_str()),
        ("CNI_PATH", path.as_str()),
    ] {
        std::env::set_var(name, value);
    }
    // Plugins built on libcni 1.2 or later fail ADD and DEL (code 8) when
    // CNI_NETNS is their own namespace, unless told it is meant: an
    // agent's address is in its own namespace on purpose.
    if is_own_netns(&request.netns) {
        std::env::set_var(NETNS_OVERRIDE, "1");
    }
    let dirs = path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect();
    Ok((config, dirs))
}

/// Whether `netns` is the network namespace this process runs in (as
/// libcni compares them: the same namespace file, however named).
fn is_own_netns(netns: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let identity = |path: &str| std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
    identity(netns).is_some_and(|id| identity("/proc/self/ns/net") == Some(id))
}

fn find_each(config: &Config, dirs: &[PathBuf]) -> Vec<Result<delegate::Delegate, Error>> {
    delegate::resolve_each(&config.delegates, dirs)
}

fn state_root(config: &Config) -> PathBuf {
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
