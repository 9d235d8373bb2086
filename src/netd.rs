//! Network configurations as runtimes find them, for the commands an
//! operator runs by hand: one file (a conflist, or one plugin's
//! configuration) read as the stdin a main plugin gives its IPAM plugin,
//! and a directory of them (`/etc/cni/net.d`) read as libcni reads it:
//! `.conf`, `.conflist` and `.json` files in the order of their names, the
//! first file that names a network being that network.

use std::fmt::Display;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::cni::{code, Reportable};

/// A network configuration file given on a command line that cannot be
/// used: unreadable, not JSON, or without the plugin a command is about.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct ConfigFileError {
    /// The file (or directory) given.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigFileError {
    /// `path` cannot be used, for `reason`.
    pub fn new(path: &Path, reason: impl Into<String>) -> ConfigFileError {
        ConfigFileError {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }
}

impl Reportable for ConfigFileError {
    fn code(&self) -> u32 {
        code::INVALID_CONFIG
    }
}

/// The file names a directory's configurations have, as libcni reads them.
const EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

/// Which plugin of a configuration a command is about.
pub struct Ours {
    /// Says which, in errors: "whose ipam.type is ipam-delegated".
    pub described: &'static str,
    /// Says several: "networks whose ipam.type is ipam-delegated".
    pub several: &'static str,
    /// Whether a plugin's `ipam` object is ours.
    pub is_ours: fn(&Value) -> bool,
}

/// One network found.
#[derive(Debug)]
pub struct Network {
    pub name: String,
    /// The file it was read from.
    pub file: PathBuf,
    /// Our plugin's configuration, as a main plugin would pass it on.
    pub stdin: Vec<u8>,
}

/// What a path holds: its networks, and why each file of a directory that
/// gave none was skipped.
pub struct Found {
    pub networks: Vec<Network>,
    pub skipped: Vec<String>,
}

/// The stdin a main plugin would give our plugin for `file`: from a list,
/// the one plugin that is ours, with the list's cniVersion and name, as
/// libcni derives it; or the file's own object, if it is ours.
pub fn load(file: &Path, ours: &Ours) -> Result<Vec<u8>, ConfigFileError> {
    let fail = |reason: String| ConfigFileError::new(file, reason);
    let described = ours.described;
    let text = std::fs::read(file).map_err(|e| fail(format!("cannot be read: {e}")))?;
    let value: Value =
        serde_json::from_slice(&text).map_err(|e| fail(format!("is not JSON: {e}")))?;
    let Value::Object(object) = value else {
        return Err(fail("is not a JSON object".into()));
    };
    let is_ours = |plugin: &Value| (ours.is_ours)(&plugin["ipam"]);
    let plugin = match object.get("plugins") {
        Some(Value::Array(plugins)) => {
            let found: Vec<&Value> = plugins.iter().filter(|p| is_ours(p)).collect();
            let [plugin] = found.as_slice() else {
                return Err(fail(format!(
                    "a list needs exactly one plugin {described}; it has {}",
                    found.len()
                )));
            };
            let Value::Object(plugin) = plugin else {
                return Err(fail(format!("its plugin {described} is not an object")));
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
        None => return Err(fail(format!("it is not a plugin {described}"))),
    };
    Ok(Value::Object(plugin).to_string().into_bytes())
}

/// The networks at `path`: a file's one network (its error if it has
/// none), or a directory's, each file read with [`load`] and checked by
/// `name_of`, which gives the network's name (or the caller's error). A
/// file of a directory that gives none, or names a network an earlier
/// file named, is skipped.
pub fn scan<E: From<ConfigFileError> + Display>(
    path: &Path,
    ours: &Ours,
    name_of: impl Fn(&[u8]) -> Result<String, E>,
) -> Result<Found, E> {
    let read = |file: &Path| -> Result<Network, E> {
        let stdin = load(file, ours)?;
        Ok(Network {
            name: name_of(&stdin)?,
            file: file.to_owned(),
            stdin,
        })
    };
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return Ok(Found {
                networks: vec![read(path)?],
                skipped: Vec::new(),
            })
        }
        Err(e) => return Err(ConfigFileError::new(path, format!("cannot be read: {e}")).into()),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|file| {
            file.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| EXTENSIONS.contains(&e))
        })
        .collect();
    files.sort();
    let mut found = Found {
        networks: Vec::new(),
        skipped: Vec::new(),
    };
    for file in files {
        match read(&file) {
            Ok(network) if found.networks.iter().any(|n| n.name == network.name) => {
                found.skipped.push(format!(
                    "{}: network {:?} is named by an earlier file",
                    file.display(),
                    network.name
                ));
            }
            Ok(network) => found.networks.push(network),
            Err(e) => found.skipped.push(e.to_string()),
        }
    }
    Ok(found)
}

