//! Image import on hostile archives: index.json, manifests, configs, docker's manifest.json
//! and layers, as a directory or a (gzip) tar. An import is all or nothing: when it fails
//! the store holds no blob and no layer afterwards (it was empty), when it succeeds every
//! image it reports resolves with all its layers.
//!
//! Input: one flags byte, then documents separated by `\n--\n`. Document 0 is `index.json`
//! (OCI layout) or `manifest.json` (docker save, flag bit 0); the others are blobs (OCI:
//! stored by their digest) or files `<i>.json` / `<i>.tar` (docker). So that the fuzzer can
//! make consistent archives, `@@N` in a document is replaced by the sha256 hex of document N
//! and `@@sN` by its length (N > the document's own number; later documents are done first).
//! Bit 1: a tar instead of a directory; bit 2: the tar gzip-compressed.
#![no_main]

use std::io::Write;

use ferrolet_fuzz::{check_not_outside, Scratch};
use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::image::ImageStore;
use libfuzzer_sys::fuzz_target;

const SEP: &[u8] = b"\n--\n";

fn split(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut docs = Vec::new();
    while docs.len() < 5 {
        match data.windows(SEP.len()).position(|w| w == SEP) {
            Some(i) if docs.len() < 4 => {
                docs.push(data[..i].to_vec());
                data = &data[i + SEP.len()..];
            }
            _ => {
                docs.push(data.to_vec());
                break;
            }
        }
    }
    docs
}

fn replace(doc: &[u8], pat: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(doc.len());
    let mut i = 0;
    while i < doc.len() {
        if doc[i..].starts_with(pat) {
            out.extend_from_slice(with);
            i += pat.len();
        } else {
            out.push(doc[i]);
            i += 1;
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut docs = split(rest);
    for i in (0..docs.len()).rev() {
        for k in (i + 1..docs.len()).rev() {
            let hex = Digest::of(&docs[k]).hex().to_string();
            let len = docs[k].len().to_string();
            let d = replace(&docs[i], format!("@@s{k}").as_bytes(), len.as_bytes());
            docs[i] = replace(&d, format!("@@{k}").as_bytes(), hex.as_bytes());
        }
    }
    let docker = flags & 1 != 0;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        let name = match (i, docker) {
            (0, false) => "index.json".to_string(),
            (0, true) => "manifest.json".to_string(),
            (_, false) => format!("blobs/sha256/{}", Digest::of(d).hex()),
            (_, true) if d.first() == Some(&b'{') => format!("{i}.json"),
            (_, true) => format!("{i}.tar"),
        };
        files.push((name, d.clone()));
    }
    if !docker {
        files.push(("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()));
    }

    let s = Scratch::new();
    let archive = if flags & 2 == 0 {
        let dir = s.path("archive");
        for (name, d) in &files {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, d).unwrap();
        }
        dir
    } else {
        let mut b = tar::Builder::new(Vec::new());
        for (name, d) in &files {
            let mut h = tar::Header::new_gnu();
            h.set_size(d.len() as u64);
            h.set_mode(0o644);
            h.set_path(name).unwrap();
            h.set_cksum();
            b.append(&h, &d[..]).unwrap();
        }
        let mut tar = b.into_inner().unwrap();
        if flags & 4 != 0 {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&tar).unwrap();
            tar = gz.finish().unwrap();
        }
        let p = s.path("archive.tar");
        std::fs::write(&p, tar).unwrap();
        p
    };

    let mut store = ImageStore::open(s.path("store")).unwrap();
    store.set_layer_limits(ferrolet_runtime::image::layer::LayerLimits {
        max_bytes: 32 << 20,
        max_ratio: 100,
        ratio_floor: 1 << 20,
    });
    let res = store.import(&archive);
    if std::env::var_os("FUZZ_DEBUG").is_some() {
        eprintln!("{:?}", res.as_ref().map_err(|e| ferrolet_fsutil::chain(e).to_string()));
    }
    match res {
        Ok(images) => {
            for img in &images {
                let resolved = store.resolve(&img.id.to_string()).expect("an imported image resolves");
                assert!(resolved.layer_dirs.iter().all(|d| d.is_dir()));
                for r in &img.refs {
                    store.find(r).expect("an imported reference is found");
                }
            }
        }
        Err(e) => {
            check_not_outside(&e);
            let left = |sub: &str| {
                std::fs::read_dir(s.path("store").join(sub))
                    .unwrap()
                    .flatten()
                    .map(|e| e.file_name())
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                left("blobs/sha256"),
                Vec::<std::ffi::OsString>::new(),
                "blobs of a failed import"
            );
            assert_eq!(
                left("layers"),
                Vec::<std::ffi::OsString>::new(),
                "layers of a failed import"
            );
            assert_eq!(left("blobs/.tmp"), Vec::<std::ffi::OsString>::new(), "temp blobs");
        }
    }
    s.check_nothing_outside(&["archive", "archive.tar", "store"]);
});
