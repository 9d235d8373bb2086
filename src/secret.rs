//! Secrets kept in files (a password, a token): opened once, without
//! following a symbolic link or waiting on a FIFO, and checked as opened:
//! a regular file of the user that runs the plugin, that no other user may
//! read or write, of a secret's size. Read whole at each use, so that a
//! rotated one is picked up.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The largest secret file: a password or a token is far smaller, and a
/// file that grows without end must not hold the plugin.
pub const MAX: u64 = 64 * 1024;

/// What a secret given as a symbolic link is told.
const LINK: &str =
    "it is a symbolic link: give the file it points to, which no other user can change";

/// The secret in `file`; the error names the file and what is wrong.
pub fn read(file: &Path) -> Result<String, String> {
    let said = |what: String| format!("{}: {what}", file.display());
    let text = open(file).and_then(read_bounded).map_err(said)?;
    // A file written by `echo` ends with a newline the secret does not have.
    let secret = text.strip_suffix('\n').unwrap_or(&text);
    if secret.is_empty() {
        return Err(said("it is empty".into()));
    }
    // It goes into a header: a line break there would end it.
    if secret.chars().any(char::is_control) {
        return Err(said(
            "it holds a control character (a line break, a carriage return …)".into(),
        ));
    }
    Ok(secret.to_owned())
}

/// At most [`MAX`] bytes of `input`, as text; more is refused. The file
/// was checked for its size, but may grow after the check.
fn read_bounded(input: impl Read) -> Result<String, String> {
    let mut text = String::new();
    input
        .take(MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX {
        return Err(format!("it is larger than {MAX} bytes"));
    }
    Ok(text)
}

/// `file` opened, and checked as it was opened (not by its name again,
/// which another process may have changed meanwhile). What is not a
/// regular file by its name is refused before it is opened, since opening
/// a device may do something; one swapped in between is refused after.
fn open(file: &Path) -> Result<File, String> {
    let named = std::fs::symlink_metadata(file).map_err(|e| e.to_string())?;
    regular(named.file_type())?;
    open_as_found(file, &named)
}

/// `file` opened, and refused unless it is still what `named` found.
fn open_as_found(file: &Path, named: &std::fs::Metadata) -> Result<File, String> {
    let opened = OpenOptions::new()
        .read(true)
        // Swapped for a link or a FIFO since: refused, not waited on.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(file)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => LINK.to_owned(),
            _ => e.to_string(),
        })?;
    let metadata = opened.metadata().map_err(|e| e.to_string())?;
    regular(metadata.file_type())?;
    if (metadata.dev(), metadata.ino()) != (named.dev(), named.ino()) {
        return Err("it was replaced while it was opened".into());
    }
    let user = crate::sys::euid();
    if metadata.uid() != user {
        return Err(format!(
            "it is owned by user {}, not by user {user}, who runs the plugin: chown it",
            metadata.uid()
        ));
    }
    let mode = metadata.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "its group or other users may read or write it (mode {mode:o}): make it its owner's only (chmod 600)"
        ));
    }
    if metadata.len() > MAX {
        return Err(format!(
            "it is {} bytes, larger than {MAX}: not a secret",
            metadata.len()
        ));
    }
    Ok(opened)
}

/// Refused unless a regular file, saying what it is.
fn regular(kind: std::fs::FileType) -> Result<(), String> {
    if kind.is_file() {
        return Ok(());
    }
    if kind.is_symlink() {
        return Err(LINK.to_owned());
    }
    let what = if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a device"
    };
    Err(format!("it is {what}, not a regular file"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn secret_file(dir: &Path, text: &str, mode: u32) -> std::path::PathBuf {
        let file = dir.join("secret");
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        file
    }

    #[test]
    fn a_secret_file_of_its_owner_only_is_read_and_a_looser_one_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = secret_file(tmp.path(), "secret\n", 0o600);
        assert_eq!(read(&file).unwrap(), "secret");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert_eq!(read(&file).unwrap(), "secret");
        for mode in [0o640, 0o660, 0o604, 0o644, 0o700] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            match read(&file) {
                // 0700 is the owner's only: allowed.
                Ok(_) => assert_eq!(mode, 0o700),
                Err(e) => {
                    assert!(e.contains(&format!("(mode {mode:o})")), "{e}");
                    assert!(e.starts_with(&file.display().to_string()), "{e}");
                }
            }
        }
        let file = secret_file(tmp.path(), "", 0o600);
        for broken in ["secret\r\n", "sec\nret\n", "secret\n\n"] {
            std::fs::write(&file, broken).unwrap();
            let e = read(&file).unwrap_err();
            assert!(e.contains("control character"), "{broken:?}: {e}");
        }
    }

    #[test]
    fn a_link_a_fifo_a_directory_and_a_huge_file_are_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let target = secret_file(tmp.path(), "secret\n", 0o600);
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = read(&link).unwrap_err();
        assert!(e.starts_with(&link.display().to_string()), "{e}");
        assert!(e.contains("symbolic link"), "{e}");

        // Nobody writes to it: a blocking open or read would wait for ever.
        let fifo = tmp.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg("-m")
            .arg("600")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let e = read(&fifo).unwrap_err();
        assert!(e.contains("a FIFO, not a regular file"), "{e}");

        let e = read(tmp.path()).unwrap_err();
        assert!(e.contains("a directory"), "{e}");

        let largest = secret_file(tmp.path(), &"x".repeat(MAX as usize), 0o600);
        assert_eq!(read(&largest).unwrap().len() as u64, MAX);
        let huge = secret_file(tmp.path(), &"x".repeat(MAX as usize + 1), 0o600);
        let e = read(&huge).unwrap_err();
        // Refused by its size as opened, before a byte is read.
        assert!(e.contains("it is 65537 bytes, larger than 65536"), "{e}");
    }

    #[test]
    fn a_link_or_a_fifo_swapped_in_after_the_check_is_refused_without_waiting() {
        let tmp = tempfile::tempdir().unwrap();
        let checked = secret_file(tmp.path(), "secret\n", 0o600);
        let named = std::fs::symlink_metadata(&checked).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&checked, &link).unwrap();
        let e = open_as_found(&link, &named).unwrap_err();
        assert!(e.contains("give the file it points to"), "{e}");
        // Nobody writes to it: opened without O_NONBLOCK, it would wait.
        let fifo = tmp.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .args(["-m", "600"])
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let e = open_as_found(&fifo, &named).unwrap_err();
        assert!(e.contains("a FIFO"), "{e}");
        let other = tmp.path().join("other");
        std::fs::copy(&checked, &other).unwrap();
        let e = open_as_found(&other, &named).unwrap_err();
        assert!(e.contains("replaced"), "{e}");
        assert!(open_as_found(&checked, &named).is_ok());
    }

    #[test]
    fn a_file_that_grew_past_its_check_is_read_no_further_than_the_limit() {
        let exactly = read_bounded(std::io::repeat(b'x').take(MAX)).unwrap();
        assert_eq!(exactly.len() as u64, MAX);
        let e = read_bounded(std::io::repeat(b'x')).unwrap_err();
        assert!(e.contains("larger than 65536"), "{e}");
    }

    #[test]
    #[ignore = "needs root, to give a file to another user"]
    fn a_file_another_user_owns_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = secret_file(tmp.path(), "secret\n", 0o600);
        std::os::unix::fs::chown(&file, Some(65534), None).unwrap();
        let e = read(&file).unwrap_err();
        assert!(e.contains("owned by user 65534"), "{e}");
        assert!(e.contains("chown"), "{e}");
    }
}
