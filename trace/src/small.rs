//! Input files read whole (profiles, model files, feature and estimate JSON, snapshots): the one
//! reader that refuses what is not a regular file, or is larger than its kind can be, before
//! reading it. `/dev/zero` given as a profile or a model file was read until memory ran out, and
//! a FIFO with no writer blocked forever.

use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// The bytes of the regular file at `path` (links followed), at most `limit` of them: an error
/// of kind `InvalidInput` for a directory, FIFO, socket or device, `InvalidData` for a file past
/// `limit`.
pub fn read_small(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    // Checked before opening: opening a device can have effects of its own.
    let regular = |m: &std::fs::Metadata| {
        if m.is_file() {
            Ok(())
        } else {
            let what = if m.is_dir() { "a directory" } else { "a FIFO, socket or device" };
            Err(Error::new(ErrorKind::InvalidInput, format!("not a regular file ({what})")))
        }
    };
    regular(&std::fs::metadata(path)?)?;
    let file = open_nonblocking(path)?;
    // The path may have been swapped between the check and the open.
    let meta = file.metadata()?;
    regular(&meta)?;
    let too_large =
        || Error::new(ErrorKind::InvalidData, format!("larger than {} MiB: not a file of this kind", limit >> 20));
    if meta.len() > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // One byte past the limit tells a file that grew since the check.
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

/// [`read_small`] as UTF-8 text.
pub fn read_small_string(path: &Path, limit: u64) -> std::io::Result<String> {
    String::from_utf8(read_small(path, limit)?)
        .map_err(|e| Error::new(ErrorKind::InvalidData, format!("not UTF-8 text ({})", e.utf8_error())))
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    // A FIFO swapped in after the check would block an ordinary open until a writer came.
    // O_NOCTTY: a terminal swapped in must not become the process's controlling one.
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_within_its_limit_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.toml");
        std::fs::write(&f, "a = 1\n").unwrap();
        assert_eq!(read_small_string(&f, 1 << 20).unwrap(), "a = 1\n");
        let err = read_small(&f, 3).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData);
        assert!(err.to_string().starts_with("larger than 0 MiB"), "{err}");
        let err = read_small(dir.path(), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("not a regular file (a directory)"), "{err}");
        let err = read_small(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("not a regular file (a FIFO, socket or device)"), "{err}");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // Safety: `c` is a valid NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read_small(&fifo, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("a FIFO, socket or device"), "never blocks on a FIFO: {err}");
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert_eq!(read_small_string(&link, 1 << 20).unwrap(), "a = 1\n", "links are followed");
        std::fs::write(&f, [0xff, 0xfe]).unwrap();
        assert!(read_small_string(&f, 1 << 20).unwrap_err().to_string().contains("not UTF-8"));
    }
}
