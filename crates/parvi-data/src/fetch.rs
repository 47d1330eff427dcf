//! Downloading a data set's files into the data directory.
//!
//! Each file is streamed into a temporary file beside its destination while its sha256 is
//! computed; only a file with the registry's checksum is renamed into place (an atomic rename
//! on one file system). Anything else (an HTTP error, a dropped connection, a truncated or
//! altered body) deletes the temporary file, so the data directory never holds a half-written
//! or corrupt download.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use ureq::Agent;

use crate::error::DataError;
use crate::registry::{Entry, FileEntry};
use crate::verify::{hex, sha256_file};

/// What [`fetch`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchReport {
    /// Canonical name of the data set fetched.
    pub dataset: String,
    /// Files downloaded and verified.
    pub downloaded: Vec<String>,
    /// Files already present with the right checksum, left alone.
    pub already_verified: Vec<String>,
    /// Bytes downloaded.
    pub bytes: u64,
}

/// Downloads every file of `entry` that is not already present and verified into
/// `data_dir/<entry.name>/`.
///
/// `base_url_override` replaces the registry's URLs with `{base}/{entry.name}/{file}` (a mirror
/// laid out like the data directory, e.g. a local test server).
pub fn fetch(entry: &Entry, data_dir: &Path, base_url_override: Option<&str>) -> Result<FetchReport, DataError> {
    let folder = entry.folder(data_dir);
    let mut report = FetchReport { dataset: entry.name.clone(), ..FetchReport::default() };
    let mut wanted = Vec::new();
    for file in &entry.files {
        let path = folder.join(&file.name);
        match sha256_file(&path) {
            Ok(actual) if actual == file.sha256 => report.already_verified.push(file.name.clone()),
            // Missing or stale: download (a stale file is only replaced by a verified one).
            Ok(_) | Err(DataError::MissingFile { .. }) => wanted.push(file),
            Err(e) => return Err(e),
        }
    }
    if let Some(file) = wanted.iter().find(|f| !f.fetch) {
        return Err(DataError::NotFetchable {
            path: folder.join(&file.name),
            url: file.url.clone(),
            note: file.note.clone(),
        });
    }
    if wanted.is_empty() {
        return Ok(report);
    }
    // Only now: a set that cannot be fetched leaves no empty folder behind.
    let created = !folder.is_dir();
    std::fs::create_dir_all(&folder).map_err(|e| DataError::Io { path: folder.clone(), error: e })?;

    let urls: Vec<String> = wanted
        .iter()
        .map(|file| match base_url_override {
            Some(base) => format!("{}/{}/{}", base.trim_end_matches('/'), entry.name, file.name),
            None => file.url.clone(),
        })
        .collect();
    let agent = agent(&urls[0]);
    let bar = progress_bar(wanted.iter().map(|f| f.bytes).sum());
    for (file, url) in wanted.iter().zip(&urls) {
        bar.set_message(format!("{}/{}", entry.name, file.name));
        let bytes = download(&agent, url, &folder, file, &bar).inspect_err(|_| {
            bar.abandon();
            // A first download that fails at once leaves no empty folder (which would read
            // as "fetched, files missing"); `remove_dir` keeps a folder that has files.
            if created && report.downloaded.is_empty() {
                let _ = std::fs::remove_dir(&folder);
            }
        })?;
        report.bytes += bytes;
        report.downloaded.push(file.name.clone());
    }
    bar.finish_and_clear();
    Ok(report)
}

/// An HTTP agent with finite timeouts. A loopback URL (a local mirror or test server) bypasses
/// any proxy configured in the environment, which could not reach it.
fn agent(example_url: &str) -> Agent {
    let host = example_url
        .split_once("://")
        .map_or(example_url, |(_, rest)| rest)
        .split(['/', ':'])
        .next()
        .unwrap_or_default();
    let loopback = matches!(host, "127.0.0.1" | "localhost" | "[::1]");
    let mut config = Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(Duration::from_secs(60)));
    if loopback {
        config = config.proxy(None);
    }
    config.build().into()
}

fn progress_bar(total: u64) -> ProgressBar {
    // Hidden automatically when stderr is not a terminal (tests, logs).
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template("{msg:40} [{bar:30}] {bytes}/{total_bytes} {eta}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Downloads `url` to `folder/file.name` via a verified temporary file; returns the bytes.
fn download(agent: &Agent, url: &str, folder: &Path, file: &FileEntry, bar: &ProgressBar) -> Result<u64, DataError> {
    let dest = folder.join(&file.name);
    let failed = |received: u64, message: String| DataError::Download {
        path: dest.clone(),
        url: url.to_string(),
        received,
        message,
    };
    // The leading dot and `.part` suffix keep it out of the way; dropping it deletes it.
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", file.name))
        .suffix(".part")
        .tempfile_in(folder)
        .map_err(|e| DataError::io(folder, e))?;

    let response = agent.get(url).call().map_err(|e| failed(0, e.to_string()))?;
    let mut body = response.into_body().into_reader();
    let mut hasher = Sha256::new();
    let mut received: u64 = 0;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(failed(received, e.to_string())),
        };
        received += n as u64;
        // The registry knows the size: a longer body is wrong, and need not fill the disk.
        if received > file.bytes {
            return Err(failed(received, format!("more than the {} bytes the registry records", file.bytes)));
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n]).map_err(|e| DataError::io(tmp.path(), e))?;
        bar.inc(n as u64);
    }
    let actual = hex(&hasher.finalize());
    if actual != file.sha256 {
        return Err(DataError::ChecksumMismatch {
            path: dest,
            expected: file.sha256.clone(),
            actual,
            detail: format!(" in download from {url} ({received} of {} bytes)", file.bytes),
        });
    }
    tmp.as_file().sync_all().map_err(|e| DataError::io(tmp.path(), e))?;
    // tempfile creates files readable by the owner only; data files are ordinary files.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644))
            .map_err(|e| DataError::io(tmp.path(), e))?;
    }
    tmp.persist(&dest).map_err(|e| DataError::io(&dest, e.error))?;
    Ok(received)
}
