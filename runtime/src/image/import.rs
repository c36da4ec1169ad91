//! Reading image archives: OCI image layouts and `docker save` output, each as a directory or a
//! tar (plain, gzip or zstd). The archive is read once, front to back: blobs stream straight
//! into the store while their digest is checked, the small JSON documents stay in memory, and
//! the images are worked out from them afterwards.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Component, Path};
use std::rc::Rc;

use oci_spec::image::{ImageIndex, ImageManifest, MediaType};
use serde::Deserialize;

use super::layer::Limited;
use super::reference::Reference;
use super::ImageStore;
use crate::digest::{Digest, HashingWriter};
use crate::error::{p, Context, Error, Result};

/// JSON documents (index.json, manifests, configs) larger than this are not metadata: they
/// are refused rather than read into memory.
pub(super) const MAX_META: u64 = 4 << 20;

/// Indexes nested deeper than this are refused (real images have one or two levels; each
/// level is a stack frame).
const MAX_NESTING: usize = 8;

/// One image found in an archive; its blobs are in the store.
#[derive(Debug)]
pub(super) struct FoundImage {
    pub config: Digest,
    pub manifest: Digest,
    pub layers: Vec<Digest>,
    /// Sizes of the layer blobs where known before they are read (0: take the file's).
    pub layer_sizes: Vec<u64>,
    pub refs: Vec<String>,
}

struct Ingest<'a> {
    store: &'a ImageStore,
    /// Blobs this import put into the store that were not there before.
    added: &'a mut Vec<Digest>,
    origin: String,
    /// Small metadata files by archive path.
    meta: HashMap<String, Vec<u8>>,
    /// Every stored file by archive path.
    blobs: HashMap<String, Digest>,
}

/// Read the archive at `path`, storing its blobs; `added` gets the digests of the blobs that
/// were not in the store before (also when this fails).
pub(super) fn read_archive(store: &ImageStore, path: &Path, added: &mut Vec<Digest>) -> Result<Vec<FoundImage>> {
    let mut ing = Ingest {
        store,
        added,
        origin: format!("in {}", p(path)),
        meta: HashMap::new(),
        blobs: HashMap::new(),
    };
    let md = fs::metadata(path).with_context(|| format!("reading {}", p(path)))?;
    if md.is_dir() {
        walk_dir(&mut ing, path, Path::new(""))?;
    } else {
        // A compressed archive is a bomb like a compressed layer: cap what it expands to,
        // before it is written to the blob store.
        let cap = store.layer_limits().for_archive(md.len());
        let exceeded = Rc::new(Cell::new(false));
        let f = fs::File::open(path).with_context(|| format!("opening {}", p(path)))?;
        let r = super::layer::decompressed(f).with_context(|| format!("reading {}", p(path)))?;
        let r = Limited {
            inner: r,
            left: cap,
            exceeded: exceeded.clone(),
        };
        let mut ar = tar::Archive::new(r);
        let res = (|| -> Result<()> {
            let entries = ar
                .entries()
                .with_context(|| format!("reading {} as a tar archive", p(path)))?;
            for e in entries {
                let mut e = e.with_context(|| format!("reading {} as a tar archive", p(path)))?;
                if !e.header().entry_type().is_file() {
                    continue;
                }
                let name = e.path().with_context(|| format!("reading {}", p(path)))?.into_owned();
                let size = e.size();
                ing.file(&name, size, &mut e)?;
            }
            Ok(())
        })();
        if res.is_err() && exceeded.get() {
            return Err(Error::invalid_image(
                &ing.origin,
                format!("the archive is larger than {cap} bytes uncompressed (the limit for its size)"),
            ));
        }
        res?;
    }
    ing.images()
}

fn walk_dir(ing: &mut Ingest, root: &Path, rel: &Path) -> Result<()> {
    let dir = root.join(rel);
    for e in fs::read_dir(&dir).with_context(|| format!("listing {}", p(&dir)))? {
        let e = e.with_context(|| format!("listing {}", p(&dir)))?;
        let rel = rel.join(e.file_name());
        let ft = e.file_type().with_context(|| format!("reading {}", p(&e.path())))?;
        if ft.is_dir() {
            walk_dir(ing, root, &rel)?;
        } else if ft.is_file() {
            let mut f = fs::File::open(e.path()).with_context(|| format!("opening {}", p(&e.path())))?;
            let size = f.metadata().map(|m| m.len()).unwrap_or(0);
            ing.file(&rel, size, &mut f)?;
        }
    }
    Ok(())
}

