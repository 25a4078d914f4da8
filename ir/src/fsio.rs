//! Writing files so that no reader ever sees half of one and nothing is left behind.
//!
//! [`AtomicFile`] is where every output of mmq is written (models, external data, reports,
//! reference archives, package files): an anonymous file in the target's directory
//! (`O_TMPFILE`: it has no name until it is complete, so a crash or `kill -9` leaves nothing),
//! given a name and renamed over the target by [`AtomicFile::persist`]. Where the file system
//! has no `O_TMPFILE` (or `/proc` is not mounted), a named temporary file beside the target
//! stands in, removed on every exit path but a hard kill.
//!
//! Outputs go to regular files only. An existing output path that names anything else (a
//! character or block device such as the null device, a FIFO, a socket, a directory) is refused
//! by [`check_output_file`], which front ends call before any work and [`AtomicFile::create`]
//! calls again: renaming over such a path would replace the device or pipe itself, and writing
//! into it in place would give up the atomicity every output has. To discard an output, write it
//! into a temporary directory.
//!
//! [`lock_dir`] serializes publications into one directory: a model and its external data
//! renamed into place under the lock form one unit, so two writers of the same output cannot
//! leave one's model beside the other's data.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// An output file being written; see the module documentation.
#[derive(Debug)]
pub struct AtomicFile {
    file: File,
    target: PathBuf,
    dir: PathBuf,
    /// The named temporary file, when the file system has no anonymous ones.
    temp: Option<PathBuf>,
}

/// The directory of `path` (`.` for a bare file name).
fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// A name for a temporary file beside `target`, unique within the process and unlikely across
/// processes.
fn temp_name(dir: &Path, target: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let base = target
        .file_name()
        .map_or_else(|| "out".into(), |n| n.to_string_lossy());
    dir.join(format!(
        ".{base}.{}.{}.{nanos:x}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// What a file that is not a regular file is, for messages (`None` for a regular file).
fn special_kind(t: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    })
}

/// Fails, before anything opens it, when `path` is not a regular file (after symlinks): a FIFO
/// would block the open forever, a device or a directory gives errors that do not say why. The
/// error says what the path is.
pub fn check_regular_file(path: &Path) -> io::Result<()> {
    match special_kind(std::fs::metadata(path)?.file_type()) {
        None => Ok(()),
        Some(what) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {what}, not a regular file"),
        )),
    }
}

/// Fails when the output path `path` exists (after symlinks) and is not a regular file: a
/// device, a FIFO, a socket or a directory is never replaced or written into (see the module
/// documentation). A path that does not exist yet, or that cannot be examined, passes; writing
/// it then reports what is wrong.
pub fn check_output_file(path: &Path) -> io::Result<()> {
    let Ok(md) = std::fs::metadata(path) else {
        return Ok(());
    };
    match special_kind(md.file_type()) {
        None => Ok(()),
        Some(what) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "it is {what}, not a regular file; mmq writes each output as a new file renamed \
                 into place, so it never replaces or writes into a device, FIFO, socket or \
                 directory: name a regular file (to discard an output, write it into a \
                 temporary directory)"
            ),
        )),
    }
}

