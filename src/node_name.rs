//! The node's name, pinned in a file: the host's name at first use, or
//! the one an installer pins (on Kubernetes, the node's spec.nodeName),
//! so that a renamed host keeps the name its records and its keeper's
//! registration are under (GC frees only its own node's records, and
//! `reclaim` takes a silent name for a dead node). The allocator reads it
//! when `ipam.pool.node` gives none; `ipam-delegated install` and
//! `ipam-da-pool node-keeper` pin it when given `--node-name`.

use std::io;
use std::path::{Path, PathBuf};

use crate::args::Options;
use crate::cni::{self, Reportable};
use crate::dir::{Dir, DirError};

/// Why there is no node name to use.
#[derive(Debug, thiserror::Error)]
pub enum NodeNameError {
    /// The name pinned, the host's or the one given cannot name a node,
    /// or the file's path is not absolute: a setting to fix.
    #[error(transparent)]
    Invalid(cni::Error),

    /// The file cannot be read or written.
    #[error(transparent)]
    File(#[from] DirError),

    /// An installer asked to pin a name other than the one pinned: the
    /// node's records and its registration are under the pinned one.
    #[error("{} pins node name {pinned:?}, not {asked:?}: renamed, the node's DELs and GCs would look for its containers' addresses under {asked:?} and free none, and {pinned:?}'s registration would lapse, so reclaim would free addresses its containers hold; drain the node, remove {} and install again, or install with --node-name {pinned}", file.display(), file.display())]
    Renamed {
        file: PathBuf,
        pinned: String,
        asked: String,
    },
}

impl Reportable for NodeNameError {
    fn code(&self) -> u32 {
        match self {
            NodeNameError::Invalid(e) => e.code(),
            NodeNameError::File(e) => e.code(),
            NodeNameError::Renamed { .. } => cni::code::INVALID_CONFIG,
        }
    }
}

/// Where the pinned name is kept unless `ipam.pool.nodeNameFile` says: in
/// the local store's default directory, one file for every network of
/// the node.
pub const DEFAULT_NODE_NAME_FILE: &str = "/var/lib/cni/ipam-da-pool/node-name";

/// The node's name as pinned in `file`; if there is none yet, the host's
/// name, pinned there first. Of two first uses at once, the one whose
/// file lands first names the node for both.
pub fn pinned(file: &Path) -> Result<String, NodeNameError> {
    let (dir, name) = split(file)?;
    let failed = |error: io::Error| NodeNameError::from(DirError::io(file, error));
    let read = |dir: &Dir| read_pinned(dir, name, file);
    // Read first: every call but the node's very first finds it.
    if let Ok(dir) = Dir::open(dir) {
        if let Some(pinned) = read(&dir)? {
            return Ok(pinned);
        }
    }
    let host = hostname()?;
    let dir = Dir::open_made(dir).map_err(failed)?;
    if dir
        .create_as(
            name,
            format!("{host}\n").as_bytes(),
            &writer().map_err(failed)?,
        )
        .map_err(failed)?
    {
        tracing::info!(
            "node name {host:?} pinned in {}: it stays this node's name if the host is renamed",
            file.display()
        );
        return Ok(host);
    }
    read(&dir)?.ok_or_else(|| {
        failed(io::Error::new(
            io::ErrorKind::NotFound,
            "written by another process, then removed",
        ))
    })
}

/// A name of this writer's own for the temporary file of a pin: an
/// installer, a keeper and first ADDs may pin at the same moment, and
/// none may remove another's temporary file.
fn writer() -> io::Result<String> {
    crate::sys::random_hex()
}

/// The node's name as [`pinned`] gives it, but writing nothing: the name
/// pinned in `file`, or, before the first use that pins one, the host's
/// name, which that use would pin. For what must make nothing (a
/// teardown, a check of the settings).
pub fn current(file: &Path) -> Result<String, NodeNameError> {
    let (dir, name) = split(file)?;
    match Dir::open(dir) {
        Ok(dir) => match read_pinned(&dir, name, file)? {
            Some(pinned) => Ok(pinned),
            None => hostname(),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => hostname(),
        Err(e) => Err(DirError::io(dir, e).into()),
    }
}

/// The name pinned in file `name` of `dir` (`file`, for messages), if one
/// is; one that cannot name a node is an error to correct.
fn read_pinned(dir: &Dir, name: &str, file: &Path) -> Result<Option<String>, NodeNameError> {
    let Some(content) = dir.read(name).map_err(|e| DirError::io(file, e))? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&content).trim().to_owned();
    if cni::is_identifier(&text) {
        Ok(Some(text))
    } else {
        Err(invalid(format!(
            "{} holds {text:?}, which {}: correct it, or name the node in the configuration (\"ipam.pool.node\", \"ipam.neutron.host\")",
            file.display(),
            cni::IDENTIFIER_RULE
        )))
    }
}

/// Pins `name` as the node's name in `file` if none is pinned yet, for
/// an installer that knows the node's name from its orchestrator:
/// whether it did. The name pinned already is never changed behind the
/// store's back: the same one is `Ok(false)`, another an error naming
/// both and what to do.
pub fn pin(file: &Path, name: &str) -> Result<bool, NodeNameError> {
    if !cni::is_identifier(name) {
        return Err(invalid(format!(
            "node name {name:?} {}",
            cni::IDENTIFIER_RULE
        )));
    }
    let (dir, base) = split(file)?;
    let failed = |error: io::Error| NodeNameError::from(DirError::io(file, error));
    let dir = Dir::open_made(dir).map_err(failed)?;
    if dir
        .create_as(
            base,
            format!("{name}\n").as_bytes(),
            &writer().map_err(failed)?,
        )
        .map_err(failed)?
    {
        return Ok(true);
    }
    match read_pinned(&dir, base, file)? {
        Some(pinned) if pinned == name => Ok(false),
        Some(pinned) => Err(NodeNameError::Renamed {
            file: file.to_owned(),
            pinned,
            asked: name.to_owned(),
        }),
        None => Err(failed(io::Error::new(
            io::ErrorKind::NotFound,
            "written by another process, then removed",
        ))),
    }
}

/// The name a command line's `--node-name NAME [--node-name-file FILE]`
/// asks to pin, and where (the default file unless FILE), if it asks.
pub fn given(options: &Options) -> Result<Option<(String, PathBuf)>, String> {
    match (
        options.value("--node-name"),
        options.path("--node-name-file"),
    ) {
        (Some(name), file) => Ok(Some((
            name.to_owned(),
            file.unwrap_or_else(|| PathBuf::from(DEFAULT_NODE_NAME_FILE)),
        ))),
        (None, Some(_)) => Err("--node-name-file needs --node-name".into()),
        (None, None) => Ok(None),
    }
}

/// The directory and the name of `file`, an absolute path.
fn split(file: &Path) -> Result<(&Path, &str), NodeNameError> {
    match (file.parent(), file.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) if file.is_absolute() => Ok((dir, name)),
        _ => Err(invalid(format!(
            "\"ipam.pool.nodeNameFile\" must be an absolute file name, not {}",
            file.display()
        ))),
    }
}