fn normalize(path: &Path) -> String {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

impl Ingest<'_> {
    fn file(&mut self, path: &Path, size: u64, r: &mut dyn Read) -> Result<()> {
        let name = normalize(path);
        let base = name.rsplit('/').next().unwrap_or("");
        let is_meta = matches!(base, "index.json" | "oci-layout" | "manifest.json" | "repositories")
            && !name.starts_with("blobs/");
        if is_meta {
            if size > MAX_META {
                return Err(Error::invalid_image(&self.origin, format!("{name} is too large")));
            }
            let mut buf = Vec::new();
            r.read_to_end(&mut buf)
                .with_context(|| format!("reading {name} {}", self.origin))?;
            self.meta.insert(name, buf);
            return Ok(());
        }
        let expected = match name.strip_prefix("blobs/sha256/") {
            Some(hex) => Some(
                Digest::from_hex(hex)
                    .map_err(|e| Error::invalid_image(&self.origin, format!("blob name {name}: {e}")))?,
            ),
            None => None,
        };
        // Docker's legacy per-layer `json` and `VERSION` files carry nothing we use.
        if expected.is_none() && !(base.ends_with(".json") || base.ends_with(".tar")) {
            return Ok(());
        }
        let digest = self.store_blob(r, expected.as_ref(), &name)?;
        if base.ends_with(".json") && size <= MAX_META {
            let data = fs::read(self.store.blob_path(&digest)).context("reading stored blob")?;
            self.meta.insert(name.clone(), data);
        }
        self.blobs.insert(name, digest);
        Ok(())
    }

    /// Stream `r` into the blob store, checking it hashes to `expected` when the archive names
    /// the blob by digest.
    fn store_blob(&mut self, r: &mut dyn Read, expected: Option<&Digest>, name: &str) -> Result<Digest> {
        let tmp = self
            .store
            .dir()
            .join("blobs/.tmp")
            .join(format!("{}", ferrolet_fsutil::unique()));
        let res = (|| {
            let f = fs::File::create(&tmp).with_context(|| format!("creating {}", p(&tmp)))?;
            let mut w = HashingWriter::new(io::BufWriter::with_capacity(256 * 1024, f));
            io::copy(r, &mut w).with_context(|| format!("reading {name} {}", self.origin))?;
            w.flush().with_context(|| format!("writing {}", p(&tmp)))?;
            let (bw, digest, _) = w.finish();
            let f = bw.into_inner().map_err(|e| e.into_error()).context("flushing blob")?;
            f.sync_all().context("syncing blob")?;
            if let Some(exp) = expected {
                if exp != &digest {
                    return Err(Error::DigestMismatch {
                        blob: exp.to_string(),
                        origin: format!(" ({name} {})", self.origin),
                        actual: digest.to_string(),
                    });
                }
            }
            let dest = self.store.blob_path(&digest);
            let existed = dest.exists();
            fs::rename(&tmp, &dest).with_context(|| format!("storing blob {}", p(&dest)))?;
            if !existed && !self.added.contains(&digest) {
                self.added.push(digest.clone());
            }
            Ok(digest)
        })();
        if res.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        res
    }

    /// A JSON blob (index, manifest, config), at most [`MAX_META`] bytes.
    fn blob_bytes(&self, d: &Digest) -> Result<Vec<u8>> {
        let path = self.store.blob_path(d);
        let Ok(md) = fs::metadata(&path) else {
            return Err(Error::invalid_image(
                &self.origin,
                format!("blob {d} is referenced but not in the archive"),
            ));
        };
        if md.len() > MAX_META {
            return Err(Error::invalid_image(
                &self.origin,
                format!(
                    "blob {d} is too large for an index, manifest or config ({} bytes)",
                    md.len()
                ),
            ));
        }
        Ok(fs::read(&path).with_context(|| format!("reading {}", p(&path)))?)
    }

    fn images(&self) -> Result<Vec<FoundImage>> {
        let has = |n: &str| self.meta.contains_key(n);
        if has("index.json") && (has("oci-layout") || !has("manifest.json")) {
            self.oci_images()
        } else if has("manifest.json") {
            self.docker_images()
        } else {
            Err(Error::invalid_image(
                &self.origin,
                "neither an OCI image layout (index.json) nor a docker save archive (manifest.json)",
            ))
        }
    }

    fn oci_images(&self) -> Result<Vec<FoundImage>> {
        let index: ImageIndex = serde_json::from_slice(&self.meta["index.json"])
            .with_context(|| format!("decoding index.json {}", self.origin))?;
        let mut out = Vec::new();
        for desc in index.manifests() {
            let ann = desc.annotations().clone().unwrap_or_default();
            // containerd and docker write the full name here; the OCI annotation may hold a
            // full reference or just a tag, and a bare tag names no repository.
            let name = match ann.get("io.containerd.image.name") {
                Some(full) => Some(full.clone()),
                None => ann
                    .get("org.opencontainers.image.ref.name")
                    .filter(|n| n.contains('/') || n.contains(':') || n.contains('@'))
                    .cloned(),
            };
            let refs = match name {
                Some(n) => vec![Reference::parse(&n)?.normalized()],
                None => Vec::new(),
            };
            let digest = Digest::parse(desc.digest().as_ref()).map_err(|e| Error::invalid_image(&self.origin, e))?;
            if let Some(img) = self.resolve_manifest(desc.media_type(), &digest, refs, 0)? {
                out.push(img);
            }
        }
        if out.is_empty() {
            return Err(Error::invalid_image(
                &self.origin,
                format!("no image for {} in index.json", platform()),
            ));
        }
        Ok(out)
    }

    /// Follow a manifest or a (nested) index down to one image for this platform.
    fn resolve_manifest(
        &self,
        media_type: &MediaType,
        digest: &Digest,
        refs: Vec<String>,
        depth: usize,
    ) -> Result<Option<FoundImage>> {
        if depth > MAX_NESTING {
            return Err(Error::invalid_image(
                &self.origin,
                format!("indexes are nested more than {MAX_NESTING} deep at {digest}"),
            ));
        }
        let data = self.blob_bytes(digest)?;
        let is_index = matches!(media_type, MediaType::ImageIndex) || media_type.to_string().contains("manifest.list");
        if is_index {
            let idx: ImageIndex =
                serde_json::from_slice(&data).with_context(|| format!("decoding index {digest} {}", self.origin))?;
            for m in idx.manifests() {
                let fits = m
                    .platform()
                    .as_ref()
                    .is_none_or(|pl| pl.os().to_string() == "linux" && pl.architecture().to_string() == arch());
                if fits {
                    let d = Digest::parse(m.digest().as_ref()).map_err(|e| Error::invalid_image(&self.origin, e))?;
                    return self.resolve_manifest(m.media_type(), &d, refs, depth + 1);
                }
            }
            return Ok(None);
        }
        let m: ImageManifest =
            serde_json::from_slice(&data).with_context(|| format!("decoding manifest {digest} {}", self.origin))?;
        let config = Digest::parse(m.config().digest().as_ref()).map_err(|e| Error::invalid_image(&self.origin, e))?;
        self.blob_bytes(&config)?;
        let mut layers = Vec::new();
        for l in m.layers() {
            let d = Digest::parse(l.digest().as_ref()).map_err(|e| Error::invalid_image(&self.origin, e))?;
            let path = self.store.blob_path(&d);
            let size = fs::metadata(&path).map(|m| m.len()).map_err(|_| {
                Error::invalid_image(&self.origin, format!("layer {d} is referenced but not in the archive"))
            })?;
            if size != l.size() {
                return Err(Error::invalid_image(
                    &self.origin,
                    format!("layer {d} has {size} bytes, the manifest says {}", l.size()),
                ));
            }
            layers.push(d);
        }
        Ok(Some(FoundImage {
            config,
            manifest: digest.clone(),
            layer_sizes: vec![0; layers.len()],
            layers,
            refs,
        }))
    }

    fn docker_images(&self) -> Result<Vec<FoundImage>> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry {
            config: String,
            #[serde(default)]
            repo_tags: Option<Vec<String>>,
            layers: Vec<String>,
        }
        let entries: Vec<Entry> = serde_json::from_slice(&self.meta["manifest.json"])
            .with_context(|| format!("decoding manifest.json {}", self.origin))?;
        let mut out = Vec::new();
        for e in entries {
            let config = self.blobs.get(&e.config).cloned().ok_or_else(|| {
                Error::invalid_image(&self.origin, format!("config {} is not in the archive", e.config))
            })?;
            // docker names the config file by its digest: hold it to that.
            let stem = e.config.rsplit('/').next().unwrap_or("").trim_end_matches(".json");
            if stem.len() == 64 && stem != config.hex() {
                return Err(Error::DigestMismatch {
                    blob: format!("sha256:{stem}"),
                    origin: format!(" ({} {})", e.config, self.origin),
                    actual: config.to_string(),
                });
            }
            let mut layers = Vec::new();
            for l in &e.layers {
                layers.push(
                    self.blobs.get(l).cloned().ok_or_else(|| {
                        Error::invalid_image(&self.origin, format!("layer {l} is not in the archive"))
                    })?,
                );
            }
            let mut refs = Vec::new();
            for t in e.repo_tags.unwrap_or_default() {
                refs.push(Reference::parse(&t)?.normalized());
            }
            // docker save has no manifest blob: synthesize the id of one from what it lists.
            let manifest = Digest::of(
                serde_json::json!({"config": config.to_string(),
                    "layers": layers.iter().map(|d| d.to_string()).collect::<Vec<_>>()})
                .to_string()
                .as_bytes(),
            );
            out.push(FoundImage {
                config,
                manifest,
                layer_sizes: vec![0; layers.len()],
                layers,
                refs,
            });
        }
        Ok(out)
    }
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        other => other,
    }
}

fn platform() -> String {
    format!("linux/{}", arch())
}
