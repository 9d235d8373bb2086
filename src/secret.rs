//! Secrets kept in files (a password, a token): read whole at each use,
//! so that a rotated one is picked up, and refused when other users may
//! read them.

use std::path::Path;

/// The secret in `file`, which no other user may read: a world-readable
/// secret would be anyone's on the node.
pub fn read(file: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let metadata = std::fs::metadata(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o007 != 0 {
        return Err(format!(
            "{}: others may read or write it (mode {mode:o}): make it readable by its owner only (chmod 600)",
            file.display()
        ));
    }
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    // A file written by `echo` ends with a newline the secret does not have.
    let secret = text.strip_suffix('\n').unwrap_or(&text);
    if secret.is_empty() {
        return Err(format!("{}: it is empty", file.display()));
    }
    // It goes into a header: a line break there would end it.
    if secret.chars().any(char::is_control) {
        return Err(format!(
            "{}: it holds a control character (a line break, a carriage return …)",
            file.display()
        ));
    }
    Ok(secret.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("secret");
        std::fs::write(&file, "secret\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&file).unwrap(), "secret");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read(&file).unwrap_err();
        assert!(e.contains("others may read or write it (mode 644)"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        for broken in ["secret\r\n", "sec\nret\n", "secret\n\n"] {
            std::fs::write(&file, broken).unwrap();
            let e = read(&file).unwrap_err();
            assert!(e.contains("control character"), "{broken:?}: {e}");
        }
    }
}