/// The one network at `path` that `wanted` names, or the only one there
/// when it names none: a file's, or one of a directory's, each read as
/// [`scan`] reads it (a file of the directory that has no plugin of ours
/// is another network's, and skipped). Zero or several is an error that
/// says so, naming them.
pub fn pick<E: From<ConfigFileError> + Display>(
    path: &Path,
    ours: &Ours,
    wanted: Option<&str>,
    name_of: impl Fn(&[u8]) -> Result<String, E>,
) -> Result<Network, E> {
    let found = scan(path, ours, name_of)?;
    let fail = |reason: String| E::from(ConfigFileError::new(path, reason));
    // Why each file of a directory was passed over, for when none is left.
    let skipped = match found.skipped.as_slice() {
        [] => String::new(),
        skipped => format!(" (skipped: {})", skipped.join("; ")),
    };
    let mut networks = found.networks;
    if let (false, [only], Some(wanted)) = (path.is_dir(), networks.as_slice(), wanted) {
        if only.name != wanted {
            return Err(fail(format!("is network {:?}, not {wanted:?}", only.name)));
        }
    }
    networks.retain(|n| wanted.is_none_or(|wanted| wanted == n.name));
    let names: Vec<&str> = networks.iter().map(|n| n.name.as_str()).collect();
    let described = ours.described;
    match (networks.len(), wanted) {
        (1, _) => Ok(networks.remove(0)),
        (0, Some(wanted)) => Err(fail(format!(
            "has no network {wanted:?} {described}{skipped}"
        ))),
        (0, None) => Err(fail(format!("has no network {described}{skipped}"))),
        _ => Err(fail(format!(
            "has several {} ({}): pick one with --network",
            ours.several,
            names.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const DELEGATED: Ours = Ours {
        described: "whose ipam.type is ipam-delegated",
        several: "networks whose ipam.type is ipam-delegated",
        is_ours: |ipam| ipam["type"] == "ipam-delegated",
    };

    /// What a command's own error would be: here, the protocol's.
    #[derive(Debug, thiserror::Error)]
    enum Either {
        #[error(transparent)]
        File(#[from] ConfigFileError),
        #[error(transparent)]
        Config(#[from] crate::cni::Error),
    }

    fn name_of(stdin: &[u8]) -> Result<String, Either> {
        Ok(crate::cni::NetConf::parse(stdin)?.name.to_owned())
    }

    fn ours(name: &str) -> String {
        format!(
            r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"bridge","ipam":{{"type":"ipam-delegated","delegates":["host-local"]}}}}]}}"#
        )
    }

    #[test]
    fn a_list_gives_its_one_plugin_with_the_lists_version_and_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.conflist");
        fs::write(&file, ours("a")).unwrap();
        let stdin: Value = serde_json::from_slice(&load(&file, &DELEGATED).unwrap()).unwrap();
        assert_eq!(stdin["name"], "a");
        assert_eq!(stdin["cniVersion"], "1.0.0");
        assert_eq!(stdin["type"], "bridge");
        assert_eq!(stdin["ipam"]["delegates"][0], "host-local");
        for (text, said) in [
            ("[]", "is not a JSON object"),
            ("{", "is not JSON"),
            (r#"{"plugins":{}}"#, "\"plugins\" is not an array"),
            (
                r#"{"plugins":[{"ipam":{"type":"host-local"}}]}"#,
                "a list needs exactly one plugin whose ipam.type is ipam-delegated; it has 0",
            ),
            (
                r#"{"type":"bridge","ipam":{"type":"host-local"}}"#,
                "it is not a plugin whose ipam.type is ipam-delegated",
            ),
        ] {
            fs::write(&file, text).unwrap();
            let e = load(&file, &DELEGATED).unwrap_err().to_string();
            assert!(e.contains(said), "{text}: {e}");
        }
    }

    #[test]
    fn a_directory_is_read_in_name_order_and_the_first_file_names_a_network() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("10-a.conflist"), ours("a")).unwrap();
        fs::write(dir.path().join("20-b.json"), ours("b")).unwrap();
        fs::write(dir.path().join("30-a.conf"), ours("a")).unwrap();
        fs::write(dir.path().join("40-broken.conflist"), "{").unwrap();
        fs::write(dir.path().join("50-c.txt"), ours("c")).unwrap();
        let found = scan(dir.path(), &DELEGATED, name_of).unwrap();
        let names: Vec<(&str, PathBuf)> = found
            .networks
            .iter()
            .map(|n| (n.name.as_str(), n.file.clone()))
            .collect();
        assert_eq!(
            names,
            [
                ("a", dir.path().join("10-a.conflist")),
                ("b", dir.path().join("20-b.json"))
            ]
        );
        assert_eq!(found.skipped.len(), 2, "{:?}", found.skipped);
        assert!(found.skipped[0].ends_with("30-a.conf: network \"a\" is named by an earlier file"));
        assert!(found.skipped[1].contains("40-broken.conflist: is not JSON"));
    }

    #[test]
    fn a_file_is_its_network_or_its_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("b.conflist");
        fs::write(&file, ours("b")).unwrap();
        let found = scan(&file, &DELEGATED, name_of).unwrap();
        assert_eq!(found.networks[0].name, "b");
        fs::write(&file, "{}").unwrap();
        assert!(scan(&file, &DELEGATED, name_of).is_err());
        assert!(scan(&dir.path().join("missing"), &DELEGATED, name_of).is_err());
    }
}
