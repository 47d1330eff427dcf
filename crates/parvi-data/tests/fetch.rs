//! `fetch` end to end against a tiny HTTP server on 127.0.0.1 serving the real files, with
//! good, corrupted and truncated responses.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::real_data_dir;
use parvi_data::{DataError, Registry, fetch, load, verify};

/// How the server answers.
#[derive(Clone, Copy)]
enum Mode {
    Faithful,
    /// Flips a byte in the middle of every body.
    Corrupt,
    /// Announces the full length, sends half the body, closes.
    TruncateWithLength,
    /// Sends half the body without a length, closes (the client cannot tell from HTTP).
    TruncateWithoutLength,
}

/// A bounded server: it answers at most `max_requests` requests, stops when told to, and
/// gives up after 30 seconds whatever happens, so a test can never hang on it.
struct Server {
    base_url: String,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<String>>,
}

impl Server {
    fn start(root: &Path, max_requests: usize, mode: Mode) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let root = root.to_path_buf();
        let stop_flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut served = Vec::new();
            while served.len() < max_requests && !stop_flag.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => served.push(answer(stream, &root, mode)),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
            served
        });
        Server { base_url, stop, thread }
    }

    /// Stops the server; returns the paths it was asked for.
    fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

/// Answers one GET request for `/<folder>/<file>` from `root`.
fn answer(stream: TcpStream, root: &Path, mode: Mode) -> String {
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).unwrap();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap() == 0 || header == "\r\n" {
            break;
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut stream = reader.into_inner();
    let file = root.join(path.trim_start_matches('/'));
    let body = match std::fs::read(&file) {
        Ok(body) if !path.contains("..") => body,
        _ => {
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            return path;
        }
    };
    let head = |length: Option<usize>| {
        let length = length.map_or(String::new(), |n| format!("Content-Length: {n}\r\n"));
        format!("HTTP/1.1 200 OK\r\n{length}Connection: close\r\n\r\n")
    };
    let half = body.len() / 2;
    let _ = match mode {
        Mode::Faithful => stream.write_all(head(Some(body.len())).as_bytes()).and_then(|_| stream.write_all(&body)),
        Mode::Corrupt => {
            let mut body = body;
            body[half] ^= 0x01;
            stream.write_all(head(Some(body.len())).as_bytes()).and_then(|_| stream.write_all(&body))
        }
        Mode::TruncateWithLength => {
            stream.write_all(head(Some(body.len())).as_bytes()).and_then(|_| stream.write_all(&body[..half]))
        }
        Mode::TruncateWithoutLength => {
            stream.write_all(head(None).as_bytes()).and_then(|_| stream.write_all(&body[..half]))
        }
    };
    let _ = stream.flush();
    path
}

