//! Finding delegates: the first CNI_PATH directory that holds an executable
//! regular file of the delegate's name.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::delegated::error::DelegatedError;
use crate::sys;

/// A delegate found in CNI_PATH, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegate {
    /// The name as configured in `ipam.delegates`.
    pub name: String,
    /// The file that runs for it.
    pub path: PathBuf,
}

/// Looks up every name, keeping each one's outcome in order, so that a
/// best-effort command can run the delegates that were found.
pub fn resolve_each(names: &[String], dirs: &[PathBuf]) -> Vec<Result<Delegate, DelegatedError>> {
    // Relative CNI_PATH entries resolve against the working directory, as
    // they do for runtimes (if it is gone, against the root).
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let absolute: Vec<PathBuf> = dirs.iter().map(|d| cwd.join(d)).collect();
    let this_plugin = identity(Path::new("/proc/self/exe"));
    names
        .iter()
        .map(|name| match find(name, &absolute) {
            Some((path, id)) if this_plugin == Some(id) => Err(DelegatedError::SelfReference {
                name: name.clone(),
                how: format!("{} is the same file", path.display()),
            }),
            Some((path, _)) => Ok(Delegate {
                name: name.clone(),
                path,
            }),
            None => Err(DelegatedError::NotFound {
                name: name.clone(),
                searched: list_dirs(dirs),
            }),
        })
        .collect()
}

/// The first `dir/name` that is a regular file (through links) this
/// process may execute, with its identity. Searched here rather than with
/// the `which` crate, whose home-directory lookup for `~` links glibc's
/// user database and dynamic loader into a static build: 139 KiB, a twelfth
/// of the plugin, for an expansion CNI_PATH never needs.
fn find(name: &str, dirs: &[PathBuf]) -> Option<(PathBuf, (u64, u64))> {
    dirs.iter().find_map(|dir| {
        let path = dir.join(name);
        let meta = std::fs::metadata(&path).ok()?;
        (meta.is_file() && sys::can_execute(&path)).then(|| (path, (meta.dev(), meta.ino())))
    })
}

/// Every delegate of a lookup, for a command that runs none when one is
/// missing: the first one missing is the error.
pub fn all(found: Vec<Result<Delegate, DelegatedError>>) -> Result<Vec<Delegate>, DelegatedError> {
    found.into_iter().collect()
}

/// Whether `path` has the same bytes as this binary. A lookup does not
/// check this, since it would mean reading every delegate on every call:
/// the plugin notices such a copy only when the copy starts, through
/// [`super::PARENT_VARIABLE`]; the doctor checks in advance.
pub fn is_copy_of_this_plugin(path: &Path) -> bool {
    let (Ok(this), Ok(that)) = (std::fs::metadata("/proc/self/exe"), std::fs::metadata(path))
    else {
        return false;
    };
    this.len() == that.len()
        && matches!(
            (std::fs::read("/proc/self/exe"), std::fs::read(path)),
            (Ok(a), Ok(b)) if a == b
        )
}

/// The file `path` leads to, through any links: what makes two names one file.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Whether `a` and `b` lead to one file (both existing), however named.
pub fn same_file(a: &Path, b: &Path) -> bool {
    identity(a).is_some_and(|a| identity(b) == Some(a))
}

/// Directories as a list for a message: "a, b".
pub fn list_dirs(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| Path::display(d).to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::{code, Reportable};
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    /// Two CNI_PATH directories, `one` and `two`, in a temporary directory.
    struct Dirs(tempfile::TempDir);

    impl Dirs {
        fn new() -> Dirs {
            let root = tempfile::tempdir().unwrap();
            fs::create_dir(root.path().join("one")).unwrap();
            fs::create_dir(root.path().join("two")).unwrap();
            Dirs(root)
        }

        fn file(&self, rel: &str, mode: u32) -> PathBuf {
            let path = self.0.path().join(rel);
            fs::write(&path, "#!/bin/sh\n").unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            path
        }

        fn path(&self) -> Vec<PathBuf> {
            vec![self.0.path().join("one"), self.0.path().join("two")]
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_first_directory_with_an_executable_wins() {
        let d = Dirs::new();
        d.file("one/a", 0o644); // not executable: skipped
        let want = d.file("two/a", 0o755);
        let later = d.file("two/b", 0o755);
        let first_b = d.file("one/b", 0o755);
        assert_ne!(later, first_b);
        let found = all(resolve_each(&names(&["a", "b"]), &d.path())).unwrap();
        assert_eq!(found[0].path, want);
        assert_eq!(found[1].path, first_b);
        assert_eq!(found[1].name, "b");
    }

    #[test]
    fn a_directory_of_the_name_is_not_a_delegate() {
        let d = Dirs::new();
        fs::create_dir(d.0.path().join("one/a")).unwrap();
        let e = all(resolve_each(&names(&["a"]), &d.path())).unwrap_err();
        assert_eq!(e.code(), code::DELEGATE_NOT_FOUND);
    }

    #[test]
    fn a_missing_delegate_names_itself_and_the_directories() {
        let d = Dirs::new();
        d.file("one/a", 0o755);
        let e = all(resolve_each(&names(&["a", "nope"]), &d.path())).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("\"nope\""), "{msg}");
        assert!(
            msg.contains(&d.0.path().join("one").display().to_string()),
            "{msg}"
        );
        assert!(
            msg.contains(&d.0.path().join("two").display().to_string()),
            "{msg}"
        );
    }

    #[test]
    fn resolve_each_keeps_every_outcome_in_order() {
        let d = Dirs::new();
        d.file("two/c", 0o755);
        let each = resolve_each(&names(&["x", "c", "y"]), &d.path());
        assert!(each[0].is_err());
        assert_eq!(each[1].as_ref().unwrap().name, "c");
        assert!(each[2].is_err());
    }
}
