//! This node's name when `ipam.pool.node` does not give one: the host's
//! name at first use, pinned in a file from then on, so that a renamed
//! host keeps the name its records and its keeper's registration are
//! under (GC frees only its own node's records, and `reclaim` takes a
//! silent name for a dead node).

use std::io;
use std::path::Path;

use crate::cni;
use crate::dir::Dir;
use crate::error::Error;

/// Where the pinned name is kept unless `ipam.pool.nodeNameFile` says: in
/// the local store's default directory, one file for every network of
/// the node.
pub const DEFAULT_NODE_NAME_FILE: &str = "/var/lib/cni/ipam-da-pool/node-name";

/// The node's name as pinned in `file`; if there is none yet, the host's
/// name, pinned there first. Of two first uses at once, the one whose
/// file lands first names the node for both.
pub fn pinned(file: &Path) -> Result<String, Error> {
    let (dir, name) = split(file)?;
    let failed = |error: io::Error| Error::Files {
        path: file.to_owned(),
        error,
    };
    let read = |dir: &Dir| -> Result<Option<String>, Error> {
        let Some(content) = dir.read(name).map_err(failed)? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&content).trim().to_owned();
        if cni::is_identifier(&text) {
            Ok(Some(text))
        } else {
            Err(invalid(format!(
                "{} holds {text:?}, which {}: correct it, or set \"ipam.pool.node\"",
                file.display(),
                cni::IDENTIFIER_RULE
            )))
        }
    };
    // Read first: every call but the node's very first finds it.
    if let Ok(dir) = Dir::open(dir) {
        if let Some(pinned) = read(&dir)? {
            return Ok(pinned);
        }
    }
    let host = hostname()?;
    let dir = Dir::open_made(dir).map_err(failed)?;
    if dir
        .create(name, format!("{host}\n").as_bytes())
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

/// Pins `name` as the node's name in `file`, over any before it: for an
/// installer that knows the node's name from its orchestrator.
pub fn pin(file: &Path, name: &str) -> Result<(), Error> {
    if !cni::is_identifier(name) {
        return Err(invalid(format!(
            "node name {name:?} {}",
            cni::IDENTIFIER_RULE
        )));
    }
    let (dir, base) = split(file)?;
    let failed = |error: io::Error| Error::Files {
        path: file.to_owned(),
        error,
    };
    Dir::open_made(dir)
        .and_then(|dir| dir.replace(base, format!("{name}\n").as_bytes()))
        .map_err(failed)
}

/// The directory and the name of `file`, an absolute path.
fn split(file: &Path) -> Result<(&Path, &str), Error> {
    match (file.parent(), file.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) if file.is_absolute() => Ok((dir, name)),
        _ => Err(invalid(format!(
            "\"ipam.pool.nodeNameFile\" must be an absolute file name, not {}",
            file.display()
        ))),
    }
}

/// The host's name, as the kernel has it now.
fn hostname() -> Result<String, Error> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default();
    if cni::is_identifier(&name) {
        Ok(name)
    } else {
        Err(invalid(format!(
            "the host name {name:?} cannot name a node: set \"ipam.pool.node\""
        )))
    }
}

fn invalid(reason: String) -> Error {
    cni::Error::InvalidConfig(reason).into()
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
        // An installer pins the name its orchestrator gives the node.
        pin(&file, "node-8").unwrap();
        assert_eq!(pinned(&file).unwrap(), "node-8");
        assert_eq!(pin(&file, "a b").unwrap_err().code(), 7);
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