/// File names in `folder`, sorted: shows any stray temporary file.
fn listing(folder: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(folder).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

/// A temporary data directory holding yacht's files except `missing`, copied from `real`.
fn yacht_without(real: &Path, missing: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("yacht");
    std::fs::create_dir(&folder).unwrap();
    for name in listing(&real.join("yacht")) {
        if name != missing {
            std::fs::copy(real.join("yacht").join(&name), folder.join(&name)).unwrap();
        }
    }
    (tmp, folder)
}

#[test]
fn fetch_downloads_verifies_and_then_skips_verified_files() {
    let Some(real) = real_data_dir("fetch_downloads_verifies_and_then_skips_verified_files") else {
        return;
    };
    let entry = Registry::builtin().resolve("yacht").unwrap().clone();
    let tmp = tempfile::tempdir().unwrap();

    let server = Server::start(&real, entry.files.len(), Mode::Faithful);
    let report = fetch(&entry, tmp.path(), Some(&server.base_url)).unwrap();
    let served = server.finish();
    assert_eq!(served.len(), entry.files.len());
    assert_eq!(report.downloaded.len(), entry.files.len());
    assert!(report.already_verified.is_empty());
    assert_eq!(report.bytes, entry.total_bytes());
    assert!(verify(&entry, tmp.path()).unwrap().is_ok());
    assert_eq!(listing(&tmp.path().join("yacht")), listing(&real.join("yacht")));
    assert_eq!(load("yacht", tmp.path()).unwrap().rows, 308);

    // Everything is verified now: nothing is requested.
    let server = Server::start(&real, 1, Mode::Faithful);
    let report = fetch(&entry, tmp.path(), Some(&server.base_url)).unwrap();
    assert!(server.finish().is_empty());
    assert!(report.downloaded.is_empty());
    assert_eq!(report.already_verified.len(), entry.files.len());
}

#[test]
fn fetch_replaces_a_stale_file_and_only_it() {
    let Some(real) = real_data_dir("fetch_replaces_a_stale_file_and_only_it") else {
        return;
    };
    let entry = Registry::builtin().resolve("yacht").unwrap().clone();
    let (tmp, folder) = yacht_without(&real, "index_test_7.txt");
    std::fs::write(folder.join("data.txt"), "1 2 3\n").unwrap();

    let server = Server::start(&real, 2, Mode::Faithful);
    let report = fetch(&entry, tmp.path(), Some(&server.base_url)).unwrap();
    let mut served = server.finish();
    served.sort();
    assert_eq!(served, ["/yacht/data.txt", "/yacht/index_test_7.txt"]);
    assert_eq!(report.downloaded, ["data.txt", "index_test_7.txt"]);
    assert!(verify(&entry, tmp.path()).unwrap().is_ok());
}

/// Fetches yacht's `data.txt` from a misbehaving server and checks the error and that nothing
/// new is left in the folder.
fn rejected_download(mode: Mode) -> String {
    let real = real_data_dir("rejected_download").unwrap();
    let entry = Registry::builtin().resolve("yacht").unwrap().clone();
    let (tmp, folder) = yacht_without(&real, "data.txt");
    let before = listing(&folder);

    let server = Server::start(&real, 1, mode);
    let err = fetch(&entry, tmp.path(), Some(&server.base_url)).unwrap_err();
    assert_eq!(server.finish(), ["/yacht/data.txt"]);
    assert_eq!(listing(&folder), before, "nothing half-written is kept");
    assert!(!folder.join("data.txt").exists());
    let message = err.to_string();
    assert!(message.contains(&folder.join("data.txt").display().to_string()), "{message}");
    message
}

#[test]
fn a_corrupted_download_is_rejected_with_both_checksums() {
    if real_data_dir("a_corrupted_download_is_rejected_with_both_checksums").is_none() {
        return;
    }
    let message = rejected_download(Mode::Corrupt);
    let expected = Registry::builtin().resolve("yacht").unwrap().files[0].sha256.clone();
    assert!(message.contains("sha256 mismatch"), "{message}");
    assert!(message.contains(expected.as_str()), "{message}");
    let found = message.split("found ").nth(1).unwrap();
    assert_eq!(found.len(), 64, "{message}");
}

#[test]
fn a_truncated_download_is_rejected() {
    if real_data_dir("a_truncated_download_is_rejected").is_none() {
        return;
    }
    let message = rejected_download(Mode::TruncateWithLength);
    assert!(message.contains("download from http://127.0.0.1"), "{message}");
    let message = rejected_download(Mode::TruncateWithoutLength);
    assert!(message.contains("sha256 mismatch"), "{message}");
    assert!(message.contains("bytes)"), "{message}");
}

#[test]
fn a_missing_remote_file_is_an_http_error_naming_it() {
    let Some(real) = real_data_dir("a_missing_remote_file_is_an_http_error_naming_it") else {
        return;
    };
    let entry = Registry::builtin().resolve("yacht").unwrap().clone();
    let (tmp, folder) = yacht_without(&real, "n_splits.txt");
    let empty = tempfile::tempdir().unwrap();
    let server = Server::start(empty.path(), 1, Mode::Faithful);
    let err = fetch(&entry, tmp.path(), Some(&server.base_url)).unwrap_err();
    server.finish();
    let message = err.to_string();
    assert!(matches!(err, DataError::Download { .. }), "{message}");
    assert!(message.contains("n_splits.txt") && message.contains("404"), "{message}");
    assert!(!folder.join("n_splits.txt").exists());

    // A first fetch that fails at once leaves no empty folder behind.
    let fresh = tempfile::tempdir().unwrap();
    let server = Server::start(empty.path(), 1, Mode::Faithful);
    fetch(&entry, fresh.path(), Some(&server.base_url)).unwrap_err();
    server.finish();
    assert!(!fresh.path().join("yacht").exists());
}

#[test]
fn breast_cancer_is_not_fetchable_and_says_why() {
    let entry = Registry::builtin().resolve("breast-cancer").unwrap().clone();
    let tmp = tempfile::tempdir().unwrap();
    let err = fetch(&entry, tmp.path(), None).unwrap_err().to_string();
    assert!(err.contains("data.csv") && err.contains("wdbc.data"), "{err}");
    assert!(!tmp.path().join("breast-cancer").exists());
}