/// The host's name, as the kernel has it now.
fn hostname() -> Result<String, NodeNameError> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default();
    if cni::is_identifier(&name) {
        Ok(name)
    } else {
        Err(invalid(format!(
            "the host name {name:?} cannot name a node: name it in the configuration (\"ipam.pool.node\", \"ipam.neutron.host\")"
        )))
    }
}

/// A name, or a file, to fix: code 7.
fn invalid(reason: String) -> NodeNameError {
    NodeNameError::Invalid(cni::Error::InvalidConfig(reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_use_pins_the_host_name_and_every_later_one_reads_it() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("state/node-name");
        let first = pinned(&file).unwrap();
        assert_eq!(first, hostname().unwrap());
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            format!("{first}\n")
        );
        // What the file says wins over the host's name from then on.
        std::fs::write(&file, "node-7\n").unwrap();
        assert_eq!(pinned(&file).unwrap(), "node-7");
        assert_eq!(pin(&file, "a b").unwrap_err().code(), 7);
    }

    #[test]
    fn an_installer_pins_a_name_first_and_never_renames_a_pinned_one() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("state/node-name");
        assert!(pin(&file, "node-8").unwrap());
        assert_eq!(pinned(&file).unwrap(), "node-8");
        assert!(!pin(&file, "node-8").unwrap(), "the same name again");
        let e = pin(&file, "node-9").unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(
            e.to_string().starts_with(&format!(
                "{} pins node name \"node-8\", not \"node-9\"",
                file.display()
            )),
            "{e}"
        );
        assert!(
            e.to_string().contains("install with --node-name node-8"),
            "{e}"
        );
        assert_eq!(pinned(&file).unwrap(), "node-8", "left as it was");
        // No temporary file of the pin is the first use's.
        let names: Vec<String> = std::fs::read_dir(tmp.path().join("state"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["node-name"]);
    }

    #[test]
    fn pins_at_once_and_first_uses_at_once_all_succeed() {
        // A DaemonSet starts its installer and its keeper together, and
        // several first ADDs may run at once: none may fail for another's
        // temporary file.
        let left = |tmp: &tempfile::TempDir| -> Vec<String> {
            std::fs::read_dir(tmp.path().join("state"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        };
        for round in 0..20 {
            let tmp = tempfile::tempdir().unwrap();
            let file = tmp.path().join("state/node-name");
            std::thread::scope(|scope| {
                let pins: Vec<_> = (0..6)
                    .map(|_| scope.spawn(|| pin(&file, "node-8")))
                    .collect();
                let made: Vec<bool> = pins
                    .into_iter()
                    .map(|t| {
                        t.join()
                            .unwrap()
                            .unwrap_or_else(|e| panic!("round {round}: {e}"))
                    })
                    .collect();
                assert_eq!(made.iter().filter(|m| **m).count(), 1, "round {round}");
            });
            assert_eq!(left(&tmp), ["node-name"], "round {round}");
            let tmp = tempfile::tempdir().unwrap();
            let file = tmp.path().join("state/node-name");
            std::thread::scope(|scope| {
                let uses: Vec<_> = (0..6).map(|_| scope.spawn(|| pinned(&file))).collect();
                for used in uses {
                    let name = used
                        .join()
                        .unwrap()
                        .unwrap_or_else(|e| panic!("round {round}: {e}"));
                    assert_eq!(name, hostname().unwrap());
                }
            });
            assert_eq!(left(&tmp), ["node-name"], "round {round}");
        }
    }

    #[test]
    fn the_current_name_is_read_without_writing_anything() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("state/node-name");
        assert_eq!(current(&file).unwrap(), hostname().unwrap());
        assert!(!tmp.path().join("state").exists(), "nothing made");
        assert!(pin(&file, "node-9").unwrap());
        assert_eq!(current(&file).unwrap(), "node-9");
        std::fs::write(&file, "../x\n").unwrap();
        assert_eq!(current(&file).unwrap_err().code(), 7);
    }

    #[test]
    fn a_name_that_cannot_name_a_node_is_refused_and_named() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("node-name");
        std::fs::write(&file, "../etc\n").unwrap();
        let e = pinned(&file).unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(e.to_string().contains("node-name holds \"../etc\""), "{e}");
        let e = pinned(Path::new("node-name")).unwrap_err();
        assert!(e.to_string().contains("absolute"), "{e}");
    }
}
