//! Output files written whole or not at all: the one implementation every crate uses (traces,
//! snapshot exports, reports, profiles, model files).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A temporary file in `path`'s directory (`.NAME.*.partial`, mode 0644 on Unix as ordinary
/// outputs are; tempfile's default is 0600), to be persisted over `path` once complete. Dropped
/// without being persisted, it is removed.
pub fn temp_beside(path: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".partial");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o644));
    }
    // tempfile names its own random file in the error ("at path .../.NAME.Xy12.partial"): the
    // user gave `path`, so the error names its folder instead.
    builder.tempfile_in(dir).map_err(|e| {
        // The folder's own error where it has one ("No such file or directory"), else the kind.
        let why = match std::fs::metadata(dir) {
            Err(m) => m.to_string(),
            Ok(m) if !m.is_dir() => "not a folder".to_string(),
            Ok(_) => e.kind().to_string(),
        };
        std::io::Error::new(e.kind(), format!("cannot create a file in {}: {why}", dir.display()))
    })
}

/// Whether two paths name one file (the same device and inode: a link, `..` or another
/// spelling of one path is caught). A path that does not exist is no file, so the answer is no:
/// writing there destroys nothing.
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Where writing `path` lands: a symbolic link followed to its target, as a shell's `>` would
/// write it (renaming a finished file over the link replaced the link and left its target as it
/// was). A dangling link's target is where the file goes; a loop of links is left as `path`, to
/// fail or be replaced as a plain path would.
pub fn through_links(path: &Path) -> PathBuf {
    let mut at = path.to_path_buf();
    // Linux's own limit of links followed in one lookup (ELOOP past it).
    for _ in 0..40 {
        match std::fs::read_link(&at) {
            Ok(to) if to.is_absolute() => at = to,
            Ok(to) => at = at.parent().map_or(to.clone(), |d| d.join(&to)),
            Err(_) => return at,
        }
    }
    path.to_path_buf()
}

/// Writes `path` (through its links: [`through_links`]) via [`temp_beside`]: `fill` writes the contents, and only when it succeeds
/// is the file flushed and renamed over `path`. A failure never leaves a partial output.
pub fn write_atomic<E: From<std::io::Error>>(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<&mut File>) -> Result<(), E>,
) -> Result<(), E> {
    let path = &through_links(path);
    let mut tmp = temp_beside(path)?;
    {
        let mut w = BufWriter::new(tmp.as_file_mut());
        fill(&mut w)?;
        w.flush()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// [`write_atomic`] of bytes already in memory.
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic(path, |w| w.write_all(bytes))
}