impl AtomicFile {
    /// Starts writing `target` (mode 0666 less the umask, as any program's ordinary file).
    /// Fails when `target` exists and is not a regular file ([`check_output_file`]).
    pub fn create(target: &Path) -> io::Result<AtomicFile> {
        check_output_file(target)?;
        let dir = dir_of(target);
        let anonymous = if Path::new("/proc/self/fd").is_dir() {
            OpenOptions::new()
                .write(true)
                .read(true)
                .mode(0o666)
                .custom_flags(libc::O_TMPFILE)
                .open(&dir)
                .ok()
        } else {
            None
        };
        if let Some(file) = anonymous {
            return Ok(AtomicFile {
                file,
                target: target.to_owned(),
                dir,
                temp: None,
            });
        }
        loop {
            let temp = temp_name(&dir, target);
            match OpenOptions::new()
                .write(true)
                .read(true)
                .create_new(true)
                .mode(0o666)
                .open(&temp)
            {
                Ok(file) => {
                    return Ok(AtomicFile {
                        file,
                        target: target.to_owned(),
                        dir,
                        temp: Some(temp),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The file being written.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Where it goes.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Names the file `target`, replacing what was there.
    pub fn persist(mut self) -> io::Result<()> {
        let named = match self.temp.take() {
            Some(t) => t,
            None => {
                // linkat of /proc/self/fd/N gives the anonymous file a (temporary) name; a
                // rename then replaces the target atomically.
                let temp = temp_name(&self.dir, &self.target);
                let from = CString::new(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
                    .map_err(io::Error::other)?;
                let to = CString::new(temp.as_os_str().as_bytes()).map_err(io::Error::other)?;
                // SAFETY: both paths are NUL-terminated C strings that live across the call.
                #[allow(unsafe_code, reason = "linkat has no safe binding")]
                let rc = unsafe {
                    libc::linkat(
                        libc::AT_FDCWD,
                        from.as_ptr(),
                        libc::AT_FDCWD,
                        to.as_ptr(),
                        libc::AT_SYMLINK_FOLLOW,
                    )
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                temp
            }
        };
        std::fs::rename(&named, &self.target).inspect_err(|_| {
            let _ = std::fs::remove_file(&named);
        })
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(t) = self.temp.take() {
            let _ = std::fs::remove_file(t);
        }
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Writes `bytes` to `path` through an [`AtomicFile`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(bytes)?;
    f.persist()
}

/// An exclusive advisory lock on a directory, held until dropped.
#[derive(Debug)]
pub struct DirLock {
    _held: File,
}

/// Locks `dir` (the directory of the files about to be published) against other mmq writers.
pub fn lock_dir(dir: &Path) -> io::Result<DirLock> {
    let f = File::open(dir)?;
    f.lock()?;
    Ok(DirLock { _held: f })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mmq-fsio-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .expect("read")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_file_appears_whole_and_an_abandoned_one_leaves_nothing() {
        let d = scratch("whole");
        let target = d.join("model.onnx");
        std::fs::write(&target, b"old").expect("old");
        let mut f = AtomicFile::create(&target).expect("create");
        f.write_all(b"new bytes").expect("write");
        // Until it is persisted the old file is intact and nothing else is named.
        assert_eq!(std::fs::read(&target).expect("read"), b"old");
        if f.temp.is_none() {
            assert_eq!(entries(&d), ["model.onnx"]);
        }
        f.persist().expect("persist");
        assert_eq!(std::fs::read(&target).expect("read"), b"new bytes");
        assert_eq!(entries(&d), ["model.onnx"]);
        let mut g = AtomicFile::create(&d.join("other.onnx")).expect("create");
        g.write_all(b"never").expect("write");
        drop(g);
        assert_eq!(entries(&d), ["model.onnx"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn special_files_are_never_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let d = scratch("special");
        let fifo = d.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let e = write_atomic(&fifo, b"x").expect_err("refused");
        assert!(
            e.to_string()
                .contains("a FIFO (named pipe), not a regular file"),
            "{e}"
        );
        let e = write_atomic(&d, b"x").expect_err("refused");
        assert!(e.to_string().contains("a directory"), "{e}");
        assert!(
            std::fs::metadata(&fifo)
                .expect("stat")
                .file_type()
                .is_fifo()
        );
        assert_eq!(entries(&d), ["fifo"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn anonymous_files_are_used_where_the_file_system_has_them() {
        // The test machines' file systems (ext4, tmpfs, overlayfs) all have O_TMPFILE.
        let d = scratch("anon");
        let f = AtomicFile::create(&d.join("x")).expect("create");
        assert!(f.temp.is_none(), "fell back to a named temporary file");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_directory_lock_is_exclusive() {
        let d = scratch("lock");
        let held = lock_dir(&d).expect("lock");
        let other = File::open(&d).expect("open");
        assert!(matches!(
            other.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        drop(held);
        other.try_lock().expect("free again");
        let _ = std::fs::remove_dir_all(&d);
    }
}
